"""The Worker against a real nsqd: DESIGN.md's handler outcome table, row by row, plus
sync handlers, answering yourself, TOUCH for long handlers and draining."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any

import pytest
import structlog

from nsqworker.errors import AlreadyResponded
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject, Retry
from nsqworker.testing import NsqdFactory, NsqdProcess, wait_until
from nsqworker.testing.holds import holds_async, window
from nsqworker.worker import Worker

TOPIC = "worker_test"
CHANNEL = "c"
DEAD = "worker_test.dead"


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    """Handler failures log tracebacks; rendering them on the loop would skew timings."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


def fast_settings(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "retry_delay": 0.1,
        "backoff_multiplier": 0.0,
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.5,
        "drain_timeout": 5.0,
        "dial_timeout": 2.0,
        "heartbeat_interval": 5.0,
    }
    values.update(overrides)
    return Settings(**values)


def prepare(nsqd: NsqdProcess, *channels: tuple[str, str]) -> NsqdProcess:
    """Create the channels, then restart nsqd so it scans them for deferred and timed-out
    messages at once (it picks up channels created later only every 5 s)."""
    for topic, channel in channels or ((TOPIC, CHANNEL),):
        nsqd.create_channel(topic, channel)
    return nsqd.restart()


def channel(nsqd: NsqdProcess, topic: str = TOPIC, name: str = CHANNEL) -> dict[str, Any]:
    return nsqd.channel_stats(topic, name) or {}


def client_counts(nsqd: NsqdProcess) -> tuple[int, int]:
    """(finish_count, requeue_count) of the worker's connection, as nsqd counted them."""
    clients = channel(nsqd).get("clients") or [{}]
    return clients[0].get("finish_count", 0), clients[0].get("requeue_count", 0)


# --- the outcome table ----------------------------------------------------------------------


