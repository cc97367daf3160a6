"""The console's backlog on RabbitMQ Streams against a real RabbitMQ: the messages after
the channel's stored offset (StreamStats, the last chunk's header, QueryOffset), its retry
streams included; a missing stream, a refused login and a silent server as notes."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any

import httpx
import pytest

from nsqworker.admin.console.backlog import Backlog, BacklogValue
from nsqworker.errors import NoConnection
from nsqworker.settings import Settings
from nsqworker.streams.lag import stream_lags
from nsqworker.streams.retries import retry_stream


def settings(uri: str) -> Settings:
    return Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri)


async def rstream_client(uri: str, kind: str) -> Any:
    import rstream

    from nsqworker.streams.client import Endpoint

    e = Endpoint.from_settings(settings(uri))
    client = getattr(rstream, kind)(host=e.host, port=e.port, vhost=e.vhost,
                                    username=e.username, password=e.password)  # fmt: skip
    await client.start()
    return client


async def measure(uri: str, *keys: tuple[str, str, str]) -> dict[Any, BacklogValue]:
    async with httpx.AsyncClient(trust_env=False) as http:
        return await Backlog(settings(uri), http).measure(list(keys))


async def test_the_backlog_is_the_messages_after_the_stored_offset(rabbitmq: str) -> None:
    from rstream import AMQPMessage

    topic = f"lag_{uuid.uuid4().hex[:8]}"
    producer = await rstream_client(rabbitmq, "Producer")
    consumer = await rstream_client(rabbitmq, "Consumer")
    try:
        await producer.create_stream(topic)
        for i in range(12):  # twelve chunks of one message
            await producer.send_wait(topic, AMQPMessage(body=b"m%d" % i))
        # then one chunk of eight: the end is read from the last chunk's header
        await producer.send_batch(topic, [AMQPMessage(body=b"b%d" % i) for i in range(8)])
        billing, audit = ("rabbitmq", topic, "billing"), ("rabbitmq", topic, "audit")

        async def lags() -> dict[Any, BacklogValue]:
            return await measure(rabbitmq, billing, audit)

        # nothing stored yet: the whole stream (the batch is confirmed asynchronously)
        await settles(lags, billing, 20)

        await consumer.store_offset(topic, "billing", 6)  # 0..6 handled
        await settles(lags, billing, 13)
        values = await lags()
        assert values[audit] == BacklogValue(20)  # another channel stored nothing

        # retries waiting in the channel's retry stream count, as NSQ's deferred do
        retries = retry_stream(topic, "billing")
        await producer.create_stream(retries)
        for i in range(3):
            await producer.send_wait(retries, AMQPMessage(body=b"r%d" % i))
        assert (await lags())[billing] == BacklogValue(16)

        # Five more after the store: 13 + 5 messages, and the chunk RabbitMQ wrote to
        # track the stored offset sits among them and is counted (the documented
        # approximation: one per offset store after the channel's own).
        for i in range(5):
            await producer.send_wait(topic, AMQPMessage(body=b"n%d" % i))
        values = await lags()
        assert values[billing] == BacklogValue(16 + 5 + 1)
        assert values[audit] == BacklogValue(25 + 1)

        await consumer.store_offset(topic, "billing", 25)  # everything handled
        await consumer.store_offset(retries, "billing", 2)
        await settles(lags, billing, 0)
    finally:
        await consumer.close()
        await producer.close()


async def settles(lags: Any, key: tuple[str, str, str], expected: int) -> None:
    """Wait for ``key``'s backlog to read ``expected`` (a stored offset and a published
    batch become visible a moment after the call returns)."""
    deadline = asyncio.get_running_loop().time() + 30
    while (seen := (await lags())[key]) != BacklogValue(expected):
        assert asyncio.get_running_loop().time() < deadline, f"{seen}, not {expected}"
        await asyncio.sleep(0.1)


async def test_a_worker_part_way_through_and_done(rabbitmq: str) -> None:
    """The offsets a Worker stores: six of ten handled, four held by a blocked handler
    (the stored offset never passes an unfinished message), then all of them: 0."""
    from nsqworker import Registry, Worker
    from nsqworker.message import Message
    from nsqworker.streams import StreamProducer

    stream, done, release = f"lag_{uuid.uuid4().hex[:8]}", [], asyncio.Event()
    registry = Registry()

    @registry.task(stream, channel="billing", max_in_flight=10)
    async def handle(msg: Message) -> None:
        if int(msg.body) >= 6:
            await release.wait()
        done.append(msg.body)

    worker_settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbitmq,
                               health_port=0, drain_timeout=5.0, log_level="warning")  # fmt: skip
    async with StreamProducer(settings=worker_settings) as producer:
        await producer.publish_many(stream, [str(i).encode() for i in range(10)])
    key = ("rabbitmq", stream, "billing")

    async def lags() -> dict[Any, BacklogValue]:
        return await measure(rabbitmq, key)

    async with Worker(registry, worker_settings):
        await settles(lags, key, 4)
        assert len(done) == 6
        release.set()
        await settles(lags, key, 0)
    assert len(done) == 10


async def test_a_missing_stream_and_a_refused_login_are_notes(rabbitmq: str) -> None:
    missing = ("rabbitmq", f"none_{uuid.uuid4().hex[:8]}", "billing")
    value = (await measure(rabbitmq, missing))[missing]
    assert value.count is None
    assert f"stream {missing[1]!r} does not exist" in value.note

    wrong = rabbitmq.replace("guest:guest@", "guest:s3cret-pw@")
    value = (await measure(wrong, missing))[missing]
    assert value.count is None
    assert "login refused: authentication failure" in value.note
    assert "user 'guest'" in value.note and "s3cret-pw" not in value.note


async def test_a_silent_server_is_a_timeout_not_a_hang() -> None:
    with socket.socket() as server:  # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        uri = f"rabbitmq-stream://guest:guest@127.0.0.1:{server.getsockname()[1]}/"
        with pytest.raises(NoConnection, match=r"no answer in 0\.5s"):
            await asyncio.wait_for(stream_lags(settings(uri), [("s", "c")], timeout=0.5), 10)


async def test_over_tls_with_the_settings_ca(rabbitmq: str, tmp_path: Any) -> None:
    """``rabbitmq-stream+tls``: TLS with ``tls_ca_file`` (a TLS front on loopback before
    the fixture's plain stream listener); a certificate not trusted is a note."""
    import ssl
    from urllib.parse import urlsplit

    import trustme

    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ssl)
    plain = urlsplit(rabbitmq)

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def pipe(a: asyncio.StreamReader, b: asyncio.StreamWriter) -> None:
            while data := await a.read(65536):
                b.write(data)
            b.close()

        up_reader, up_writer = await asyncio.open_connection(plain.hostname, plain.port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer),
                             return_exceptions=True)  # fmt: skip

    front = await asyncio.start_server(forward, "127.0.0.1", 0, ssl=server_ssl)
    port = front.sockets[0].getsockname()[1]
    uri = f"rabbitmq-stream+tls://guest:guest@127.0.0.1:{port}/"
    stream = f"lag_{uuid.uuid4().hex[:8]}"
    producer = await rstream_client(rabbitmq, "Producer")
    try:
        await producer.create_stream(stream)
        await producer.send_wait(stream, b"one")
        key = ("rabbitmq", stream, "billing")
        tls = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri, tls_ca_file=ca_file)
        async with httpx.AsyncClient(trust_env=False) as http:
            assert (await Backlog(tls, http).measure([key]))[key] == BacklogValue(1)
        untrusted = (await measure(uri, key))[key]  # the system CAs do not know ours
        assert untrusted.count is None and "CERTIFICATE_VERIFY_FAILED" in untrusted.note
    finally:
        await producer.close()
        front.close()
        await front.wait_closed()
