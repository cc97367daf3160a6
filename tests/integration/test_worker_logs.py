"""The Worker's log policy against a real nsqd (DESIGN.md "Logs"): a success writes
nothing at info, a REQ one warning, a dead letter one error with its traceback (a
``Reject``: one warning with its reason), each busy task an info summary; an embedded Worker applies Settings.log_level itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration

TOPIC = "logs_test"
CHANNEL = "c"


@pytest.fixture
def lines(log_lines: Callable[[], list[dict[str, Any]]]) -> Callable[[], list[dict[str, Any]]]:
    """JSON logging at info into a buffer (tests/conftest.py); a reader of the lines."""
    return log_lines


def settings(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "health_port": 0,
    }
    return Settings(**{**values, **overrides})


def about(lines: list[dict[str, Any]], ids: set[str]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("id") in ids]


async def test_a_successful_message_writes_no_line_at_info(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    seen: set[str] = set()
    registry = Registry()

    @registry.task(TOPIC, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        seen.add(msg.id)

    async with Worker(registry, settings(nsqd, log_summary_interval=0)):
        nsqd.mpublish(TOPIC, [b"x"] * 20)
        await wait_until(lambda: len(seen) == 20)
    assert about(lines(), seen) == []
    assert "finished" not in [line["event"] for line in lines()]
    assert len(lines()) < 10  # start, subscribe, drain, stop: never one per message


async def test_a_req_writes_one_warning_with_its_delay(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    attempts: list[int] = []
    registry = Registry()

    @registry.task(TOPIC, channel=CHANNEL, name="flaky")
    async def handle(msg: Message) -> None:
        attempts.append(msg.attempts)
        if msg.attempts == 1:
            raise ValueError("not yet")

    async with Worker(registry, settings(nsqd, log_summary_interval=0)):
        nsqd.publish(TOPIC, b"x")
        await wait_until(lambda: attempts == [1, 2])
    [line] = [line for line in lines() if "id" in line]
    assert line["level"] == "warning"
    assert line["event"] == "retry"
    assert line["task"] == "flaky"
    assert line["attempts"] == 1
    assert line["error"] == "ValueError"
    assert 0 < line["delay"] <= 0.1  # retry_delay 0.05 with the policy's jitter
    assert "not yet" in line["exception"]


async def test_a_reject_writes_one_warning_with_its_reason_and_no_traceback(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    dead: list[str] = []
    registry = Registry()

    @registry.task(TOPIC, channel=CHANNEL, on_dead_letter=lambda msg, reason: dead.append(reason))
    async def handle(msg: Message) -> None:
        raise Reject("malformed")

    async with Worker(registry, settings(nsqd, log_summary_interval=0)):
        nsqd.publish(TOPIC, b"x")
        await wait_until(lambda: dead)
    [line] = [line for line in lines() if "id" in line]
    assert (line["level"], line["event"], line["reason"]) == ("warning", "dead-letter", "malformed")
    assert "exception" not in line  # an expected outcome: no traceback


async def test_a_last_failed_attempt_writes_one_error_with_the_traceback(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    dead: list[str] = []
    registry = Registry()

    @registry.task(
        TOPIC, channel=CHANNEL, max_attempts=1, on_dead_letter=lambda msg, r: dead.append(r)
    )
    async def handle(msg: Message) -> None:
        raise ValueError("broken")

    async with Worker(registry, settings(nsqd, log_summary_interval=0)):
        nsqd.publish(TOPIC, b"x")
        await wait_until(lambda: dead)
    [line] = [line for line in lines() if "id" in line]
    assert (line["level"], line["event"]) == ("error", "dead-letter")
    assert (line["reason"], line["attempts"], line["error"]) == (
        "max attempts exceeded",
        1,
        "ValueError",
    )
    assert "raise ValueError" in line["exception"]


async def test_a_busy_task_logs_a_summary_and_an_idle_one_does_not(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]]
) -> None:
    seen: list[str] = []
    registry = Registry()

    @registry.task(TOPIC, channel=CHANNEL, name="busy")
    async def busy(msg: Message) -> None:
        seen.append(msg.id)
        if msg.attempts == 1 and len(seen) <= 3:
            raise ValueError("first three fail once")

    @registry.task(TOPIC + "_idle", channel=CHANNEL, name="idle")
    async def idle(msg: Message) -> None:
        pass

    async with Worker(registry, settings(nsqd, log_summary_interval=0.3)):
        nsqd.mpublish(TOPIC, [b"x"] * 50)
        await wait_until(lambda: len(seen) == 53)
        await wait_until(lambda: any(line["event"] == "summary" for line in lines()), 3)
    summaries = [line for line in lines() if line["event"] == "summary"]
    assert {line["task"] for line in summaries} == {"busy"}
    assert all(line["level"] == "info" for line in summaries)
    assert sum(line["finished"] for line in summaries) == 50
    assert sum(line["retried"] for line in summaries) == 3
    assert sum(line["dead_letter"] for line in summaries) == 0
    first = summaries[0]
    assert first["rate"] > 0
    assert 0 < first["p50_ms"] <= first["p99_ms"] <= 1.0  # no-op handlers: the 1 ms bucket


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_the_summary_shows_a_known_handler_time(
    nsqd: NsqdProcess, lines: Callable[[], list[dict[str, Any]]], kind: str
) -> None:
    """Handlers that take 100 ms show p50 ~100 ms (interpolated in a bucket a few percent
    wide), not the middle of the 0.1-0.5 s Prometheus bucket (300 ms)."""
    import asyncio
    import time

    seen: list[str] = []
    registry = Registry()
    if kind == "async":

        @registry.task(TOPIC, channel=CHANNEL, name="timed", max_in_flight=10)
        async def timed(msg: Message) -> None:
            await asyncio.sleep(0.1)
            seen.append(msg.id)
    else:

        @registry.task(TOPIC, channel=CHANNEL, name="timed", max_in_flight=10)
        def timed_sync(msg: Message) -> None:
            time.sleep(0.1)
            seen.append(msg.id)

    async with Worker(registry, settings(nsqd, log_summary_interval=60)):
        nsqd.mpublish(TOPIC, [b"x"] * 20)
        await wait_until(lambda: len(seen) == 20, 20)
    [summary] = [line for line in lines() if line["event"] == "summary"]  # the last window
    assert summary["finished"] == 20
    # About 100 ms: uvloop's timers count whole milliseconds and may end a sleep a
    # fraction of one early, and p50 is interpolated in a bucket a few percent wide
    assert 95 <= summary["p50_ms"] < 150, summary
    assert summary["p50_ms"] <= summary["p99_ms"] < 200, summary


EMBEDDED = """
import asyncio, sys
from nsqworker import Registry, Settings, Worker

