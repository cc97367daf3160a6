"""``nsqworker run`` end to end: real nsqd, real worker processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import NsqBinaries, NsqdProcess, free_ports, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TOPIC, CHANNEL = "e2e", "c"

# Appends each handled id with O_APPEND (one write per line, safe across processes).
SLOW_TASKS = """
import asyncio
import os

from nsqworker.task import task

SLEEP = float(os.environ.get("HANDLER_SLEEP", "1"))


@task("e2e", channel="c", max_in_flight=10)
async def slow(msg):
    await asyncio.sleep(SLEEP)
    fd = os.open(os.environ["HANDLED_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, msg.id.encode() + b"\\n")
    finally:
        os.close(fd)
"""

#: Seconds a worker process gets to start (spawn, imports) and subscribe.
BOOT = 30.0
Start = Callable[..., Any]  # the ``supervise`` fixture (conftest.py), returns a Supervised
Write = Callable[[str, str], str]


def handled(env_path: Path) -> list[str]:
    return env_path.read_text().split() if env_path.exists() else []


def settle(nsqd: NsqdProcess, timeout: float = 10) -> dict[str, int]:
    """Channel stats once nothing is in flight: depth, deferred, in flight."""

    def stats() -> dict[str, int]:
        raw = nsqd.channel_stats(TOPIC, CHANNEL) or {}
        return {k: int(raw.get(k, 0)) for k in ("depth", "deferred_count", "in_flight_count")}

    wait_for(lambda: stats()["in_flight_count"] == 0, timeout, message=lambda: str(stats()))
    return stats()


@pytest.mark.parametrize(
    ("drain_timeout", "all_finish"),
    [(4.0, True), (0.3, False)],
    ids=["handlers-finish", "handlers-requeued"],
)
def test_sigterm_drains_in_flight_messages(
    supervise: Start,
    write_module: Write,
    nsqd: NsqdProcess,
    tmp_path: Path,
    drain_timeout: float,
    all_finish: bool,
) -> None:
    module = write_module("slow_tasks", SLOW_TASKS)
    nsqd.create_channel(TOPIC, CHANNEL)
    env = {
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
        "NSQWORKER_DRAIN_TIMEOUT": str(drain_timeout),
        "HANDLER_SLEEP": "1",
    }
    run = supervise(module, "--workers", "2", env=env)
    run.wait_ready()
    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(20)])
    wait_for(lambda: nsqd.in_flight(TOPIC, CHANNEL) == 20, 10, message="not all 20 in flight")

    started = time.monotonic()
    run.signal(signal.SIGTERM)
    if all_finish:  # while it drains, /readyz says stopping, not waiting for subscriptions
        wait_for(lambda: run.readyz()[1].get("stopping"), 3, message=lambda: str(run.readyz()))
        status, body = run.readyz()
        assert status == 503 and body["transport"] == "nsq"
        assert all(w.get("stopping") and "waiting_for" not in w for w in body["workers"]), body
    code = run.wait(drain_timeout + 10)
    took = time.monotonic() - started

    output = run.output()
    assert code == 0, output
    assert took < drain_timeout + 5, (took, output)
    ids = handled(tmp_path / "handled.txt")
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"handled twice: {twice}"
    stats = settle(nsqd)
    assert stats["depth"] + stats["deferred_count"] + len(ids) == 20, (stats, ids)
    if all_finish:
        assert len(ids) == 20, output  # 1 s handlers fit in a 4 s drain
    else:
        assert len(ids) < 20, output  # 1 s handlers do not fit in 0.3 s: REQed, not lost
    assert "SIGTERM: draining" in output
    assert "all workers stopped" in output


def test_a_killed_worker_is_replaced(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    module = write_module("quick_tasks", SLOW_TASKS)
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "HANDLER_SLEEP": "0"}
    run = supervise(module, "--workers", "2", env=env)
    run.wait_ready()
    before = run.pids()
    assert len(before) == 2

    os.kill(before[0], signal.SIGKILL)
    wait_for(
        lambda: run.readyz()[0] == 200 and before[0] not in run.pids() and len(run.pids()) == 2,
        BOOT,
        message=lambda: f"not replaced: {run.readyz()}\n{run.output()}",
    )
    assert before[1] in run.pids()  # the other worker was left alone
    assert "worker 1 died (killed by SIGKILL)" in run.output()
    assert run.metric("nsqworker_worker_restarts_total") == 1

    nsqd.mpublish(TOPIC, [f"after{i}" for i in range(10)])
    wait_for(lambda: len(handled(tmp_path / "handled.txt")) == 10, 15, message="not processed")
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0


def test_import_error_is_shown_once_and_exits_2(supervise: Start, write_module: Write) -> None:
    module = write_module(
        "broken_tasks",
        """
        from nsqworker.task import task

        def connect():
            raise RuntimeError("database is down")

        connect()
        """,
    )
    started = time.monotonic()
    run = supervise(module, "--workers", "2")
    assert run.wait(20) == 2
    output = run.output()
    assert time.monotonic() - started < 15
    line = "could not import broken_tasks: RuntimeError: database is down"
    assert output.count(line) == 1, output
    assert 'broken_tasks.py", line 5, in connect' in output  # the user's frames are kept
    assert "importlib" not in output
    assert "worker 1 started" not in output  # no child was started


def test_crash_loop_gives_up_with_exit_1(supervise: Start, write_module: Write) -> None:
    # Importing is fine in the supervisor; every worker process dies at once.
    module = write_module(
        "dying_tasks",
        """
        import multiprocessing
        import os

        from nsqworker.task import task

        @task("e2e", channel="c")
        async def handle(msg):
            pass

        if multiprocessing.parent_process() is not None:
            os._exit(3)
        """,
    )
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": "127.0.0.1:1"}
    run = supervise(module, "--workers", "1", "--crash-limit", "3", env=env)
    assert run.wait(60) == 1
    output = run.output()
    line = "3 workers died within 60 s; last exit code 3 (see its logs above); giving up"
    assert output.count(line) == 1, output
    assert "worker 1 died (exit code 3)" in output
    assert "restarting in 0.5 s" in output and "restarting in 1 s" in output  # backoff


def test_readyz_turns_200_once_nsqd_is_up(
    supervise: Start, write_module: Write, nsq_binaries: NsqBinaries, tmp_path: Path
) -> None:
    module = write_module("ready_tasks", SLOW_TASKS)
    tcp_port, http_port = free_ports(2)
    run = supervise(
        module, "--workers", "2", env={"NSQWORKER_NSQD_TCP_ADDRESSES": f"127.0.0.1:{tcp_port}"}
    )

    # Both workers report (so their stats arrived), neither is subscribed.
    def waiting() -> list[Any]:
        return [w.get("waiting_for") for w in run.readyz()[1].get("workers", [])]

    wait_for(
        lambda: waiting() == [["ready_tasks.slow"], ["ready_tasks.slow"]],
        BOOT,
        message=lambda: f"{run.readyz()}\n{run.output()}",
    )
    status, body = run.readyz()
    assert status == 503 and body["ready"] is False
    assert run.get("/livez")[0] == 200

    nsqd = NsqdProcess(
        tcp_port=tcp_port, http_port=http_port, binary=nsq_binaries.nsqd, data_path=tmp_path
    )
    with nsqd:
        body = run.wait_ready()
        assert all(w["ready"] for w in body["workers"])
        run.signal(signal.SIGTERM)
        assert run.wait(15) == 0


def test_metrics_count_what_was_handled(
    supervise: Start, write_module: Write, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    module = write_module("counted_tasks", SLOW_TASKS)
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "HANDLER_SLEEP": "0.01"}
    run = supervise(module, "--workers", "2", env=env)
    run.wait_ready()
    nsqd.mpublish(TOPIC, [f"n{i}" for i in range(50)])
    wait_for(lambda: len(handled(tmp_path / "handled.txt")) == 50, 20, message="not handled")
    wait_for(  # children report every second
        lambda: run.metric("nsqworker_messages_finished_total") == 50,
        5,
        message=lambda: run.get("/metrics")[1],
    )
    assert run.metric("nsqworker_messages_received_total") == 50
    assert run.metric("messaging_client_consumed_messages_total") == 50
    assert run.metric("messaging_process_duration_seconds_count") == 50
    assert run.metric("nsqworker_messages_requeued_total") == 0
    assert run.metric("nsqworker_workers_alive") == 2
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0


def test_second_ctrl_c_forces_exit_130(
    supervise: Start, write_module: Write, nsqd: NsqdProcess
) -> None:
    module = write_module("stuck_tasks", SLOW_TASKS)
    env = {
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
        "NSQWORKER_DRAIN_TIMEOUT": "60",
        "HANDLER_SLEEP": "60",
    }
    run = supervise(module, "--workers", "1", env=env)
    run.wait_ready()
    nsqd.publish(TOPIC, b"stuck")
    wait_for(lambda: nsqd.in_flight(TOPIC, CHANNEL) == 1, 10, message="not in flight")
    run.signal(signal.SIGINT)
    wait_for(lambda: "SIGINT: draining" in run.output(), 5, message=run.output)
    run.signal(signal.SIGINT)
    assert run.wait(10) == 130
    assert "killing all workers" in run.output()


def test_bad_setting_names_its_field_and_exits_2(supervise: Start, write_module: Write) -> None:
    module = write_module("fine_tasks", SLOW_TASKS)
    run = supervise(module, env={"NSQWORKER_MAX_IN_FLIGHT": "0"})
    assert run.wait(20) == 2
    output = run.output()
    assert "NSQWORKER_MAX_IN_FLIGHT (max_in_flight): must be from 1 to" in output
    assert "Traceback" not in output


def test_python_m_nsqworker_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nsqworker", "--version"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nsqworker ")


def test_a_worker_whose_loop_hangs_is_replaced(
    supervise: Start, write_module: Write, nsqd: NsqdProcess
) -> None:
    # time.sleep inside an async handler blocks the worker's event loop: no heartbeats.
    module = write_module(
        "blocking_tasks",
        """
        import time

        from nsqworker.task import task

        @task("e2e", channel="c")
        async def block(msg):
            time.sleep(3600)
        """,
    )
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address}
    run = supervise(module, "--workers", "1", "--hung-timeout", "2", env=env)
    run.wait_ready()
    (before,) = run.pids()
    nsqd.publish(TOPIC, b"block")
    wait_for(
        lambda: run.readyz()[0] == 200 and run.pids() not in ([], [before]),
        BOOT,
        message=lambda: f"not replaced: {run.readyz()}\n{run.output()}",
    )
    output = run.output()
    assert "worker 1 sent no heartbeat for 2 s; killing it" in output
    assert "worker 1 died (killed as hung)" in output
    run.signal(signal.SIGTERM)
    assert run.wait(15) == 0
