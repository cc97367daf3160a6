"""Consumer backoff on RabbitMQ Streams with default settings (issue 43): four messages on
an always-failing task with ``max_attempts=2`` get all eight deliveries, then their dead
letters; before the backoff machine, 3 of 6 runs stopped after the first delivery with the
probe overdue by a minute. And a pause delivers the rest of the chunk in hand, as nsqd
delivers what it put on the wire before RDY 0, and asks the broker for nothing more."""

from __future__ import annotations

import time
import uuid

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.task import Registry
from nsqworker.testing import wait_until
from nsqworker.worker import Worker

pytestmark = pytest.mark.both_loops


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_always_failing_messages_get_every_attempt_with_default_backoff(
    rabbitmq: str, kind: str
) -> None:
    topic = f"backoff_{uuid.uuid4().hex[:8]}"
    deliveries: list[tuple[bytes, int, float]] = []
    dead: list[bytes] = []
    reg = Registry()

    def record(msg: Message) -> None:
        deliveries.append((msg.body, msg.attempts, time.monotonic()))
        raise RuntimeError("always")

    def on_dead(msg: Message, reason: str) -> None:
        dead.append(msg.body)

    options = {"channel": "c", "max_attempts": 2, "retry_delay": 0.2, "on_dead_letter": on_dead}
    if kind == "sync":

        @reg.task(topic, **options)
        def handle(msg: Message) -> None:
            record(msg)
    else:

        @reg.task(topic, **options)
        async def handle(msg: Message) -> None:
            record(msg)

    settings = Settings(
        transport="rabbitmq-stream",
        rabbitmq_stream_uri=rabbitmq,
        health_port=0,
        log_level="critical",
    )  # fmt: skip  (backoff at its defaults: 1 s x 2^level, up to 120 s)
    async with Worker(reg, settings) as worker:
        async with StreamProducer(settings=settings) as producer:
            await producer.publish_many(topic, [b"a", b"b", b"c", b"d"])
        # The four first attempts fail in one window (one pause), the retries one probe
        # each at worst: 2 + 4 + 8 + 16 s of pauses.
        await wait_until(lambda: len(dead) == 4, timeout=60, message=lambda: f"{deliveries}")
        stats = worker.stats().tasks[handle.spec.name]
    assert sorted((body, attempts) for body, attempts, _ in deliveries) == [
        (b, n) for b in (b"a", b"b", b"c", b"d") for n in (1, 2)
    ]
    assert stats.backoff_stalls == 0
