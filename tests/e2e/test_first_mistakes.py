"""A newcomer's first mistakes under ``nsqworker run``: one line and exit 2 before anything
starts, or a clear warning and retries; never a crash loop or a silent wait."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from nsqworker.testing import NsqdFactory, NsqdProcess, free_port, wait_for

if TYPE_CHECKING:
    from tests.e2e.conftest import Supervised

BOOT = 30.0  # seconds for a worker to start; as in conftest.BOOT

pytestmark = pytest.mark.e2e

Start = Callable[..., "Supervised"]
Write = Callable[[str, str], str]

TASKS = """
from nsqworker import task

@task("first_mistakes", channel="c")
async def handle(msg):
    pass
"""


def lines(run: Supervised) -> list[str]:
    return [line for line in run.output().splitlines() if line.strip()]


def test_no_address_is_one_line_and_exit_2(supervise: Start, write_module: Write) -> None:
    run = supervise(write_module("no_address_tasks", TASKS))
    assert run.wait(20) == 2
    assert lines(run) == [
        "error: no nsqd or nsqlookupd address to consume from: pass --nsqd 127.0.0.1:4150 "
        "or --lookupd http://127.0.0.1:4161, or set NSQWORKER_NSQD_TCP_ADDRESSES or "
        "NSQWORKER_LOOKUPD_HTTP_ADDRESSES (no nsqd yet? `nsqworker dev broker` starts one "
        "and prints them)"
    ]


@contextlib.contextmanager
def holding(port: int) -> Iterator[bool]:
    """Listen on ``port`` (all interfaces) for the block; False if it was taken already."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
    except OSError:
        yield False
    else:
        yield True
    finally:
        sock.close()


def test_health_port_set_and_taken_is_one_line_and_exit_2(
    supervise: Start, write_module: Write
) -> None:
    port = free_port()
    with holding(port):
        env = {"NSQWORKER_NSQD_TCP_ADDRESSES": "127.0.0.1:4150"}
        run = supervise(write_module("busy_port_tasks", TASKS), env=env, health_port=port)
        assert run.wait(20) == 2
    (line,) = [s for s in lines(run) if not s.startswith("{")]
    assert line.startswith(f"error: the health server cannot listen on 127.0.0.1:{port} (")
    assert line.endswith("change --health-port (0 turns the server off)")


def test_default_health_port_taken_moves_to_a_free_one(
    supervise: Start, write_module: Write, nsqd: NsqdProcess
) -> None:
    with holding(8080):  # taken by us, or by something else already: either way taken
        env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address}
        run = supervise(write_module("default_port_tasks", TASKS), env=env, health_port=0)
        pattern = re.compile(r"port 8080 is taken; health on http://[^:]+:(\d+)/livez")
        wait_for(lambda: pattern.search(run.output()), BOOT, message=run.output)
        match = pattern.search(run.output())
        assert match is not None
        run.health_port = int(match.group(1))
        run.wait_ready()


def test_unreachable_nsqd_is_reported_and_retried(
    supervise: Start, write_module: Write, nsqd: NsqdProcess
) -> None:
    module = write_module("unreachable_tasks", TASKS)
    address = f"127.0.0.1:{free_port()}"
    run = supervise(module, env={"NSQWORKER_NSQD_TCP_ADDRESSES": address})
    wait_for(lambda: "not subscribed yet; retrying" in run.output(), BOOT, message=run.output)
    output = run.output()
    assert f"nsqd {address} does not answer (connection refused)" in output
    assert "worker started" not in output
    status, body = run.readyz()
    assert status == 503, (body, run.output())
    run.signal(signal.SIGINT)  # Ctrl-C
    assert run.wait(20) == 0
    events = [json.loads(s).get("event", "") for s in lines(run) if s.startswith("{")]
    assert "SIGINT: draining" in events
    assert not [e for e in events if e.startswith("SIGTERM")], events


def test_a_setting_nsqd_refuses_stops_the_run_with_exit_2(
    supervise: Start, write_module: Write, nsqd_factory: NsqdFactory
) -> None:
    # Set explicitly, a heartbeat above nsqd's --max-heartbeat-interval cannot be
    # adapted: the worker says so once and the supervisor stops, instead of restarting
    # it into a crash loop.
    nsqd = nsqd_factory(extra_args=["--max-heartbeat-interval=10s"])
    module = write_module("refused_tasks", TASKS)
    env = {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address, "NSQWORKER_HEARTBEAT_INTERVAL": "30"}
    run = supervise(module, env=env)
    assert run.wait(BOOT) == 2, run.output()
    output = run.output()
    assert "heartbeat_interval" in output and "cannot start" in output, output
    assert "stopped on a configuration error" in output
    assert "worker 1 started" in output and "restarting in" not in output
    assert "giving up" not in output
