"""NATS JetStream against hostile input (issue 29), on a real nats-server: forged
messages on the pull inbox, and dead letters over the server's or the stream's limit."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from nsqworker.consumer import Consumer
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nats import NatsProducer
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject
from nsqworker.testing import wait_until
from nsqworker.testing.holds import holds_async
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.worker import Worker


def settings(*urls: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "transport": "nats",
        "nats_servers": list(urls),
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.5,
        "drain_timeout": 5.0,
        "health_port": 0,
        "log_level": "warning",
    }
    return Settings(**(values | overrides))


def subject() -> str:
    return f"hostile.{uuid.uuid4().hex[:8]}"


async def raw_client(url: str) -> Any:
    import nats

    return await nats.connect(url)


# ---------------------------------------------------------------------------- the pull inbox


async def test_forged_messages_on_the_pull_inbox_are_dropped(
    nats_server: NatsServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever knows the inbox's name could hand the worker messages (and have it ack
    what their reply names) or make it re-create its consumer: only messages whose reply
    is this consumer's ack subject, with numeric fields, reach the handler."""
    topic = subject()
    seen: list[bytes] = []

    def record(msg: Message) -> Outcome:
        seen.append(msg.body)
        return FINISH

    consumer = Consumer(topic, "c", record, settings(nats_server.url))
    await consumer.start()
    attacker = await raw_client(nats_server.url)
    try:
        async with NatsProducer(settings=settings(nats_server.url)) as producer:
            await producer.publish(topic, b"good 1")
            await wait_until(lambda: seen == [b"good 1"], 10, message=lambda: f"{seen}")
            sub: Any = consumer.subscription
            inbox, stream = sub.inbox, sub.stream
            # nats-server refuses a client's publish with a $JS.ACK reply; but anyone may
            # send a pull request of their own consumer with our inbox as its reply: the
            # server then delivers their messages to us, with their consumer's ack subject
            js = attacker.jetstream()
            evil = f"evil_{uuid.uuid4().hex[:6]}"
            await js.add_stream(name=evil, subjects=[f"{evil}.in"])
            await js.publish(f"{evil}.in", b"forged from another stream")
            await js.add_consumer(evil, durable_name="evil")
            await js.add_consumer(stream, durable_name="other", filter_subject=topic)
            for target in (f"{evil}.evil", f"{stream}.other"):
                await attacker.publish(f"$JS.API.CONSUMER.MSG.NEXT.{target}", b'{"batch":1}',
                                       reply=inbox)  # fmt: skip
            await attacker.publish(inbox, b"forged", reply="reply.somewhere.else")
            for status, text in (("409", "Consumer Deleted"), ("503", ""), ("999", "x")):
                await attacker.publish(inbox, b"", headers={"Status": status, "Description": text})
            await attacker.flush()
            await asyncio.sleep(0.5)
            await producer.publish(topic, b"good 2")
            await wait_until(lambda: len(seen) == 2, 10, message=lambda: f"{seen}")
            await asyncio.sleep(0.3)
        assert seen == [b"good 1", b"good 2"]
        assert sub.inbox == inbox  # a forged "consumer deleted" re-created nothing
        # good 1 again through "other", the evil message, the stray reply, status 999
        assert sub.connection.errors.get("forged") == 4
        dropped = [r for r in caplog.records if "dropped a message on the pull inbox" in r.message]
        assert len(dropped) == 1  # rate-limited: one line a minute
        assert not any("creating it again" in r.message for r in caplog.records)
    finally:
        await attacker.close()
        await consumer.stop(1)


async def test_a_consumer_really_deleted_is_created_again(nats_server: NatsServerProcess) -> None:
    topic = subject()
    seen: list[bytes] = []

    def record(msg: Message) -> Outcome:
        seen.append(msg.body)
        return FINISH

    consumer = Consumer(topic, "c", record, settings(nats_server.url))
    await consumer.start()
    admin = await raw_client(nats_server.url)
    try:
        async with NatsProducer(settings=settings(nats_server.url)) as producer:
            await producer.publish(topic, b"before")
            await wait_until(lambda: seen == [b"before"], 10, message=lambda: f"{seen}")
            sub: Any = consumer.subscription
            await admin.jetstream().delete_consumer(sub.stream, sub.consumer)
            await wait_until(lambda: sub.ready, 10, message="bound again")
            await asyncio.sleep(0.5)
            await producer.publish(topic, b"after")
            await wait_until(lambda: b"after" in seen, 15, message=lambda: f"{seen}")
    finally:
        await admin.close()
        await consumer.stop(1)


# ---------------------------------------------------------------------------- dead letters


