"""``nsqworker run`` under faults: a worker process SIGKILLed, one over
max_memory_per_child, one whose event loop is blocked. Real supervisor, real nsqd."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import NsqdProcess, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.slow]

TOPIC, CHANNEL = "faults", "c"
BOOT = 30.0  # keep in step with tests/e2e/conftest.py
Start = Callable[..., Any]
Write = Callable[[str, str], str]

# Appends each handled body with O_APPEND (one write per line, safe across processes).
TASKS = """
import asyncio
import os
import time

from nsqworker.task import task

HOARD = []


@task("faults", channel="c", max_in_flight=10, name="work")
async def work(msg):
    body = msg.body.decode()
    if body == "grow" and msg.attempts == 1:
        HOARD.append(b"x" * (300 * 2**20))  # resident, not just reserved
    if body == "block" and msg.attempts == 1:
        time.sleep(4)  # blocks the loop: what the watchdog is for
    await asyncio.sleep(float(os.environ.get("HANDLER_SLEEP", "0.05")))
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, msg.body + b"\\n")
    finally:
        os.close(fd)
"""


def handled(tmp_path: Path) -> set[str]:
    path = tmp_path / "handled.txt"
    return set(path.read_text().split()) if path.exists() else set()


def env_for(nsqd: NsqdProcess, **extra: str) -> dict[str, str]:
    # msg_timeout 2 s: what a killed worker had in flight comes back within seconds.
    return {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "NSQWORKER_MSG_TIMEOUT": "2"} | extra


def test_a_sigkilled_worker_is_replaced_and_loses_no_message(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    run = supervise(write_module("fault_tasks", TASKS), "--workers", "2", env=env_for(nsqd))
    run.wait_ready()
    bodies = [f"m{i}" for i in range(200)]
    nsqd.mpublish(TOPIC, bodies)
    wait_for(lambda: len(handled(tmp_path)) >= 20, 10, message="no progress")
    victim = run.pids()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: run.readyz()[0] != 200 or victim not in run.pids(), 5)
    wait_for(
        lambda: run.readyz()[0] == 200 and victim not in run.pids() and len(run.pids()) == 2,
        BOOT,
        message=lambda: f"/readyz did not recover: {run.readyz()}\n{run.output()}",
    )
    wait_for(
        lambda: handled(tmp_path) >= set(bodies),
        20,
        message=lambda: f"lost: {sorted(set(bodies) - handled(tmp_path))[:10]}",
    )
    assert "died (killed by SIGKILL)" in run.output()
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0


def test_a_worker_over_max_memory_is_replaced_after_its_in_flight_work(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    env = env_for(nsqd, NSQWORKER_MAX_MEMORY_PER_CHILD="250", HANDLER_SLEEP="0.5")
    run = supervise(write_module("fault_tasks", TASKS), "--workers", "1", env=env)
    run.wait_ready()
    first = run.pids()
    nsqd.mpublish(TOPIC, ["grow", *(f"m{i}" for i in range(9))])  # all in flight at once
    wait_for(
        lambda: run.readyz()[0] == 200 and run.pids() and run.pids() != first,
        BOOT,
        message=lambda: f"not replaced: {run.readyz()}\n{run.output()}",
    )
    output = run.output()
    assert "worker 1 over max_memory_per_child: " in output
    assert "replaced (memory limit)" in output
    assert "died" not in output  # a planned replacement, not a crash
    # The ten were running when the limit was hit: they finished before the exit.
    assert handled(tmp_path) >= {"grow", *(f"m{i}" for i in range(9))}
    nsqd.publish(TOPIC, b"after")
    wait_for(lambda: "after" in handled(tmp_path), 10, message="the new worker consumes nothing")
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0


def test_livez_fails_while_a_worker_loop_is_blocked(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    env = env_for(nsqd, NSQWORKER_WATCHDOG_TIMEOUT="1")
    run = supervise(write_module("fault_tasks", TASKS), "--workers", "1", env=env)
    run.wait_ready()
    assert run.get("/livez")[0] == 200
    nsqd.publish(TOPIC, b"block")
    wait_for(lambda: run.get("/livez")[0] == 503, 5, message=lambda: run.output())
    wait_for(lambda: run.get("/livez")[0] == 200, 10, message=lambda: run.output())
    wait_for(lambda: "block" in handled(tmp_path), 10)
    output = run.output()
    assert "event loop blocked" in output and "task work (fault_tasks.work" in output
    assert "time.sleep(4)" in output  # the stack, logged once
    assert output.count("event loop blocked") == 1
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0
