"""One task: each message on ``orders`` is echoed to nsqd's topic ``handled``, then FINed.

What the handlers saw is thus kept by the broker (a pod's own counters die with it): the
test reads ``handled`` back and counts each body. ``HANDLED_NSQD_HTTP`` is the nsqd's
HTTP address (host:port), ``HANDLE_SECONDS`` how long a handler takes before it echoes.
"""

from __future__ import annotations

import os
import time
import urllib.request

from nsqworker import Message, task

NSQD = os.environ.get("HANDLED_NSQD_HTTP", "127.0.0.1:4151")
SECONDS = float(os.environ.get("HANDLE_SECONDS", "0"))


@task("orders", channel="cluster", max_in_flight=20)
def handle(msg: Message) -> None:
    """Wait ``HANDLE_SECONDS``, echo the body to ``handled``; returning FINs it."""
    if SECONDS:
        time.sleep(SECONDS)
    request = urllib.request.Request(
        f"http://{NSQD}/pub?topic=handled", data=msg.body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        response.read()
