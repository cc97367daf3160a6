"""The behaviour every transport must show under the same task code (issue: the transport
seam). Each test runs once per transport in ``conftest.TRANSPORTS``, through a real
``Worker``: the in-flight bound, ack, retry with a delay, dead letter at the last attempt,
reject, keep-alive of a long handler, drain without loss or double, one span per delivery.
Each checks what the broker itself settled (``Harness.until_settled``), not only what the
worker counted: a FIN, ack or offset store lost on the way fails it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from nsqworker.message import Message
from nsqworker.task import Registry, Reject, Retry
from nsqworker.worker import Worker

if TYPE_CHECKING:
    from conftest import Harness  # tests/contract/conftest.py

CHANNEL = "contract"


def bodies(count: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(count)]


def worker(broker: Harness, registry: Registry, **settings: Any) -> Worker:
    return Worker(registry, broker.settings(**settings), transport=broker.transport())


async def test_handlers_at_once_never_exceed_max_in_flight(broker: Harness) -> None:
    running = peak = 0
    done: Counter[bytes] = Counter()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, max_in_flight=3)
    async def handle(msg: Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1
        done[msg.body] += 1

    await broker.publish(broker.topic, bodies(30))
    async with worker(broker, reg):
        await broker.until(lambda: len(done) == 30, 20, "30 handled")
        await broker.until_settled(broker.topic, CHANNEL, 30)
    assert peak == 3  # the window was used, and never exceeded
    assert set(done.values()) == {1}


async def test_a_returning_handler_acks_each_message_once(broker: Harness) -> None:
    seen: Counter[bytes] = Counter()
    attempts: list[int] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    def handle(msg: Message) -> None:  # a sync handler: run in a thread
        seen[msg.body] += 1
        attempts.append(msg.attempts)

    await broker.publish(broker.topic, bodies(50))
    async with worker(broker, reg) as w:
        await broker.until(lambda: sum(seen.values()) == 50, 20, "50 handled")
        await broker.until(lambda: w.stats().tasks[handle.spec.name].finished == 50, 5, "acked")
        await broker.until_settled(broker.topic, CHANNEL, 50)  # by the broker's count
    # Nothing comes back: not to a worker on the same channel within three message
    # timeouts (nsqd and JetStream redeliver after one; a stream restarts a reader at
    # the offset it stored), and the broker's counts stay.
    async with worker(broker, reg):
        await broker.quiet()
    assert set(seen.values()) == {1} and set(attempts) == {1}
    await broker.until_settled(broker.topic, CHANNEL, 50)


async def test_retry_waits_its_delay_and_counts_an_attempt(broker: Harness) -> None:
    arrivals: list[tuple[int, float]] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        arrivals.append((msg.attempts, time.monotonic()))
        if msg.attempts == 1:
            raise Retry(delay=1.5, reason="not yet")

    await broker.publish(broker.topic, [b"once"])
    started = time.monotonic()
    async with worker(broker, reg):
        await broker.until(lambda: len(arrivals) == 2, 15, "the retry")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=1)
    assert [a for a, _ in arrivals] == [1, 2]
    waited = arrivals[1][1] - arrivals[0][1]
    if broker.virtual_time:
        assert time.monotonic() - started < 1.0  # the clock jumped over the delay
    else:
        assert waited >= 1.4, waited


async def test_after_max_attempts_a_message_is_dead_lettered_once(broker: Harness) -> None:
    hooked: list[tuple[bytes, str, int]] = []
    dead_topic = f"{broker.topic}.dead"
    dead = await broker.watch(dead_topic)
    calls: Counter[bytes] = Counter()
    reg = Registry()

    def on_dead(msg: Message, reason: str) -> None:
        hooked.append((msg.body, reason, msg.attempts))

    @reg.task(
        broker.topic, channel=CHANNEL, max_attempts=3, on_dead_letter=on_dead,
        dead_letter_topic=dead_topic,
    )  # fmt: skip
    async def handle(msg: Message) -> None:
        calls[msg.body] += 1
        raise RuntimeError("always")

    await broker.publish(broker.topic, [b"doomed"])
    async with worker(broker, reg):
        await broker.until(lambda: len(hooked) == 1 and len(dead()) == 1, 20, "the dead letter")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=2)  # nothing left
    assert calls[b"doomed"] == 3  # the handler ran max_attempts times, no more
    (body, reason, attempts) = hooked[0]
    assert body == b"doomed" and reason == "max attempts exceeded" and attempts == 3
    letter = json.loads(dead()[0])
    assert letter["body"] == "doomed" and letter["topic"] == broker.topic
    assert letter["channel"] == CHANNEL and letter["reason"] == "max attempts exceeded"


async def test_a_retried_messages_dead_letter_names_the_original(broker: Harness) -> None:
    """Issue 40, item 5: after a retry, the dead letter keeps the message's first id,
    publish time and (NATS, RabbitMQ Streams) stream and offset, never a retry copy's."""
    dead_topic = f"{broker.topic}.dead"
    dead = await broker.watch(dead_topic)
    first: list[tuple[str, int, tuple[str, int] | None]] = []
    later: list[str] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, max_attempts=5, dead_letter_topic=dead_topic)
    async def handle(msg: Message) -> None:
        if msg.attempts == 1:
            first.append((msg.id, msg.timestamp, msg.origin))
            raise Retry(delay=0.3, reason="later")
        later.append(msg.id)
        raise Reject("no")

    await broker.publish(broker.topic, [b"traced"])
    async with worker(broker, reg):
        await broker.until(lambda: len(dead()) == 1, 20, "the dead letter")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=1)
    (msg_id, timestamp, origin) = first[0]
    letter = json.loads(dead()[0])
    assert later == [msg_id]  # the retry is the same message, by its id
    assert letter["id"] == msg_id and letter["timestamp"] == timestamp, letter
    assert letter["attempts"] == 2 and letter["reason"] == "no"
    if broker.name in ("nats", "rabbitmq-stream"):
        assert origin is not None and "retry" not in origin[0], origin
        assert (letter["stream"], letter["offset"]) == origin, letter
    else:
        assert origin is None and "stream" not in letter and "offset" not in letter


