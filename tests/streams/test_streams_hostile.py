"""RabbitMQ Streams against hostile publishers (issue 29), on a real RabbitMQ 4.0:
malformed AMQP in a chunk, forged ``x-attempts`` and ``x-not-before``, and dead letters
that must fit the frame."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
import uuid
from typing import Any

import pytest

from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.streams.client import ENVELOPE, FRAME_MAX, Endpoint, stream_arguments
from nsqworker.streams.subscription import retry_stream
from nsqworker.task import Registry, Reject
from nsqworker.testing import wait_until
from nsqworker.worker import Worker


def settings(uri: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "rabbitmq-stream",
        "rabbitmq_stream_uri": uri,
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "log_level": "warning",
        "health_port": 0,
    }
    return Settings(**(values | overrides))


def topic() -> str:
    return f"hostile_{uuid.uuid4().hex[:8]}"


async def raw_send(uri: str, stream: str, batch: list[Any]) -> None:
    """Publish ``batch`` (AMQPMessage or raw bytes, sent as is) in one frame with
    rstream, as another client would, and wait until all are confirmed."""
    from rstream import Producer as RProducer

    e = Endpoint.from_settings(settings(uri))
    producer = RProducer(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                         password=e.password)  # fmt: skip
    await producer.start()
    confirmed: list[bool] = []
    try:
        await producer.create_stream(stream, stream_arguments(settings(uri)), exists_ok=True)
        await producer.send_batch(
            stream, batch, on_publish_confirm=lambda s: confirmed.append(s.is_confirmed)
        )
        await wait_until(lambda: len(confirmed) == len(batch), 10, message="confirmations")
    finally:
        await producer.close()
    assert all(confirmed)


async def watch(uri: str, stream: str) -> tuple[Consumer, list[bytes]]:
    seen: list[bytes] = []

    def record(msg: Message) -> Outcome:
        seen.append(msg.body)
        return FINISH

    consumer = Consumer(stream, "watch", record, settings(uri))
    await consumer.start()
    return consumer, seen


async def test_garbage_in_a_chunk_is_dead_lettered_and_the_rest_are_handled(
    rabbitmq: str,
) -> None:
    """rstream decodes a chunk in one loop: a decoder that raised dropped the rest of
    the chunk while the stored offset moved past it. Every good message is handled, each
    bad one dead-lettered with its raw bytes, nothing lost."""
    from rstream import AMQPMessage

    stream, dead = topic(), topic()
    good = [f"good {i}".encode() for i in range(8)]
    garbage = [b"\xff\xff", b"\x00Su\xb0\x00", b"\x00Sw\xa1"]  # not AMQP; cut short; a value
    batch: list[Any] = [AMQPMessage(body=b) for b in good[:3]]
    batch += [garbage[0], AMQPMessage(body=good[3]), garbage[1]]
    batch += [AMQPMessage(body=b) for b in good[4:]] + [garbage[2]]
    await raw_send(rabbitmq, stream, batch)

    handled: list[bytes] = []
    hooked: list[tuple[bytes, str]] = []
    reg = Registry()

    @reg.task(stream, channel="c", dead_letter_topic=dead,
              on_dead_letter=lambda m, r: hooked.append((m.body, r)))  # fmt: skip
    async def handle(msg: Message) -> None:
        handled.append(msg.body)

    watcher, letters = await watch(rabbitmq, dead)
    try:
        async with Worker(reg, settings(rabbitmq)):
            await wait_until(lambda: len(handled) == 8 and len(letters) == 3, 20,
                             message=lambda: f"{handled} {letters}")  # fmt: skip
            await asyncio.sleep(0.3)
    finally:
        await watcher.stop(0)
    assert handled == good
    assert [body for body, _ in hooked] == garbage
    assert all("not an AMQP 1.0 message" in r or "not data" in r for _, r in hooked), hooked
    copies = [json.loads(letter) for letter in letters]
    assert [base64.b64decode(c["body"]) if c.get("body_encoding") == "base64"
            else c["body"].encode() for c in copies] == garbage  # fmt: skip
    assert all(c["topic"] == stream and c["attempts"] == 1 for c in copies)


async def test_x_attempts_on_the_topics_own_stream_is_not_trusted(rabbitmq: str) -> None:
    """Attempts are 1 on the topic's stream: a publisher's x-attempts=99 would have
    dead-lettered the message unhandled."""
    from rstream import AMQPMessage

    stream = topic()
    forged = AMQPMessage(body=b"forged", application_properties={"x-attempts": 99})
    await raw_send(rabbitmq, stream, [forged])
    seen: list[tuple[bytes, int]] = []
    reg = Registry()

    @reg.task(stream, channel="c", max_attempts=3)
    async def handle(msg: Message) -> None:
        seen.append((msg.body, msg.attempts))

    async with Worker(reg, settings(rabbitmq)):
        await wait_until(lambda: len(seen) == 1, 15, message="the forged message handled")
    assert seen == [(b"forged", 1)]


async def test_a_far_x_not_before_on_the_retry_stream_is_clamped(
    rabbitmq: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One writer to the retry stream with a not-before in 10 years held every retry
    of the channel behind it for ever; the wait is bounded (here cut to 1 s), and the
    retries behind it are read ahead, not held back."""
    from rstream import AMQPMessage

    import nsqworker.streams.held as held

    monkeypatch.setattr(held, "MAX_NOT_BEFORE", 1.0)
    stream = topic()
    now_ms = int(time.time() * 1000)
    far = AMQPMessage(body=b"far", application_properties={
        "x-attempts": 2, "x-not-before": now_ms + 10 * 365 * 86400 * 1000})  # fmt: skip
    due = AMQPMessage(body=b"due", application_properties={
        "x-attempts": -5, "x-not-before": now_ms})  # fmt: skip
    await raw_send(rabbitmq, retry_stream(stream, "c"), [far, due])
    seen: list[tuple[bytes, int]] = []
    reg = Registry()

    @reg.task(stream, channel="c")
    async def handle(msg: Message) -> None:
        seen.append((msg.body, msg.attempts))

    started = time.monotonic()
    async with Worker(reg, settings(rabbitmq)):
        await wait_until(lambda: len(seen) == 2, 15, message=lambda: f"{seen}")
    assert seen == [(b"due", 1), (b"far", 2)]  # attempts below 1 read as 1
    assert time.monotonic() - started >= 0.9


