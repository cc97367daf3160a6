"""The slow-handler warning, on the memory transport: its threshold is 10x the task's
p99 handler duration, at least ``slow_handler_after``, and a handler's time counts from
its start (a message that waited for a slot is not a slow handler)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from nsqworker.logging import histogram_quantile
from nsqworker.memory import MemoryTransport
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.stats import DURATION_BUCKETS
from nsqworker.task import Registry
from nsqworker.worker import Worker

SLOW = "handler still running"


def settings(**values: Any) -> Settings:
    return Settings(**({"transport": "memory", "health_port": 0, "retry_delay": 30} | values))


async def test_the_threshold_is_ten_times_the_p99_and_at_least_the_floor() -> None:
    reg = Registry()

    @reg.task("slow_p99", channel="c")
    async def handle(msg: Message) -> None:
        pass

    async with Worker(reg, settings(slow_handler_after=60), transport=MemoryTransport()) as w:
        (runner,) = w.runners
        assert runner.slow_after() == 60  # no history: the floor
        fast = runner.bounds.index(0.05)  # handlers of 10-50 ms: 10x p99 is under 60 s
        runner.counts[fast] = 1000
        assert runner.slow_after() == 60
        slow = runner.bounds.index(30)  # of 10-30 s: 10x p99 is about 300 s
        runner.counts[slow] = 100_000
        p99 = histogram_quantile(runner.bounds, runner.counts, 0.99)
        assert 25 < p99 <= 30
        assert runner.slow_after() == 10 * p99
        runner.counts[-1] = 10**9  # past the last bucket (+Inf): its highest bound
        assert runner.slow_after() == 10 * DURATION_BUCKETS[-1]


async def test_a_task_with_fast_history_is_not_slow_where_one_without_is(
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:
    """The same 0.3 s handler on two tasks with a 0.1 s floor: the task whose p99 is
    about 50 ms (threshold about 0.5 s) logs nothing, the one with no history does."""
    reg = Registry()

    @reg.task("slow_known", channel="c")
    async def known(msg: Message) -> None:
        await asyncio.sleep(0.3 if msg.body == b"long" else 0.05)

    @reg.task("slow_new", channel="c")
    async def new(msg: Message) -> None:
        await asyncio.sleep(0.3)

    broker = MemoryTransport()
    async with Worker(reg, settings(slow_handler_after=0.1), transport=broker) as w:
        await broker.publish_many("slow_known", [b"short"] * 20)
        await broker.run_until_idle()
        known_runner = w.runners[0]
        assert 0.4 <= known_runner.slow_after() < 1.0  # 10 x a p99 of about 50 ms
        await broker.publish("slow_known", b"long")
        await broker.publish("slow_new", b"long")
        await broker.run_until_idle()
    slow = [line for line in log_lines() if line["event"] == SLOW]
    assert [line["task"] for line in slow] == [new.spec.name]
    assert slow[0]["threshold_s"] == 0.1  # the floor, rounded to a tenth
    assert len(broker.finished("slow_known", "c")) == 21


async def test_a_message_waiting_for_a_slot_is_not_a_slow_handler(
    log_lines: Callable[[], list[dict[str, Any]]],
) -> None:
    """A sync handler past its limit keeps its slot; the next message waits for it in
    the dispatcher, then runs for 0.3 s. Counted from receipt it would be about 1 s old
    (past the 0.5 s threshold); counted from its start it never is."""
    reg = Registry()
    ran: list[tuple[bytes, float]] = []

    @reg.task("slow_wait", channel="c", timeout=0.1, max_in_flight=1)
    def handle(msg: Message) -> None:
        began = time.monotonic()
        time.sleep(1.0 if msg.body == b"stuck" else 0.3)
        ran.append((msg.body, began))

    broker = MemoryTransport()
    async with Worker(reg, settings(), transport=broker) as w:
        (runner,) = w.runners
        runner.slow_watch.threshold = lambda: 0.5  # fixed: this test is about the age
        published = time.monotonic()
        await broker.publish("slow_wait", b"stuck")
        await broker.run_until_idle(until=lambda: bool(broker.retried("slow_wait", "c")))
        await broker.publish("slow_wait", b"waits")
        await broker.run_until_idle(until=lambda: any(body == b"waits" for body, _ in ran))
    waited = dict(ran)[b"waits"] - published
    assert waited > 0.8  # it did wait for the stuck thread's slot
    assert [line for line in log_lines() if line["event"] == SLOW] == []
