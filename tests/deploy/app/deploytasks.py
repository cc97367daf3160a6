"""The task module the chart's pod spec runs in test_chart_install (its image's /app).

Each message body is appended, one line each, to the file named by DEPLOY_TEST_OUT,
which the test sets through the chart's extraEnv.
"""

from __future__ import annotations

import os

from nsqworker import Message, task

TOPIC = "deploy_test"


@task(TOPIC, channel="chart")
def record(msg: Message) -> None:
    """Append the body to $DEPLOY_TEST_OUT."""
    with open(os.environ["DEPLOY_TEST_OUT"], "ab") as out:
        out.write(msg.body + b"\n")