async def test_the_last_failed_attempt_is_dead_lettered_then_without_a_retry_delay(
    broker: Harness,
) -> None:
    hooked: list[tuple[str, int]] = []
    reg = Registry()

    def on_dead(msg: Message, reason: str) -> None:
        hooked.append((reason, msg.attempts))

    @reg.task(broker.topic, channel=CHANNEL, max_attempts=2, on_dead_letter=on_dead)
    async def handle(msg: Message) -> None:
        # The last attempt asks for a minute's delay: a dead letter that waited for it
        # (and one more delivery) would come far past the deadline below.
        raise Retry(delay=0.1 if msg.attempts < 2 else 60.0, reason="down")

    await broker.publish(broker.topic, [b"once"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: bool(hooked), 20, "the dead letter")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=1)  # nothing left

        def counted() -> tuple[int, int]:
            stats = w.stats().tasks[handle.spec.name]
            return stats.requeued, stats.dead_lettered

        await broker.until(lambda: counted() == (1, 1), 5, "1 requeued, 1 dead-lettered")
    assert hooked == [("max attempts exceeded", 2)]  # with the attempts it had


async def test_reject_dead_letters_at_once_without_a_retry(broker: Harness) -> None:
    hooked: list[tuple[bytes, str, int]] = []
    calls = 0
    reg = Registry()

    def on_dead(msg: Message, reason: str) -> None:
        hooked.append((msg.body, reason, msg.attempts))

    @reg.task(broker.topic, channel=CHANNEL, max_attempts=5, on_dead_letter=on_dead)
    async def handle(msg: Message) -> None:
        nonlocal calls
        calls += 1
        raise Reject("malformed")

    await broker.publish(broker.topic, [b"bad"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: len(hooked) == 1, 10, "the dead letter")
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=0)  # no retry, none left

        def counted() -> tuple[int, int]:
            stats = w.stats().tasks[handle.spec.name]
            return stats.requeued, stats.dead_lettered

        await broker.until(lambda: counted() == (0, 1), 5, "0 requeued, 1 dead-lettered")
    assert hooked == [(b"bad", "malformed", 1)] and calls == 1


