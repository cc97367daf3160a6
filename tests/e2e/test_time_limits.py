"""A sync handler past its time limit under ``nsqworker run``: its message is retried at
the limit, and the worker process asks to be replaced; the supervisor drains it and
starts another. Counted: every message handled, none lost."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import NsqdProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

BOOT = 30.0
Start = Callable[..., Any]
Write = Callable[[str, str], str]

# The first delivery of "stuck" sleeps past the 0.5 s limit; every other returns at once.
TASKS = """
import os
import time

from nsqworker import task


@task("limits", channel="c", timeout=0.5, max_in_flight=4)
def handle(msg):
    if msg.body == b"stuck" and msg.attempts == 1:
        time.sleep(2.0)
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, b"%s %d %d\\n" % (msg.body, msg.attempts, os.getpid()))
    finally:
        os.close(fd)
"""


def test_a_sync_handler_past_its_limit_gets_its_process_replaced(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    module = write_module("limit_tasks", TASKS)
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "NSQWORKER_REQUEUE_DELAY": "0.1"}
    run = supervise(module, env=env)
    run.wait_ready()
    (first_pid,) = run.pids()
    bodies = [f"m{i}" for i in range(20)]
    nsqd.mpublish("limits", ["stuck", *bodies])
    done = tmp_path / "handled.txt"

    def lines() -> list[tuple[str, int, int]]:
        if not done.exists():
            return []
        return [
            (b, int(a), int(p))
            for b, a, p in (line.split() for line in done.read_text().splitlines())
        ]

    wait_for(
        lambda: {b for b, _, _ in lines()} >= {"stuck", *bodies},
        BOOT,
        message=lambda: f"not all handled: {lines()}\n{run.output()}",
    )
    wait_for(
        lambda: run.readyz()[0] == 200 and run.pids() and first_pid not in run.pids(),
        BOOT,
        message=lambda: f"not replaced: {run.readyz()}\n{run.output()}",
    )
    output = run.output()
    assert "a sync handler ran past its time limit" in output
    assert "asks to be replaced" in output and "replaced (asked)" in output
    counts = Counter(b for b, _, _ in lines())
    assert all(counts[b] == 1 for b in bodies), counts  # nothing lost, nothing twice
    assert counts["stuck"] == 2  # the stuck thread finished its first run; the retry ran too
    run.signal(signal.SIGTERM)
    assert run.wait(30) == 0
