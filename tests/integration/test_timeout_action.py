"""``timeout_action`` on a real nsqd (issue 54): what a handler past its time limit
becomes, with nsqd's own counts as the truth (the channel's ``requeue_count``, the
dead-letter topic's ``message_count``, nothing left in depth or in flight)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration

TOPIC, CHANNEL, DEAD = "slow", "c", "slow.dead"
LIMIT = 0.3


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end, so no handler's thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


def settings_for(nsqd: NsqdProcess, **values: Any) -> Settings:
    return Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.05, backoff_multiplier=0,
        **values,
    )  # fmt: skip


def counts(nsqd: NsqdProcess) -> dict[str, int]:
    """What nsqd says happened: REQs on the channel, messages on the dead-letter topic,
    and what the channel still holds (depth + in flight + deferred)."""
    channel = nsqd.channel_stats(TOPIC, CHANNEL) or {}
    dead = nsqd.topic_stats(DEAD) or {}
    held = sum(int(channel.get(k, 0)) for k in ("depth", "in_flight_count", "deferred_count"))
    return {
        "requeued": int(channel.get("requeue_count", 0)),
        "dead": int(dead.get("message_count", 0)),
        "held": held,
    }


async def settled(nsqd: NsqdProcess, expected: dict[str, int]) -> None:
    """Wait until nsqd's counts are ``expected``."""
    await wait_until(
        lambda: counts(nsqd) == expected, timeout=20,
        message=lambda: f"nsqd counts {counts(nsqd)}, expected {expected}",
    )  # fmt: skip


def blocking(calls: list[int], release: threading.Event, on: Callable[[Message], bool]) -> Any:
    """A sync handler recording each attempt, blocking until ``release`` when ``on(msg)``."""

    def handle(msg: Message) -> None:
        calls.append(msg.attempts)
        if on(msg):
            release.wait(60)

    return handle


async def test_retry_retries_then_dead_letters_and_asks_for_a_new_process(
    nsqd: NsqdProcess, release: threading.Event
) -> None:
    registry, calls = Registry(), []
    handler = blocking(calls, release, lambda msg: True)
    registry.task(TOPIC, channel=CHANNEL, timeout=LIMIT, max_attempts=2, dead_letter_topic=DEAD)(
        handler
    )
    async with Worker(registry, settings_for(nsqd)) as worker:
        nsqd.publish(TOPIC, b"never done")
        await settled(nsqd, {"requeued": 1, "dead": 1, "held": 0})
        assert calls == [1, 2]
        assert worker.recycle is not None  # today's behaviour: the process is replaced


@pytest.mark.parametrize("is_async", [False, True])
async def test_dead_letter_at_the_first_time_limit(
    nsqd: NsqdProcess, release: threading.Event, is_async: bool
) -> None:
    registry, calls = Registry(), []
    options = {"timeout": LIMIT, "max_attempts": 5, "dead_letter_topic": DEAD}
    if is_async:

        @registry.task(TOPIC, channel=CHANNEL, timeout_action="dead_letter", **options)
        async def handle(msg: Message) -> None:
            calls.append(msg.attempts)
            await asyncio.sleep(60)

    else:
        handler = blocking(calls, release, lambda msg: True)
        registry.task(TOPIC, channel=CHANNEL, timeout_action="dead_letter", **options)(handler)
    async with Worker(registry, settings_for(nsqd)) as worker:
        nsqd.publish(TOPIC, b"never done")
        await settled(nsqd, {"requeued": 0, "dead": 1, "held": 0})
        assert calls == [1]
        # A thread cannot be stopped: the process is still replaced; a cancelled Task is gone.
        assert (worker.recycle is not None) is (not is_async)


async def test_abandon_frees_the_slot_and_keeps_the_process(
    nsqd: NsqdProcess, release: threading.Event
) -> None:
    registry, calls, done = Registry(), [], []

    def handle(msg: Message) -> None:
        calls.append((msg.body, msg.attempts))
        if msg.body == b"stuck" and msg.attempts == 1:
            release.wait(60)
            done.append("stuck thread returned")
        else:
            done.append(msg.body)

    # One slot: "next" runs only if the stuck message's slot is given back at its limit.
    registry.task(
        TOPIC, channel=CHANNEL, timeout=LIMIT, max_in_flight=1, max_attempts=3,
        dead_letter_topic=DEAD,
    )(handle)  # fmt: skip
    settings = settings_for(nsqd, timeout_action="abandon")
    async with Worker(registry, settings) as worker:
        nsqd.publish(TOPIC, b"stuck")
        nsqd.publish(TOPIC, b"next")
        await settled(nsqd, {"requeued": 1, "dead": 0, "held": 0})
        await wait_until(lambda: {b"next", b"stuck"} <= set(done), message=lambda: f"{done}")
        assert "stuck thread returned" not in done  # still running, on its own
        assert worker.recycle is None  # no process replaced
        assert sorted(calls) == [(b"next", 1), (b"stuck", 1), (b"stuck", 2)]
        release.set()
        await wait_until(lambda: "stuck thread returned" in done)
    assert counts(nsqd) == {"requeued": 1, "dead": 0, "held": 0}  # its late return sent nothing


async def test_abandon_past_max_abandoned_threads_replaces_the_process(
    nsqd: NsqdProcess, release: threading.Event, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    registry, calls = Registry(), []
    handler = blocking(calls, release, lambda msg: msg.attempts == 1)
    registry.task(TOPIC, channel=CHANNEL, timeout=LIMIT, max_in_flight=2, dead_letter_topic=DEAD)(
        handler
    )
    settings = settings_for(nsqd, timeout_action="abandon", max_abandoned_threads=1)
    async with Worker(registry, settings) as worker:
        nsqd.publish(TOPIC, b"one")
        nsqd.publish(TOPIC, b"two")
        await settled(nsqd, {"requeued": 2, "dead": 0, "held": 0})  # both retried, then done
        assert sorted(calls) == [1, 1, 2, 2]
        assert worker.recycle is not None  # the second could not be abandoned
        lines = [(line["level"], line["event"]) for line in log_lines()]
        assert ("warning", "a sync handler ran past its time limit; its thread is left running "
                "(timeout_action abandon) and a new one takes its slot") in lines  # fmt: skip
        assert ("warning", "a sync handler ran past its time limit with max_abandoned_threads "
                "threads already abandoned in this process; replacing the process instead"
                ) in lines  # fmt: skip
