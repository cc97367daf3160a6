"""The NATS codec (nsqworker.nats.protocol) byte by byte, and the raw connection on it
(nsqworker.nats.wire) against a real nats-server: split reads, large headers, payloads
at the server's limit, garbage either way."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from nsqworker.errors import ConfigurationError, LocalProtocolError, RemoteProtocolError
from nsqworker.nats import protocol
from nsqworker.nats.protocol import Decoder, Err, Info, Msg
from nsqworker.nats.wire import Wire, open_wire
from nsqworker.settings import Settings
from nsqworker.testing import wait_until
from nsqworker.testing.nats import NatsServerProcess

STREAM = (
    b'INFO {"server_id":"x","max_payload":1048576,"headers":true}\r\n'
    b"PING\r\n"
    b"MSG a.b 1 5\r\nhello\r\n"
    b"MSG a.b 7 _INBOX.r 0\r\n\r\n"
    b"HMSG a.c 2 $JS.ACK.s.c.1.2.3.4.5 28 31\r\nNATS/1.0\r\nKey: v\r\nKey: w\r\n\r\nxyz\r\n"
    b"+OK\r\n"
    b"-ERR 'Permissions Violation for Subscription to \"x\"'\r\n"
    b"PONG\r\n"
)
EXPECTED: list[Any] = [
    Info({"server_id": "x", "max_payload": 1048576, "headers": True}),
    protocol.PING_EVENT,
    Msg(b"a.b", 1, b"", None, b"hello"),
    Msg(b"a.b", 7, b"_INBOX.r", None, b""),
    Msg(b"a.c", 2, b"$JS.ACK.s.c.1.2.3.4.5", b"NATS/1.0\r\nKey: v\r\nKey: w\r\n\r\n", b"xyz"),
    protocol.OK_EVENT,
    Err('Permissions Violation for Subscription to "x"'),
    protocol.PONG_EVENT,
]


def test_a_stream_decodes_the_same_however_it_is_split() -> None:
    assert Decoder().feed(STREAM) == EXPECTED
    one_by_one = Decoder()
    assert [e for i in range(len(STREAM)) for e in one_by_one.feed(STREAM[i : i + 1])] == EXPECTED
    rng = random.Random(7)
    for _ in range(200):
        decoder, events, pos = Decoder(), [], 0
        while pos < len(STREAM):
            step = rng.randint(1, 40)
            events += decoder.feed(STREAM[pos : pos + step])
            pos += step
        assert events == EXPECTED
        assert len(decoder) == 0


def test_headers_status_line_fields_and_a_large_block() -> None:
    assert protocol.parse_headers(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n\r\n") == (
        "408", "Request Timeout", {"Nats-Pending-Messages": "3"}
    )  # fmt: skip
    assert protocol.parse_headers(b"NATS/1.0 100\r\n\r\n") == ("100", "", {})
    big = "v" * 60_000
    block = b"NATS/1.0\r\ntraceparent: 00-1-2-01\r\nBig: " + big.encode() + b"\r\n\r\n"
    parsed = protocol.parse_headers(block)
    assert parsed.status is None and parsed.fields == {"traceparent": "00-1-2-01", "Big": big}
    with pytest.raises(RemoteProtocolError, match=r"NATS/1\.0"):
        protocol.parse_headers(b"HTTP/1.1 200 OK\r\n\r\n")
    with pytest.raises(RemoteProtocolError, match="colon"):
        protocol.parse_headers(b"NATS/1.0\r\nno colon here\r\n\r\n")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"HELLO world\r\n", "unknown operation"),
        (b"MSG a.b 1\r\n", "malformed MSG"),
        (b"MSG a.b x 5\r\nhello\r\n", "subscription id"),
        (b"MSG a.b 1 -5\r\nhello\r\n", "size"),
        (b"MSG a.b 1 99999999999\r\n", "size"),
        (b"MSG a.b 1 5\r\nhelloXX", "not followed by CRLF"),
        (b"HMSG a.b 1 40 10\r\n", "header size"),
        (b"HMSG a.b 1\r\n", "malformed HMSG"),
        (b"INFO {not json\r\n", "INFO is not JSON"),
        (b"INFO [1]\r\n", "not a JSON object"),
        (b"MSG " + b"a" * (protocol.MAX_CONTROL_LINE + 10), "without CRLF"),
    ],
)
def test_garbage_is_a_remote_protocol_error_naming_it(data: bytes, match: str) -> None:
    decoder = Decoder(max_message=1024 * 1024)
    with pytest.raises(RemoteProtocolError, match=match):
        decoder.feed(data)
    assert len(decoder) == 0  # nothing of a broken stream is kept


def test_a_payload_over_the_limit_is_refused_before_it_is_read() -> None:
    with pytest.raises(RemoteProtocolError, match="over the limit of 100"):
        Decoder(max_message=100).feed(b"MSG a 1 101\r\n")


def test_events_before_garbage_are_handed_on() -> None:
    seen: list[Any] = []
    decoder = Decoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed_into(
            b"PING\r\nMSG a 1 1\r\nx\r\nBOGUS\r\n", lambda *m: seen.append(m), seen.append
        )
    assert seen == [protocol.PING_EVENT, (b"a", 1, b"", None, b"x")]


def test_encoders_write_the_exact_bytes_and_refuse_bad_subjects() -> None:
    assert protocol.pub(b"a.b", b"hi") == b"PUB a.b 2\r\nhi\r\n"
    assert protocol.pub(b"a.b", b"", b"_INBOX.1") == b"PUB a.b _INBOX.1 0\r\n\r\n"
    assert protocol.sub(b"_INBOX.x", 3) == b"SUB _INBOX.x 3\r\n"
    assert protocol.unsub(3) == b"UNSUB 3\r\n"
    assert protocol.connect({"verbose": False}) == b'CONNECT {"verbose":false}\r\n'
    for bad in (b"", b"a b", b"a\r\nPUB x 1"):
        with pytest.raises(LocalProtocolError, match="without spaces"):
            protocol.pub(bad, b"x")
    with pytest.raises(LocalProtocolError, match="reply subject"):
        protocol.pub(b"a", b"x", b"r r")


# ---------------------------------------------------------------------------- a real server


async def opened(server: NatsServerProcess, seen: list[Msg], lost: list[Any], **over: Any) -> Wire:
    settings = Settings(transport="nats", nats_servers=[server.url], **over)
    return await open_wire(
        settings, f"127.0.0.1:{server.port}", scheme="nats", name="test",
        on_msg=lambda *m: seen.append(Msg(*m)), on_lost=lost.append,
    )  # fmt: skip


async def test_a_real_server_delivers_split_reads_large_headers_and_max_payloads(
    nats_server: NatsServerProcess,
) -> None:
    import nats

    seen: list[Msg] = []
    lost: list[Any] = []
    wire = await opened(nats_server, seen, lost)
    client = await nats.connect(nats_server.url)
    try:
        assert wire.info["max_payload"] == 1024 * 1024
        wire.send(protocol.sub(b"codec.>", 5))
        await wire.round_trip(5)
        big_header = "h" * 50_000
        near_max = bytes(range(256)) * 3840  # with the headers, just under max_payload
        bodies = [b"", b"x", near_max, b"\r\nMSG fake 5 3\r\nabc\r\n"]
        for i, body in enumerate(bodies):
            await client.publish(f"codec.{i}", body, reply=f"r.{i}", headers={"Big": big_header})
        for i in range(500):  # many small ones: reads end mid-message
            await client.publish("codec.many", b"%d" % i)
        await client.flush()
        await wait_until(lambda: len(seen) == len(bodies) + 500, 10, message=lambda: len(seen))
        for i, body in enumerate(bodies):
            msg = seen[i]
            assert (msg.subject, msg.sid, msg.reply, msg.payload) == (
                f"codec.{i}".encode(), 5, f"r.{i}".encode(), body
            )  # fmt: skip
            assert msg.headers is not None
            assert protocol.parse_headers(msg.headers).fields == {"Big": big_header}
        assert [m.payload for m in seen[len(bodies) :]] == [b"%d" % i for i in range(500)]
        assert not lost and wire.open
    finally:
        await client.close()
        wire.close()


async def test_garbage_we_send_makes_the_server_close_and_the_owner_hears_of_it(
    nats_server: NatsServerProcess,
) -> None:
    seen: list[Msg] = []
    lost: list[Any] = []
    wire = await opened(nats_server, seen, lost)
    wire.send(b"NOT A COMMAND\r\n")
    await wait_until(lambda: bool(lost), 10, message="the server kept the connection")
    assert not wire.open
    assert any("unknown protocol operation" in e.lower() for e in wire.errors), wire.errors


async def test_a_refused_login_is_a_configuration_error_without_the_password() -> None:
    with NatsServerProcess(extra_args=["--user", "app", "--pass", "right"]) as server:
        with pytest.raises(ConfigurationError, match="refused the login") as info:
            await opened(server, [], [], nats_user="app", nats_password="wrong")
        assert "wrong" not in str(info.value)
        wire = await opened(server, [], [], nats_user="app", nats_password="right")
        assert wire.open
        wire.close()
    with NatsServerProcess(extra_args=["--auth", "s3cret"]) as server:
        wire = await opened(server, [], [], nats_token="s3cret")
        await wire.round_trip(5)
        wire.close()


async def test_a_dead_server_is_no_connection(nats_server: NatsServerProcess) -> None:
    from nsqworker.errors import NoConnection

    port = nats_server.port
    nats_server.stop()
    settings = Settings(transport="nats", dial_timeout=2.0)
    with pytest.raises(NoConnection, match=f"127.0.0.1:{port}"):
        await open_wire(
            settings, f"127.0.0.1:{port}", scheme="nats", name="t",
            on_msg=lambda *m: None, on_lost=lambda e: None,
        )  # fmt: skip
    await asyncio.sleep(0)


async def test_headers_of_a_jetstream_message_reach_the_handler(
    nats_server: NatsServerProcess,
) -> None:
    """A message with headers takes the subscription's other path (HMSG): its fields
    reach ``Message.headers``, a large one whole, and it is acked once."""
    import uuid

    import nats

    from nsqworker.consumer import Consumer
    from nsqworker.message import FINISH, Message, Outcome

    topic = f"codec.{uuid.uuid4().hex[:8]}"
    seen: list[Message] = []

    def record(msg: Message) -> Outcome:
        seen.append(msg)
        return FINISH

    settings = Settings(transport="nats", nats_servers=[nats_server.url], health_port=0)
    consumer = Consumer(topic, "c", record, settings)
    await consumer.start()
    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()
        big = "b" * 20_000
        await js.publish(topic, b"with", headers={"traceparent": "00-ab-cd-01", "Big": big})
        await js.publish(topic, b"without")
        await wait_until(lambda: len(seen) == 2, 10, message=lambda: f"{seen}")
        assert seen[0].body == b"with" and seen[0].headers == {
            "traceparent": "00-ab-cd-01", "Big": big
        }  # fmt: skip
        assert seen[1].body == b"without" and not seen[1].headers
        assert seen[0].attempts == 1 and seen[0].id == "1"
        stream = topic.replace(".", "_")
        await wait_until(lambda: consumer.subscription.stats().in_flight == 0, 10, message="acked")
        for _ in range(100):
            info = await js.consumer_info(stream, "c")
            if info.ack_floor.stream_seq == 2:
                break
            await asyncio.sleep(0.1)
        assert info.ack_floor.stream_seq == 2 and info.num_redelivered == 0
    finally:
        await client.close()
        await consumer.stop(1)


async def test_a_task_consumes_over_tls(tmp_path: Any) -> None:
    """tls:// servers: nats-py and the task's own connection (TLS after INFO) both
    verify the server against tls_ca_file."""
    import uuid

    import trustme

    from nsqworker.consumer import Consumer
    from nsqworker.message import FINISH, Message, Outcome
    from nsqworker.nats import NatsProducer

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    args = ["--tls", "--tlscert", str(tmp_path / "cert.pem"), "--tlskey", str(tmp_path / "key.pem")]
    with NatsServerProcess(extra_args=args) as server:
        url = f"tls://127.0.0.1:{server.port}"
        settings = Settings(
            transport="nats", nats_servers=[url], tls_ca_file=tmp_path / "ca.pem", health_port=0
        )
        topic = f"tls.{uuid.uuid4().hex[:8]}"
        seen: list[bytes] = []

        def record(msg: Message) -> Outcome:
            seen.append(msg.body)
            return FINISH

        consumer = Consumer(topic, "c", record, settings)
        await consumer.start()
        try:
            async with NatsProducer(settings=settings) as producer:
                await producer.publish_many(topic, [b"a", b"b", b"c"])
            await wait_until(lambda: seen == [b"a", b"b", b"c"], 10, message=lambda: f"{seen}")
            assert consumer.subscription.stats().connected == 1
        finally:
            await consumer.stop(1)