async def test_a_long_handler_is_kept_alive_and_delivered_once(broker: Harness) -> None:
    done: list[tuple[bytes, int, int]] = []
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        await asyncio.sleep(2.6)  # well past the one-second deadline
        done.append((msg.body, msg.attempts, msg.touch_count))

    @reg.task(f"{broker.topic}_sync", channel=CHANNEL)
    def handle_sync(msg: Message) -> None:
        time.sleep(2.6)
        done.append((msg.body, msg.attempts, msg.touch_count))

    await broker.publish(broker.topic, [b"long"])
    await broker.publish(f"{broker.topic}_sync", [b"long sync"])
    async with worker(broker, reg, **broker.deadline_settings()):
        await broker.until(lambda: len(done) == 2, 15, "both long handlers")
        # Settled once each, never timed out (nsqd's timeout_count, JetStream's
        # redeliveries): nothing is left to come back.
        await broker.until_settled(broker.topic, CHANNEL, 1, retried=0)
        await broker.until_settled(f"{broker.topic}_sync", CHANNEL, 1, retried=0)
    assert len(done) == 2, done
    assert all(attempts == 1 for _, attempts, _ in done), done
    if broker.capabilities.keep_alive:  # kept alive past the deadline, not redelivered
        assert all(touches >= 2 for _, _, touches in done), done
    else:  # no deadline to extend (a stream): nothing sent, and still delivered once
        assert all(touches == 0 for _, _, touches in done), done


async def test_a_drain_loses_nothing_and_a_new_worker_takes_the_rest(broker: Harness) -> None:
    """Each body handled exactly once across the two workers (what the first drained is
    not handled again), and the broker settled all 60."""
    seen: Counter[bytes] = Counter()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL, max_in_flight=5)
    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.05)
        seen[msg.body] += 1

    expected = bodies(60)
    await broker.publish(broker.topic, expected)
    async with worker(broker, reg, drain_timeout=2.0):
        await broker.until(lambda: len(seen) >= 10, 10, "some handled")
    first = len(seen)
    assert first < len(expected)  # stopped mid-way
    async with worker(broker, reg):
        await broker.until(lambda: len(seen) == len(expected), 30, "all handled")
        # Handed back by the drain (nsqd counts a REQ) is not a retry of the handler's.
        await broker.until_settled(broker.topic, CHANNEL, len(expected), retried=None)
    assert set(seen) == set(expected)
    assert {body: n for body, n in seen.items() if n != 1} == {}  # none handled twice


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK provider seen as the global one by nsqworker (for this test only)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exporter
    provider.shutdown()


async def test_one_process_span_per_delivery(broker: Harness, spans: InMemorySpanExporter) -> None:
    handled: list[str] = []
    lock = threading.Lock()
    reg = Registry()

    @reg.task(broker.topic, channel=CHANNEL)
    async def handle(msg: Message) -> None:
        with lock:
            handled.append(msg.id)
        if msg.body == b"fail" and msg.attempts == 1:
            raise RuntimeError("once")

    await broker.publish(broker.topic, [*bodies(4), b"fail"])
    async with worker(broker, reg) as w:
        await broker.until(lambda: len(handled) == 6, 15, "6 deliveries")
        await broker.until_settled(broker.topic, CHANNEL, 5, retried=1)
        caps = w.transport.capabilities
    process = [s for s in spans.get_finished_spans() if s.name == f"process {broker.topic}"]
    assert len(process) == 6
    attributes = [dict(s.attributes or {}) for s in process]
    assert {a["messaging.system"] for a in attributes} == {caps.system}
    assert {a["messaging.message.id"] for a in attributes} == set(handled)
    outcomes = Counter(a.get(f"{caps.attribute_prefix}.outcome") for a in attributes)
    assert outcomes == {"fin": 5, "req": 1}


async def test_one_send_span_per_publish_call_with_the_transports_system(
    broker: Harness, spans: InMemorySpanExporter
) -> None:
    """Producers report through the same seam on every broker: one PRODUCER span per
    call (one for a batch), ``messaging.system`` the transport's."""
    caps = broker.capabilities
    if broker.name == "memory":  # an in-process queue, no producer: nothing is sent
        await broker.publish(broker.topic, bodies(3))
        assert [s for s in spans.get_finished_spans() if s.name.startswith("send ")] == []
        return
    publisher = broker.publisher()  # type: ignore[attr-defined]  # a ClientHarness
    await publisher.publish(broker.topic, b"one")
    await publisher.publish_many(broker.topic, [b"a", b"b", b"c"])
    sent = [s for s in spans.get_finished_spans() if s.name == f"send {broker.topic}"]
    assert len(sent) == 2, [s.name for s in spans.get_finished_spans()]
    attributes = [dict(s.attributes or {}) for s in sent]
    assert {a["messaging.system"] for a in attributes} == {caps.system}
    assert [a.get("messaging.batch.message_count") for a in attributes] == [None, 3]
    assert all(a.get("server.address") for a in attributes)
    assert [s.kind for s in sent] == [SpanKind.PRODUCER, SpanKind.PRODUCER]