async def test_a_dead_letter_over_max_payload_is_cut_to_fit(
    nats_server_binary: str, tmp_path: Path
) -> None:
    """A server with max_payload 64 KiB: the copy of a 60,000-byte body of control
    bytes (360 KB escaped, 80 KB in base64) is cut to 64 KiB, not sent without its body."""
    config = tmp_path / "nats.conf"
    config.write_text("max_payload: 65536\n")
    with NatsServerProcess(binary=nats_server_binary, extra_args=["-c", str(config)]) as server:
        topic, dead = subject(), subject()
        body = b"\x01" * 60_000
        reg = Registry()

        @reg.task(topic, channel="c", dead_letter_topic=dead)
        async def handle(msg: Message) -> None:
            raise Reject("no")

        async with NatsProducer(settings=settings(server.url)) as producer:
            await producer.publish(dead, b"first")  # the dead-letter stream, seq 1
            await producer.publish(topic, body)
            size = getattr(producer, "max_message_size", None)
        client = await raw_client(server.url)
        try:
            js = client.jetstream()
            stream = await js.find_stream_name_by_subject(dead)
            async with Worker(reg, settings(server.url)):
                for _ in range(100):
                    info = await js.stream_info(stream)
                    if info.state.messages == 2:
                        break
                    await asyncio.sleep(0.1)
            letter = (await js.get_msg(stream, 2)).data
        finally:
            await client.close()
    assert letter is not None and len(letter) <= 65536
    copy = json.loads(letter)
    assert copy["body_truncated"] is True and copy["body_size"] == len(body)
    assert copy["body_sha256"] == hashlib.sha256(body).hexdigest()
    kept = base64.b64decode(copy["body"])
    assert len(kept) > 40_000 and body.startswith(kept)
    assert size == 65536  # the producer says what the server takes


async def test_a_dead_letter_refused_by_the_streams_max_msg_size_is_sent_without_body(
    nats_server: NatsServerProcess,
) -> None:
    """JetStream refuses a copy over the stream's max_msg_size (error 10054): it is sent
    once more without its body, never requeued in a loop."""
    from nats.js.api import StreamConfig

    topic, dead = subject(), subject()
    client = await raw_client(nats_server.url)
    js = client.jetstream()
    stream = f"dead_{uuid.uuid4().hex[:8]}"
    await js.add_stream(StreamConfig(name=stream, subjects=[dead], max_msg_size=2048))
    calls = 0
    reg = Registry()

    @reg.task(topic, channel="c", dead_letter_topic=dead, max_attempts=1)
    async def handle(msg: Message) -> None:
        nonlocal calls
        calls += 1
        raise Reject("no")

    try:
        async with NatsProducer(settings=settings(nats_server.url)) as producer:
            await producer.publish(topic, b"b" * 4000)
        async with Worker(reg, settings(nats_server.url)):
            for _ in range(100):
                if (await js.stream_info(stream)).state.messages >= 1:
                    break
                await asyncio.sleep(0.1)
            # a requeue loop would call the handler again
            await holds_async(lambda: calls == 1, 1.5, "the handler called again")
        assert (await js.stream_info(stream)).state.messages == 1
        copy = json.loads((await js.get_msg(stream, 1)).data or b"")
    finally:
        await client.close()
    assert calls == 1
    assert copy["body"] == "" and copy["body_truncated"] is True
    assert copy["body_size"] == 4000 and copy["reason"] == "no"


# ---------------------------------------------------------------------------- discovery


@pytest.mark.parametrize(
    ("credentials", "discovers"),
    [
        ({}, True),
        ({"nats_user": "u", "nats_password": "p"}, False),
        ({"nats_token": "t"}, False),
    ],
)
async def test_announced_servers_get_no_plain_text_password(
    nats_cluster: Any, credentials: dict[str, str], discovers: bool
) -> None:
    """A cluster member announces the others in INFO connect_urls; nats-py would log in
    to them with the same password. Without TLS, a worker with a password or token
    dials only the servers of its settings (the cluster here takes any login)."""
    from nsqworker.nats.client import NatsConnection

    first = nats_cluster.urls[0]
    connection = NatsConnection(settings(first, **credentials))
    try:
        client = await connection.get()
        await asyncio.sleep(0.5)  # INFO updates as the routes settle
        announced = {u.netloc for u in client.discovered_servers}
        pool = {u.netloc for u in client.servers}
    finally:
        await connection.close()
    others = {u.partition("://")[2] for u in nats_cluster.urls[1:]}
    if discovers:
        assert others <= announced
    else:
        assert announced == set() and pool == {first.partition("://")[2]}
    assert connection.discovery is discovers