seen = []
registry = Registry()

@registry.task("logs_embedded", channel="c")
async def handle(msg):
    seen.append(msg.id)

async def main():
    settings = Settings(nsqd_tcp_addresses=[sys.argv[1]], log_level=sys.argv[2],
                        log_format="json", health_port=0)
    async with Worker(registry, settings):
        while not seen:
            await asyncio.sleep(0.01)

asyncio.run(asyncio.wait_for(main(), 20))
"""


@pytest.mark.parametrize("level", ["debug", "warning"])
def test_an_embedded_worker_honours_log_level(nsqd: NsqdProcess, level: str) -> None:
    """A program that sets up no logging of its own gets Settings.log_level/log_format."""
    nsqd.publish("logs_embedded", b"x")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSQWORKER_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(EMBEDDED), nsqd.tcp_address, level],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [(line["level"], line["event"]) for line in map(json.loads, done.stderr.splitlines())]
    if level == "debug":
        assert ("debug", "finished") in events
        assert ("info", "worker started") in events
    else:
        assert events == []


def test_an_application_that_configured_logging_keeps_its_own(nsqd: NsqdProcess) -> None:
    """logging.basicConfig first: the Worker leaves logging alone (no JSON, no debug)."""
    nsqd.publish("logs_embedded", b"x")
    script = "import logging; logging.basicConfig(level=logging.WARNING)\n" + EMBEDDED
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), nsqd.tcp_address, "debug"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