async def test_return_finishes(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    bodies: list[bytes] = []

    @reg.task(TOPIC, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        bodies.append(msg.body)

    nsqd.publish(TOPIC, b'{"id": 1}')
    async with Worker(reg, fast_settings(nsqd)) as worker:
        await wait_until(lambda: bodies, message="delivery")
        await wait_until(lambda: client_counts(nsqd) == (1, 0), 5, "FIN at nsqd")
        stats = worker.stats().tasks[handle.spec.name]
        assert (stats.received, stats.finished, stats.requeued) == (1, 1, 0)
        assert stats.duration.count == 1 and stats.subscribed and worker.ready
    assert bodies == [b'{"id": 1}']
    assert channel(nsqd)["depth"] == 0 and channel(nsqd)["in_flight_count"] == 0


async def test_retry_requeues_with_its_delay_then_redelivers(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    deliveries: list[tuple[int, float]] = []

    @reg.task(TOPIC, channel=CHANNEL, retry_delay=30)  # Retry's own delay wins
    async def handle(msg: Message) -> None:
        deliveries.append((msg.attempts, time.monotonic()))
        if msg.attempts == 1:
            raise Retry(delay=1.0, reason="not ready")

    nsqd.publish(TOPIC, b"job")
    async with Worker(reg, fast_settings(nsqd)):
        await wait_until(lambda: len(deliveries) == 2, 10, "redelivery")
        await wait_until(lambda: client_counts(nsqd) == (1, 1), 5, "REQ then FIN")
    assert [a for a, _ in deliveries] == [1, 2]
    gap = deliveries[1][1] - deliveries[0][1]
    assert 0.9 <= gap <= 1.5, gap  # nsqd scans deferred messages every 100 ms


async def test_other_exception_requeues_with_growing_delay(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    deliveries: list[tuple[int, float]] = []

    @reg.task(TOPIC, channel=CHANNEL, max_attempts=10)
    def handle(msg: Message) -> None:
        deliveries.append((msg.attempts, time.monotonic()))
        if msg.attempts < 4:
            raise ValueError("flaky")

    nsqd.publish(TOPIC, b"job")
    settings = fast_settings(nsqd, retry_delay=0.25, retry_multiplier=2.0)
    async with Worker(reg, settings) as worker:
        await wait_until(lambda: len(deliveries) == 4, 10, "four deliveries")
        await wait_until(lambda: client_counts(nsqd) == (1, 3), 5, "3 REQ, 1 FIN")
        stats = worker.stats().tasks[handle.spec.name]
        assert (stats.requeued, stats.finished, stats.dead_lettered) == (3, 1, 0)
    assert [a for a, _ in deliveries] == [1, 2, 3, 4]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(deliveries)]
    for gap, expected in zip(gaps, [0.25, 0.5, 1.0], strict=True):  # +-10 % jitter
        assert expected * 0.85 <= gap <= expected * 1.1 + 0.2, gaps


def dead_letter_registry(
    hook_calls: list[tuple[bytes, int, str]], letters: list[dict[str, Any]], **options: Any
) -> Registry:
    """A registry with a dead-letter reader task on DEAD; ``options`` go to the main task."""
    reg = Registry()

    @reg.task(DEAD, channel="reader")
    async def read_dead_letter(msg: Message) -> None:
        letters.append(msg.json())

    def on_dead_letter(msg: Message, reason: str) -> None:
        hook_calls.append((msg.body, msg.attempts, reason))

    handler = options.pop("handler")
    options.setdefault("on_dead_letter", on_dead_letter)
    reg.task(TOPIC, channel=CHANNEL, dead_letter_topic=DEAD, **options)(handler)
    return reg


async def test_reject_calls_hooks_once_publishes_the_dead_letter_then_finishes(
    nsqd: NsqdProcess,
) -> None:
    prepare(nsqd, (TOPIC, CHANNEL), (DEAD, "reader"))
    calls: list[tuple[bytes, int, str]] = []
    letters: list[dict[str, Any]] = []
    handled: list[int] = []

    async def handle(msg: Message) -> None:
        handled.append(msg.attempts)
        raise Reject("malformed")

    reg = dead_letter_registry(calls, letters, handler=handle, max_attempts=5)
    nsqd.publish(TOPIC, b"not json")
    async with Worker(reg, fast_settings(nsqd)) as worker:
        await wait_until(lambda: letters, 10, "dead letter")
        await wait_until(lambda: client_counts(nsqd) == (1, 0), 5, "FIN, no REQ")
        task = next(s for s in reg if s.topic == TOPIC)
        assert worker.stats().tasks[task.name].dead_lettered == 1
    assert handled == [1]  # no retry
    assert calls == [(b"not json", 1, "malformed")]
    [letter] = letters
    assert letter["topic"] == TOPIC and letter["channel"] == CHANNEL
    assert letter["attempts"] == 1 and letter["reason"] == "malformed"
    assert letter["body"] == "not json" and len(letter["id"]) == 16
    assert letter["task"].endswith("handle") and letter["timestamp"] > 0
    assert channel(nsqd)["depth"] == 0 and channel(nsqd)["requeue_count"] == 0


async def test_the_last_failed_attempt_goes_to_the_hooks_at_once(nsqd: NsqdProcess) -> None:
    prepare(nsqd, (TOPIC, CHANNEL), (DEAD, "reader"))
    calls: list[tuple[bytes, int, str]] = []
    letters: list[dict[str, Any]] = []
    handled: list[int] = []

    async def handle(msg: Message) -> None:
        handled.append(msg.attempts)
        raise RuntimeError("always fails")

    reg = dead_letter_registry(calls, letters, handler=handle, max_attempts=2)
    nsqd.publish(TOPIC, bytes([0xFF, 0x00]))
    async with Worker(reg, fast_settings(nsqd)):
        await wait_until(lambda: letters, 10, "dead letter")
        await wait_until(lambda: client_counts(nsqd) == (1, 1), 5, "1 REQ then FIN")
    assert handled == [1, 2]  # the second failure was the last: no third delivery
    assert calls == [(bytes([0xFF, 0x00]), 2, "max attempts exceeded")]
    assert letters[0]["attempts"] == 2 and letters[0]["reason"] == "max attempts exceeded"
    assert letters[0]["body"] == "/wA=" and letters[0]["body_encoding"] == "base64"


async def test_attempts_over_max_go_to_hooks_without_calling_the_handler(
    nsqd: NsqdProcess,
) -> None:
    """A message whose count is already past a task's max_attempts (retried by a worker
    that allowed more) is dead-lettered on arrival, its handler not called."""
    prepare(nsqd, (TOPIC, CHANNEL), (DEAD, "reader"))
    first: list[int] = []

    async def retry_later(msg: Message) -> None:
        first.append(msg.attempts)
        raise Retry(delay=1.0)

    nsqd.publish(TOPIC, b"x")
    async with Worker(dead_letter_registry([], [], handler=retry_later), fast_settings(nsqd)):
        await wait_until(lambda: first, 10, "the first delivery")
    calls: list[tuple[bytes, int, str]] = []
    letters: list[dict[str, Any]] = []
    handled: list[int] = []

    async def handle(msg: Message) -> None:
        handled.append(msg.attempts)

    reg = dead_letter_registry(calls, letters, handler=handle, max_attempts=1)
    async with Worker(reg, fast_settings(nsqd)):
        await wait_until(lambda: letters, 15, "dead letter")
    assert first == [1] and handled == []
    assert calls == [(b"x", 2, "max attempts exceeded")]
    assert letters[0]["attempts"] == 2


async def test_a_failing_dead_letter_hook_requeues_the_message(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    hook_calls: list[int] = []

    async def alert(msg: Message, reason: str) -> None:
        hook_calls.append(msg.attempts)
        if len(hook_calls) == 1:
            raise ConnectionError("alerting is down")

    @reg.task(TOPIC, channel=CHANNEL, on_dead_letter=alert)
    async def handle(msg: Message) -> None:
        raise Reject("bad")

    nsqd.publish(TOPIC, b"x")
    async with Worker(reg, fast_settings(nsqd)):
        await wait_until(lambda: len(hook_calls) == 2, 10, "hook retried")
        await wait_until(lambda: client_counts(nsqd) == (1, 1), 5, "REQ then FIN")
    assert hook_calls == [1, 2]  # requeued, redelivered, not lost
    assert channel(nsqd)["depth"] == 0 and channel(nsqd)["in_flight_count"] == 0


async def test_long_handlers_are_touched_past_the_message_timeout(
    nsqd_factory: NsqdFactory,
) -> None:
    nsqd = prepare(nsqd_factory(extra_args=["--msg-timeout=2s"]), (TOPIC, CHANNEL), (TOPIC, "s"))
    reg = Registry()
    done: list[tuple[str, int, int]] = []

    @reg.task(TOPIC, channel=CHANNEL)
    async def slow(msg: Message) -> None:
        await asyncio.sleep(4)
        done.append(("async", msg.attempts, msg.touch_count))

    @reg.task(TOPIC, channel="s")
    def slow_sync(msg: Message) -> None:
        time.sleep(4)
        done.append(("sync", msg.attempts, msg.touch_count))

    nsqd.publish(TOPIC, b"spark job")
    async with Worker(reg, fast_settings(nsqd, msg_timeout=2.0)):
        await wait_until(lambda: len(done) == 2, 10, "both long handlers")
    assert sorted(kind for kind, _, _ in done) == ["async", "sync"]
    assert all(attempts == 1 and touches >= 2 for _, attempts, touches in done), done
    for name in (CHANNEL, "s"):
        stats = channel(nsqd, TOPIC, name)
        assert stats["timeout_count"] == 0 and stats["requeue_count"] == 0, stats
        assert stats["in_flight_count"] == 0 and stats["depth"] == 0


# --- sync handlers, answering yourself ------------------------------------------------------


async def test_sync_handlers_run_concurrently_off_the_loop(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    threads: list[int] = []
    finished: list[float] = []

    @reg.task(TOPIC, channel=CHANNEL, max_in_flight=10)
    def block(msg: Message) -> None:
        threads.append(threading.get_ident())
        time.sleep(0.5)
        finished.append(time.monotonic())

    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(10)])
    async with Worker(reg, fast_settings(nsqd)):
        loop_thread = threading.get_ident()
        await wait_until(lambda: threads, 5, "first handler")
        started = time.monotonic()
        await wait_until(lambda: len(finished) == 10, 5, "ten handlers")
        elapsed = max(finished) - started
        await wait_until(lambda: client_counts(nsqd) == (10, 0), 5, "ten FIN")
    assert elapsed < window(0.9), elapsed  # concurrent: ~0.5 s, not 5 s
    assert loop_thread not in threads and len(set(threads)) == 10


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_answering_yourself_sends_one_command(nsqd: NsqdProcess, kind: str) -> None:
    prepare(nsqd)
    reg = Registry()
    errors: list[BaseException] = []

    def answer(msg: Message) -> None:
        msg.touch()
        msg.finish()
        try:
            msg.finish()
        except AlreadyResponded as exc:
            errors.append(exc)
        if msg.body == b"raise":
            raise RuntimeError("after answering")

    async def answer_async(msg: Message) -> None:
        answer(msg)

    reg.task(TOPIC, channel=CHANNEL)(answer_async if kind == "async" else answer)
    nsqd.mpublish(TOPIC, [b"return", b"raise"])
    async with Worker(reg, fast_settings(nsqd)):
        await wait_until(lambda: len(errors) == 2, 5, "both handled")
        await wait_until(lambda: client_counts(nsqd) == (2, 0), 5, "two FIN")
        await holds_async(lambda: client_counts(nsqd) == (2, 0), 1.0, "a FIN or REQ more")
    assert all("already answered" in str(e) for e in errors)
    assert channel(nsqd)["requeue_count"] == 0 and channel(nsqd)["depth"] == 0


# --- stopping -------------------------------------------------------------------------------


async def test_async_with_drains_running_handlers(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    started: list[bytes] = []
    finished: list[bytes] = []

    @reg.task(TOPIC, channel=CHANNEL, max_in_flight=5)
    async def work(msg: Message) -> None:
        started.append(msg.body)
        await asyncio.sleep(0.5)
        finished.append(msg.body)

    nsqd.mpublish(TOPIC, [f"m{i}" for i in range(5)])
    async with Worker(reg, fast_settings(nsqd)) as worker:
        await wait_until(lambda: len(started) == 5, 5, "five running")
        assert worker.stats().tasks[work.spec.name].running == 5
    assert sorted(finished) == sorted(started)  # the exit waited for them
    stats = channel(nsqd)
    assert (stats["in_flight_count"], stats["depth"], stats["requeue_count"]) == (0, 0, 0)
    assert not worker.ready


async def test_drain_timeout_requeues_what_did_not_finish(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    started: list[int] = []
    cancelled: list[int] = []

    @reg.task(TOPIC, channel=CHANNEL)
    async def stuck(msg: Message) -> None:
        started.append(msg.attempts)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(msg.attempts)
            raise

    nsqd.publish(TOPIC, b"x")
    worker = Worker(reg, fast_settings(nsqd))
    await worker.start()
    await wait_until(lambda: started, 5, "handler running")
    begun = time.monotonic()
    await worker.stop(drain_timeout=0.3)
    assert time.monotonic() - begun < 2.0
    assert cancelled == [1]
    stats = channel(nsqd)
    assert stats["in_flight_count"] == 0 and stats["requeue_count"] == 1
    assert stats["depth"] + stats["deferred_count"] == 1  # back in the queue, not lost


async def test_run_serves_until_request_stop_from_another_thread(nsqd: NsqdProcess) -> None:
    prepare(nsqd)
    reg = Registry()
    seen: list[bytes] = []

    @reg.task(TOPIC, channel=CHANNEL)
    def handle(msg: Message) -> None:
        seen.append(msg.body)

    worker = Worker(reg, fast_settings(nsqd))
    runner = asyncio.create_task(worker.run())
    await wait_until(lambda: worker.ready, 5, "ready")
    nsqd.publish(TOPIC, b"hello")
    await wait_until(lambda: seen, 5, "delivery")
    threading.Thread(target=worker.request_stop).start()
    await asyncio.wait_for(runner, 5)
    assert not worker.ready
    snapshot = worker.stats().as_dict()
    json.dumps(snapshot)  # plain data
    task = snapshot["tasks"][handle.spec.name]
    assert task["finished"] == 1 and task["duration"]["count"] == 1
    assert len(task["duration"]["counts"]) == len(task["duration"]["buckets"]) + 1
