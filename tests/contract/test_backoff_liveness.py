"""Consumer backoff never stops a worker (issue 43): failures in a row, then successes,
and the backlog drains, on every transport and on both event loops (uvloop's timers fire
early against ``time.monotonic``; a pause whose timer fired early once left the flow
paused for good)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import pytest

from nsqworker.message import Message
from nsqworker.task import Registry, Retry
from nsqworker.worker import Worker

if TYPE_CHECKING:
    from conftest import Harness  # tests/contract/conftest.py

pytestmark = pytest.mark.both_loops


async def test_after_failures_in_a_row_the_backlog_drains(broker: Harness) -> None:
    handled: Counter[bytes] = Counter()
    calls = 0
    reg = Registry()

    @reg.task(broker.topic, channel="liveness", max_in_flight=5, max_attempts=50)
    async def handle(msg: Message) -> None:
        nonlocal calls
        calls += 1
        if calls <= 30:  # a dependency down for a while: every call fails...
            raise Retry(delay=0.05, reason="down")
        handled[msg.body] += 1  # ...then it is back

    await broker.publish(broker.topic, [f"m{i}".encode() for i in range(60)])
    # Backoff on (the default is on), with short pauses (0.1, 0.2, then 0.3 s at most), so
    # the 30 failures make some 25 pauses: each one's timer may fire early on uvloop.
    settings = broker.settings(backoff_multiplier=0.05, max_backoff_duration=0.3)
    async with Worker(reg, settings, transport=broker.transport()) as worker:
        await broker.until(lambda: len(handled) == 60, 45, "all 60 handled after the failures")
        await broker.until_settled(broker.topic, "liveness", 60, retried=None)
        stats = worker.stats().tasks[handle.spec.name]
        await broker.until(
            lambda: worker.stats().tasks[handle.spec.name].backoff_level == 0, 10, "level 0"
        )
    assert calls > 30 and stats.backoff_stalls == 0