async def test_a_dead_letter_just_over_the_frame_is_cut_to_fit(rabbitmq: str) -> None:
    """The dead-letter copy of a body that fits a frame is larger than one: it is cut
    to the frame (with its size and digest), not sent without its body."""
    stream, dead = topic(), topic()
    limit = FRAME_MAX - ENVELOPE
    body = b"a" * (limit - 100)
    async with StreamProducer(settings=settings(rabbitmq)) as producer:
        await producer.publish(stream, body)
    reg = Registry()

    @reg.task(stream, channel="c", dead_letter_topic=dead)
    async def handle(msg: Message) -> None:
        raise Reject("no")

    watcher, letters = await watch(rabbitmq, dead)
    try:
        async with Worker(reg, settings(rabbitmq)):
            await wait_until(lambda: len(letters) == 1, 20, message="the dead letter")
    finally:
        await watcher.stop(0)
    copy = json.loads(letters[0])
    assert len(letters[0]) <= limit
    assert copy["body_truncated"] is True and copy["body_size"] == len(body)
    assert copy["body_sha256"] == hashlib.sha256(body).hexdigest()
    kept = base64.b64decode(copy["body"])
    assert len(kept) > limit // 2 and body.startswith(kept)
    assert producer.max_message_size == limit


async def test_sub_entry_batches_plain_and_gzip_are_read_each_at_its_offset(
    rabbitmq: str,
) -> None:
    """Another client's sub-entry batches (several messages in one entry, uncompressed
    or gzip, the Java client's ``subEntrySize``) between plain messages: every message
    is handled once, in order, each with its own offset as its id; one that is not AMQP
    inside a batch is dead-lettered and the rest of its batch handled."""
    from rstream import AMQPMessage, CompressionType
    from rstream import Producer as RProducer

    stream = topic()
    e = Endpoint.from_settings(settings(rabbitmq))
    producer = RProducer(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                         password=e.password)  # fmt: skip
    await producer.start()
    try:
        await producer.create_stream(stream, stream_arguments(settings(rabbitmq)), exists_ok=True)
        await producer.send_wait(stream, AMQPMessage(body=b"plain 0"))
        batch: list[Any] = [AMQPMessage(body=f"batch {i}".encode()) for i in range(3)]
        await producer.send_sub_entry(stream, batch, CompressionType.No)
        zipped: list[Any] = [
            AMQPMessage(body=b"gzip 0"),
            b"\xffnot amqp",
            AMQPMessage(body=b"gzip 2"),
        ]
        await producer.send_sub_entry(stream, zipped, CompressionType.Gzip)
        await producer.send_wait(stream, AMQPMessage(body=b"plain 1"))
    finally:
        await producer.close()
    handled: list[tuple[str, bytes]] = []
    hooked: list[tuple[str, bytes]] = []
    reg = Registry()

    @reg.task(stream, channel="c", on_dead_letter=lambda m, r: hooked.append((m.id, m.body)))
    async def handle(msg: Message) -> None:
        handled.append((msg.id, msg.body))

    async with Worker(reg, settings(rabbitmq)):
        await wait_until(lambda: len(handled) == 7 and len(hooked) == 1, 20,
                         message=lambda: f"{handled} {hooked}")  # fmt: skip
    at = {body: int(mid.rpartition(":")[2]) for mid, body in handled}
    assert sorted(at.values()) == [at[body] for _, body in handled]  # in offset order
    assert set(at) == {b"plain 0", b"plain 1", b"batch 0", b"batch 1", b"batch 2", b"gzip 0",
                       b"gzip 2"}  # fmt: skip
    assert [at[b"batch 1"], at[b"batch 2"]] == [at[b"batch 0"] + 1, at[b"batch 0"] + 2]
    assert at[b"gzip 2"] == at[b"gzip 0"] + 2
    assert hooked == [(f"{stream}:{at[b'gzip 0'] + 1}", b"\xffnot amqp")]
    assert sorted([*at.values(), at[b"gzip 0"] + 1]) == list(range(8))
