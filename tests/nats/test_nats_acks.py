"""JetStream publish acknowledgements (nsqworker.nats.acks) against a real nats-server:
each outcome reaches its own publish at once (stored, refused, no stream), one that never
comes is a TimeoutError after the publish's timeout, and closing the producer ends the
publishes still waiting instead of leaving them to time out."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from nsqworker.errors import NoConnection, PublishError
from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings
from nsqworker.testing.nats import NatsServerProcess


def settings(url: str) -> Settings:
    return Settings(transport="nats", nats_servers=[url], health_port=0, log_level="warning")


def subject() -> str:
    return f"acks.{uuid.uuid4().hex[:8]}"


async def raw_client(url: str) -> Any:
    import nats

    return await nats.connect(url)


async def test_a_refusal_and_a_stream_named_error_each_get_their_own_answer_at_once(
    nats_server: NatsServerProcess,
) -> None:
    from nats.js.api import StreamConfig

    small, named = subject(), subject()
    client = await raw_client(nats_server.url)
    js = client.jetstream()
    await js.add_stream(StreamConfig(name=f"s_{uuid.uuid4().hex[:8]}", subjects=[small],
                                     max_msg_size=1024))  # fmt: skip
    await js.add_stream(StreamConfig(name="error", subjects=[named]))  # '"error"' in its acks
    try:
        async with NatsProducer(settings=settings(nats_server.url), timeout=10) as producer:
            started = time.monotonic()
            with pytest.raises(PublishError) as refused:
                await producer.publish(small, b"x" * 2000)
            assert time.monotonic() - started < 2, "the refusal waited for the timeout"
            assert refused.value.code == "JETSTREAM_10054"
            await producer.publish(named, b"stored")
            # pipelined: the refused ones fail, the rest are stored, the note counts them
            bodies = [b"y" * (2000 if i % 100 == 7 else 10) for i in range(1000)]
            with pytest.raises(PublishError) as many:
                await producer.publish_many(small, bodies)
            assert "10 of 1000 messages were not stored" in str(many.value.__notes__)
        assert (await js.stream_info("error")).state.messages == 1
    finally:
        await js.delete_stream("error")
        await client.close()
    assert (await _messages(nats_server.url, small)) == 990


async def test_no_answer_is_a_timeout_and_close_ends_the_waiting_publishes(
    nats_server: NatsServerProcess,
) -> None:
    """A core subscriber on the subject and no stream: the server hands the message to it,
    and nobody acknowledges."""
    silent = subject()
    client = await raw_client(nats_server.url)
    await client.subscribe(silent)
    try:
        producer = NatsProducer(settings=settings(nats_server.url), timeout=30)
        await producer.connect()
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="no acknowledgement"):
            await producer.publish(silent, b"x", timeout=0.3)
        # uvloop's timers count whole milliseconds of a cached clock: one can fire a
        # fraction of a millisecond before the time.monotonic() deadline
        assert 0.29 <= time.monotonic() - started < 2
        waiting = [asyncio.create_task(producer.publish(silent, b"x")) for _ in range(50)]
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await producer.close()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert time.monotonic() - started < 5
        assert all(isinstance(r, NoConnection) for r in results), results[:3]
    finally:
        await client.close()


async def _messages(url: str, subject: str) -> int:
    client = await raw_client(url)
    try:
        js = client.jetstream()
        name = await js.find_stream_name_by_subject(subject)
        return int((await js.stream_info(name)).state.messages)
    finally:
        await client.close()


async def test_messages_read_while_close_lets_the_wire_go_are_handled_not_a_crash(
    nats_server: NatsServerProcess,
) -> None:
    """close() without stop() lets the subscription's wire go, then waits for a round trip
    on it; messages of the pull that arrive meanwhile are still handed to the receiver and
    their acks kept (close() logs them as not sent), never an error in the read path that
    tears the connection down. The backlog is large so that reads do arrive then."""
    from nsqworker.message import Message
    from nsqworker.nats.client import NatsConnection
    from nsqworker.nats.subscription import NatsSubscription

    topic, config = subject(), settings(nats_server.url)
    async with NatsProducer(settings=config) as producer:
        for _ in range(6):
            await producer.publish_many(topic, [b"x" * 1000] * 1000)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    connection = NatsConnection(config)
    sub = NatsSubscription(topic, "c", connection, config, name="t/c", max_in_flight=6000)
    closing = False
    during_close: list[Message] = []

    async def close_now() -> None:
        nonlocal closing
        closing = True
        await sub.close()

    closed: list[asyncio.Task[None]] = []

    class Receiver:
        def deliver(self, msg: Message) -> bool:
            if closing:
                during_close.append(msg)
            elif not closed:
                closed.append(asyncio.ensure_future(close_now()))
            return True

    try:
        await sub.start(Receiver())  # type: ignore[arg-type]
        for _ in range(200):
            if closed and closed[0].done():
                break
            await asyncio.sleep(0.05)
        assert closed and closed[0].done(), "close() did not finish"
        closed[0].result()
    finally:
        loop.set_exception_handler(None)
        await connection.close()
    assert [c.get("message") for c in errors] == []
    assert during_close, "no read arrived while close() waited: the case was not exercised"
    assert all(m.body == b"x" * 1000 for m in during_close)
