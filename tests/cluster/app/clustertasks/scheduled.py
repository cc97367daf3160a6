"""A schedule every second, each tick echoed to nsqd's topic ``handled`` (as tasks.py).

The tests count the ticks' ``scheduled_for`` there: each second once, whichever pod led.
"""

from __future__ import annotations

import os
import urllib.request

from nsqworker import Message, task

NSQD = os.environ.get("HANDLED_NSQD_HTTP", "127.0.0.1:4151")


@task("ticks", channel="cluster", schedule="* * * * * *")
def tick(msg: Message) -> None:
    """Echo the tick's body ({"task": ..., "scheduled_for": ...}) to ``handled``."""
    request = urllib.request.Request(
        f"http://{NSQD}/pub?topic=handled", data=msg.body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        response.read()
