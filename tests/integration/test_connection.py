"""nsqworker.nsq.connection against a real nsqd v1.3.0, and against misbehaving peers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import struct
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import snappy
import trustme

from nsqworker.errors import (
    AuthError,
    ConfigurationError,
    ConnectionClosed,
    NSQDError,
    PublishError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.connection import Connection, ConnectionConfig, ServerInfo
from nsqworker.nsq.handshake import forget_adapted
from nsqworker.nsq.protocol import MessageFrame, Response, encode_frame
from nsqworker.testing import NsqdFactory, NsqdProcess
from tests.json_server import json_server

pytestmark = pytest.mark.integration


class Recorder:
    """Collects what a connection reports through its callbacks."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[MessageFrame] = asyncio.Queue()
        self.errors: list[NSQDError] = []
        self.closed: list[ConnectionClosed] = []

    def connection(self, address: str, config: ConnectionConfig | None = None) -> Connection:
        return Connection(
            address,
            config or ConnectionConfig(),
            on_message=lambda *fields: self.messages.put_nowait(MessageFrame(*fields)),
            on_error=lambda _, error: self.errors.append(error),
            on_close=lambda _, reason: self.closed.append(reason),
        )


@contextlib.asynccontextmanager
async def connected(
    address: str, config: ConnectionConfig | None = None, recorder: Recorder | None = None
) -> AsyncIterator[Connection]:
    conn = (recorder or Recorder()).connection(address, config)
    await conn.connect()
    try:
        yield conn
    finally:
        await conn.close(timeout=2.0)


async def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll a blocking check (nsqd's HTTP stats) off the loop until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = await asyncio.to_thread(check)
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)


def client_stats(nsqd: NsqdProcess, topic: str, channel: str) -> dict[str, Any] | None:
    stats = nsqd.channel_stats(topic, channel)
    clients = (stats or {}).get("clients") or []
    return dict(clients[0]) if clients else None


def finished(nsqd: NsqdProcess, topic: str, channel: str, count: int) -> dict[str, Any] | None:
    """The channel's stats once our client finished ``count`` and nothing is left."""
    stats = nsqd.channel_stats(topic, channel) or {}
    clients = stats.get("clients") or [{}]
    done = clients[0].get("finish_count") == count
    return stats if done and stats["depth"] == 0 and stats["in_flight_count"] == 0 else None


# --- negotiation -------------------------------------------------------------------------


async def test_identify_answer(nsqd: NsqdProcess) -> None:
    config = ConnectionConfig(msg_timeout=42.0, client_id="worker-7", hostname="w7.example")
    conn = Recorder().connection(nsqd.tcp_address, config)
    assert not conn.connected and not conn.closed
    server = await conn.connect()
    try:
        assert conn.connected and conn.server is server
        assert server.max_rdy_count == 2500
        assert server.msg_timeout == 42.0
        assert server.max_msg_timeout == 900.0
        assert server.version == "1.3.0"
        assert not (server.tls_v1 or server.deflate or server.snappy or server.auth_required)
        await conn.subscribe("negotiate", "c")
        client = await eventually(lambda: client_stats(nsqd, "negotiate", "c"))
        assert client["client_id"] == "worker-7"
        assert client["hostname"] == "w7.example"
        assert client["user_agent"].startswith("nsqworker/")
    finally:
        await conn.close()
    assert conn.closed and not conn.connected


async def test_pub_sub_round_trip(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    async with (
        connected(nsqd.tcp_address, recorder=recorder) as sub,
        connected(nsqd.tcp_address) as pub,
    ):
        await sub.subscribe("clicks", "archive")
        assert sub.subscribed
        sub.rdy(1)
        assert await pub.request(protocol.pub("clicks", b"hello")) == protocol.OK
        frame = await asyncio.wait_for(recorder.messages.get(), 5)
        assert frame.body == b"hello" and frame.attempts == 1 and len(frame.id) == 16
        assert sub.messages_received == 1 and sub.last_message_at > 0
        sub.fin(frame.id)
        stats = await eventually(lambda: finished(nsqd, "clicks", "archive", 1))
        assert stats["message_count"] == 1
    assert recorder.errors == []


async def test_mpub_dpub_and_req_touch(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    async with connected(nsqd.tcp_address, recorder=recorder) as conn:
        await conn.subscribe("batch", "c")
        assert await conn.request(protocol.mpub("batch", [b"a", b"b", b"c"])) == protocol.OK
        assert await conn.request(protocol.dpub("batch", 60_000, b"later")) == protocol.OK
        conn.rdy(3)
        frames = [await asyncio.wait_for(recorder.messages.get(), 5) for _ in range(3)]
        assert sorted(f.body for f in frames) == [b"a", b"b", b"c"]
        conn.touch(frames[0].id)
        conn.fin(frames[0].id)
        conn.req(frames[1].id, 0)
        conn.fin(frames[2].id)
        again = await asyncio.wait_for(recorder.messages.get(), 5)
        assert again.id == frames[1].id and again.attempts == 2
        conn.fin(again.id)
        stats = await eventually(lambda: finished(nsqd, "batch", "c", 3))
        assert stats["requeue_count"] == 1 and stats["deferred_count"] == 1
    assert recorder.errors == []


async def test_concurrent_requests_are_answered_in_order(nsqd: NsqdProcess) -> None:
    async with connected(nsqd.tcp_address) as conn:
        answers = await asyncio.gather(
            *(conn.request(protocol.pub("many", b"%d" % i)) for i in range(200))
        )
        assert answers == [protocol.OK] * 200
        with pytest.raises(PublishError) as info:
            await conn.request(b"PUB bad!topic\n" + struct.pack(">I", 1) + b"x")
    assert info.value.code == "E_BAD_TOPIC" and info.value.fatal


async def test_heartbeats_are_answered(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    config = ConnectionConfig(heartbeat_interval=1.0)
    async with connected(nsqd.tcp_address, config, recorder) as conn:
        before = conn.bytes_received
        # nsqd drops a client that stays silent for 2 heartbeats; we only answer NOPs.
        await asyncio.sleep(3.5)
        assert conn.connected and conn.bytes_received >= before + 3 * 19
        assert await conn.request(protocol.pub("alive", b"x")) == protocol.OK
    assert recorder.closed[0].error is None


# --- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_files(ca: trustme.CA, tmp_path: Path) -> SimpleNamespace:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = SimpleNamespace(
        ca=tmp_path / "ca.pem", cert=tmp_path / "cert.pem", key=tmp_path / "key.pem"
    )
    ca.cert_pem.write_to_path(str(files.ca))
    cert.private_key_pem.write_to_path(str(files.key))
    for blob in cert.cert_chain_pems:
        blob.write_to_path(str(files.cert), append=True)
    return files


@pytest.fixture
def tls_nsqd(nsqd_factory: NsqdFactory, tls_files: SimpleNamespace) -> NsqdProcess:
    # tcp-https: TLS is required on TCP while the fixture's plain-HTTP /ping still works.
    return nsqd_factory(
        extra_args=[
            f"--tls-cert={tls_files.cert}",
            f"--tls-key={tls_files.key}",
            "--tls-required=tcp-https",
        ]
    )


@pytest.mark.parametrize("compression", ["none", "deflate", "snappy"])
async def test_tls(tls_nsqd: NsqdProcess, tls_files: SimpleNamespace, compression: str) -> None:
    settings = SimpleNamespace(tls_v1=True, tls_ca_file=tls_files.ca, compression=compression)
    config = ConnectionConfig.from_settings(settings)
    recorder = Recorder()
    async with connected(tls_nsqd.tcp_address, config, recorder) as conn:
        assert conn.server.tls_v1
        await conn.subscribe("secure", "c")
        conn.rdy(1)
        assert await conn.request(protocol.pub("secure", b"s" * 5000)) == protocol.OK
        frame = await asyncio.wait_for(recorder.messages.get(), 5)
        assert frame.body == b"s" * 5000
        conn.fin(frame.id)
        client = await eventually(lambda: client_stats(tls_nsqd, "secure", "c"))
        assert client["tls"] is True
        assert client["deflate"] is (compression == "deflate")
        assert client["snappy"] is (compression == "snappy")


@pytest.mark.parametrize("compression", ["none", "deflate", "snappy"])
def test_tls_under_uvloop(tls_nsqd: NsqdProcess, ca: trustme.CA, compression: str) -> None:
    # uvloop's transports are not asyncio.Transport subclasses and its start_tls differs.
    import uvloop  # the dev extras install it

    async def round_trip() -> bytes:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        config = ConnectionConfig(tls_v1=True, ssl_context=context, compression=compression)
        recorder = Recorder()
        async with connected(tls_nsqd.tcp_address, config, recorder) as conn:
            await conn.subscribe("uv", "c")
            conn.rdy(1)
            assert await conn.request(protocol.pub("uv", b"fast")) == protocol.OK
            frame = await asyncio.wait_for(recorder.messages.get(), 5)
            conn.fin(frame.id)
            return frame.body

    assert uvloop.run(round_trip()) == b"fast"


async def test_tls_server_name(tls_nsqd: NsqdProcess, ca: trustme.CA) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    config = ConnectionConfig(tls_v1=True, ssl_context=context, tls_server_name="localhost")
    async with connected(tls_nsqd.tcp_address, config) as conn:
        assert await conn.request(protocol.pub("named", b"x")) == protocol.OK


async def test_tls_untrusted_certificate(tls_nsqd: NsqdProcess) -> None:
    context = ssl.create_default_context()
    trustme.CA().configure_trust(context)  # some other CA
    conn = Recorder().connection(
        tls_nsqd.tcp_address, ConnectionConfig(tls_v1=True, ssl_context=context)
    )
    with pytest.raises(ConnectionClosed, match="certificate verify failed") as info:
        await conn.connect()
    assert tls_nsqd.tcp_address in str(info.value)
    assert isinstance(info.value.__cause__, ssl.SSLError)
    assert conn.closed
    await asyncio.wait_for(conn.wait_closed(), 1)


async def test_tls_verify_off(tls_nsqd: NsqdProcess) -> None:
    config = ConnectionConfig.from_settings(SimpleNamespace(tls_v1=True, tls_verify=False))
    async with connected(tls_nsqd.tcp_address, config) as conn:
        assert await conn.request(protocol.pub("unverified", b"x")) == protocol.OK


async def test_plain_client_is_refused_when_tls_is_required(tls_nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    conn = recorder.connection(tls_nsqd.tcp_address)
    await conn.connect()
    with pytest.raises(NSQDError, match="TLS required") as info:
        await conn.subscribe("secure", "c")
    assert info.value.code == "E_INVALID"
    await asyncio.wait_for(conn.wait_closed(), 2)
    assert recorder.closed[0].error is info.value


async def test_tls_asked_of_a_plain_nsqd(nsqd: NsqdProcess) -> None:
    conn = Recorder().connection(nsqd.tcp_address, ConnectionConfig(tls_v1=True))
    with pytest.raises(ConnectionClosed, match="does not offer it"):
        await conn.connect()


# --- compression -----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["deflate", "snappy"])
async def test_compression_round_trip(nsqd: NsqdProcess, compression: str) -> None:
    recorder = Recorder()
    config = ConnectionConfig(compression=compression, deflate_level=9)
    async with connected(nsqd.tcp_address, config, recorder) as conn:
        assert getattr(conn.server, compression)
        if compression == "deflate":
            assert conn.server.deflate_level == 6  # nsqd's --max-deflate-level
        await conn.subscribe("squeezed", "c")
        bodies = [b"%d:" % i + b"x" * (i * 997 % 70_000 + 1) for i in range(100)]
        assert await conn.request(protocol.mpub("squeezed", bodies)) == protocol.OK
        conn.rdy(100)
        got = [await asyncio.wait_for(recorder.messages.get(), 5) for _ in range(100)]
        assert sorted(f.body for f in got) == sorted(bodies)
        for frame in got:
            conn.fin(frame.id)
        await eventually(lambda: finished(nsqd, "squeezed", "c", 100))
        client = client_stats(nsqd, "squeezed", "c")
        assert client is not None and client[compression] is True


# --- AUTH -------------------------------------------------------------------------------------


@dataclass
class AuthServer:
    """nsqd's auth protocol: GET /auth?remote_ip=&tls=&secret=&common_name=; each
    query kept in ``calls``."""

    address: str = ""
    calls: list[dict[str, list[str]]] = field(default_factory=list)

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        self.calls.append(query)
        secret = query.get("secret", [""])[0]
        if path != "/auth" or secret not in ("good", "empty"):
            return 403, "denied"
        allowed = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
        return 200, {
            "ttl": 3600,
            "identity": "alice",
            "identity_url": "https://example.invalid/alice",
            "authorizations": allowed if secret == "good" else [],
        }


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    server = AuthServer()
    with json_server(server.answer) as address:
        server.address = address
        yield server


@pytest.fixture
def auth_nsqd(nsqd_factory: NsqdFactory, auth_server: AuthServer) -> NsqdProcess:
    return nsqd_factory(extra_args=[f"--auth-http-address={auth_server.address}"])


async def test_auth_granted(auth_nsqd: NsqdProcess, auth_server: AuthServer) -> None:
    config = ConnectionConfig(auth_secret="good")
    async with connected(auth_nsqd.tcp_address, config) as conn:
        assert conn.server.auth_required
        assert conn.server.auth_identity == "alice"
        assert conn.server.auth_identity_url == "https://example.invalid/alice"
        assert conn.server.auth_permission_count == 1
        assert await conn.request(protocol.pub("guarded", b"x")) == protocol.OK
    call = auth_server.calls[0]
    assert call["secret"] == ["good"] and call["tls"] == ["false"]


@pytest.mark.parametrize(
    ("secret", "code"), [("wrong", "E_AUTH_FAILED"), ("empty", "E_UNAUTHORIZED")]
)
async def test_auth_refused(auth_nsqd: NsqdProcess, secret: str, code: str) -> None:
    conn = Recorder().connection(auth_nsqd.tcp_address, ConnectionConfig(auth_secret=secret))
    with pytest.raises(AuthError) as info:
        await conn.connect()
    assert info.value.code == code and info.value.fatal
    assert conn.closed


async def test_auth_without_secret(auth_nsqd: NsqdProcess, auth_server: AuthServer) -> None:
    conn = Recorder().connection(auth_nsqd.tcp_address)
    with pytest.raises(AuthError, match="NSQWORKER_AUTH_SECRET"):
        await conn.connect()
    assert auth_server.calls == []


async def test_secret_without_auth_warns(
    nsqd: NsqdProcess, caplog: pytest.LogCaptureFixture
) -> None:
    forget_adapted()
    async with connected(nsqd.tcp_address, ConnectionConfig(auth_secret="unused")) as conn:
        assert not conn.server.auth_required
    async with connected(nsqd.tcp_address, ConnectionConfig(auth_secret="unused")):
        pass
    warnings = [r for r in caplog.records if "does not require AUTH" in r.getMessage()]
    assert len(warnings) == 1


# --- errors and close -------------------------------------------------------------------------


async def test_fatal_error_carries_nsqds_code(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    conn = recorder.connection(nsqd.tcp_address)
    await conn.connect()
    with pytest.raises(PublishError) as info:
        await conn.request(b"PUB bad!topic\n" + struct.pack(">I", 1) + b"x")
    assert info.value.code == "E_BAD_TOPIC"
    await asyncio.wait_for(conn.wait_closed(), 2)
    assert conn.closed and not conn.connected
    assert len(recorder.closed) == 1 and recorder.closed[0].error is info.value
    with pytest.raises(ConnectionClosed) as closed:
        await conn.request(protocol.pub("t", b"x"))
    assert closed.value.error is info.value
    with pytest.raises(ConnectionClosed):
        conn.fin(b"0" * 16)
    await conn.close()


async def test_non_fatal_error_goes_to_on_error(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    async with connected(nsqd.tcp_address, recorder=recorder) as conn:
        await conn.subscribe("t", "c")
        conn.fin(b"0000000000000000")
        conn.touch(b"0000000000000000")
        # The answers after the errors still match their requests.
        assert await conn.request(protocol.pub("t", b"x")) == protocol.OK
        await asyncio.sleep(0.05)
        assert [e.code for e in recorder.errors] == ["E_FIN_FAILED", "E_TOUCH_FAILED"]
        assert not any(e.fatal for e in recorder.errors)
        assert conn.connected


async def test_cls_answers_close_wait(nsqd: NsqdProcess) -> None:
    async with connected(nsqd.tcp_address) as conn:
        await conn.subscribe("t", "c")
        assert await conn.request(protocol.cls()) == protocol.CLOSE_WAIT


async def test_close_sends_cls_and_is_idempotent(nsqd: NsqdProcess) -> None:
    recorder = Recorder()
    conn = recorder.connection(nsqd.tcp_address)
    await conn.connect()
    await conn.subscribe("t", "c")
    answers: list[bytes] = []
    request = conn.request

    async def spy(command: bytes, timeout: float | None = None) -> bytes:
        answer = await request(command, timeout)
        answers.append(answer)
        return answer

    conn.request = spy  # type: ignore[method-assign]
    await asyncio.gather(conn.close(), conn.close())
    await conn.close()
    assert answers == [protocol.CLOSE_WAIT]
    assert conn.closed and len(recorder.closed) == 1
    assert "closed" in recorder.closed[0].reason and recorder.closed[0].error is None
    await asyncio.wait_for(conn.wait_closed(), 1)


async def test_close_returns_once_nsqd_read_the_answers_sent_after_cls(
    nsqd: NsqdProcess,
) -> None:
    """Messages that come in the same read as CLOSE_WAIT are answered after CLS: close()
    returns only once nsqd read those answers (our end of the stream follows them, and
    nsqd closes after reading it), so none is left in flight there to time out."""
    nsqd.mpublish("t", [b"m%d" % i for i in range(2500)])
    recorder = Recorder()
    conn = recorder.connection(nsqd.tcp_address)
    await conn.connect()
    await conn.subscribe("t", "c")
    conn.rdy(2500)
    held = [await asyncio.wait_for(recorder.messages.get(), 10) for _ in range(2500)]
    closing = asyncio.ensure_future(conn.close(timeout=5))
    await asyncio.sleep(0)  # CLS is queued
    for msg in held:
        conn.req(msg.id, 0)  # written after CLS, read by nsqd after CLOSE_WAIT
    await closing
    stats = nsqd.channel_stats("t", "c") or {}
    assert (stats.get("in_flight_count"), stats.get("requeue_count")) == (0, 2500)


async def test_close_in_every_state(nsqd: NsqdProcess) -> None:
    never = Recorder().connection(nsqd.tcp_address)
    await never.close()
    await never.close()
    assert never.closed
    await asyncio.wait_for(never.wait_closed(), 1)
    with pytest.raises(ConnectionClosed):
        await never.request(protocol.pub("t", b"x"))

    connecting = Recorder().connection(nsqd.tcp_address)
    task = asyncio.create_task(connecting.connect())
    await asyncio.sleep(0)
    await connecting.close(timeout=2)
    with pytest.raises(ConnectionClosed):
        await task
    assert connecting.closed

    aborted = Recorder().connection(nsqd.tcp_address)
    await aborted.connect()
    aborted.abort()
    await asyncio.wait_for(aborted.wait_closed(), 1)
    await aborted.close()


async def test_connect_refused() -> None:
    with socket_port() as port:
        pass  # closed again: nothing listens there now
    conn = Recorder().connection(f"127.0.0.1:{port}")
    with pytest.raises(ConnectionClosed, match=f"127.0.0.1:{port}") as info:
        await conn.connect()
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(Exception, match="already called"):
        await conn.connect()


@contextlib.contextmanager
def socket_port() -> Iterator[int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# --- misbehaving peers (a plain TCP server, not a broker fake) --------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def peer(handler: Handler) -> AsyncIterator[str]:
    tasks: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        # Handlers end when the client hangs up; cancel only what is still stuck.
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=1)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)


async def read_identify(reader: asyncio.StreamReader) -> dict[str, Any]:
    assert await reader.readexactly(4) == protocol.MAGIC_V2
    assert await reader.readline() == b"IDENTIFY\n"
    (size,) = struct.unpack(">I", await reader.readexactly(4))
    body: dict[str, Any] = json.loads(await reader.readexactly(size))
    return body


def ok() -> bytes:
    return encode_frame(Response(protocol.OK))


async def test_identify_body() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_identify(reader))
        writer.write(ok())  # an nsqd without feature negotiation
        await reader.read()

    config = ConnectionConfig(
        client_id="c1",
        hostname="h1",
        output_buffer_size=2048,
        output_buffer_timeout=0.05,
        sample_rate=10,
        heartbeat_interval=12.5,
        msg_timeout=None,
    )
    async with peer(handler) as address, connected(address, config) as conn:
        assert conn.server == ServerInfo()
    assert seen == [
        {
            "client_id": "c1",
            "hostname": "h1",
            "user_agent": config.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": 12500,
            "output_buffer_size": 2048,
            "output_buffer_timeout": 50,
            "sample_rate": 10,
            "tls_v1": False,
            "deflate": False,
            "deflate_level": 6,
            "snappy": False,
        }
    ]
    assert config.user_agent.startswith("nsqworker/")
    # Without buffering (-1) nsqd ignores the timeout: it is not sent, so an nsqd with a
    # lower --max-output-buffer-timeout has nothing to refuse.
    unbuffered = ConnectionConfig(output_buffer_size=-1, output_buffer_timeout=0.25)
    assert "output_buffer_timeout" not in unbuffered.identify_body()
    assert "msg_timeout" not in unbuffered.identify_body()  # nsqd's --msg-timeout applies


@pytest.mark.parametrize(
    "answer",
    [b"garbage!" * 4, struct.pack(">iI", 2**30, 0), struct.pack(">iI", 6, 7) + b"OK"],
)
async def test_garbage_during_negotiation(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(answer)
        await reader.read()

    async with peer(handler) as address:
        conn = Recorder().connection(address, ConnectionConfig(dial_timeout=2))
        with pytest.raises(ConnectionClosed, match="garbage"):
            await conn.connect()


async def test_garbage_after_negotiation_fails_pending_requests() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(ok())
        await reader.readline()  # the PUB line
        writer.write(b"\x00\x00\x00\x08\x00\x00\x00\x09junk")
        await reader.read()

    recorder = Recorder()
    async with peer(handler) as address:
        conn = recorder.connection(address)
        await conn.connect()
        with pytest.raises(ConnectionClosed, match="garbage"):
            await asyncio.wait_for(conn.request(protocol.pub("t", b"x")), 2)
        await asyncio.wait_for(conn.wait_closed(), 1)
    assert "garbage" in recorder.closed[0].reason


@pytest.mark.parametrize("behaviour", ["silent", "hang up"])
async def test_peer_that_does_not_answer(behaviour: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        if behaviour == "silent":
            await reader.read()

    async with peer(handler) as address:
        conn = Recorder().connection(address, ConnectionConfig(dial_timeout=0.3))
        with pytest.raises(ConnectionClosed, match=address):
            await asyncio.wait_for(conn.connect(), 2)
        assert conn.closed


async def test_liveness_closes_a_silent_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(ok())
        await reader.read()

    recorder = Recorder()
    async with peer(handler) as address:
        conn = recorder.connection(address, ConnectionConfig(heartbeat_interval=0.2))
        await conn.connect()
        started = time.monotonic()
        await asyncio.wait_for(conn.wait_closed(), 2)
        assert 0.35 < time.monotonic() - started < 1.0
    assert "no data or heartbeat" in recorder.closed[0].reason


async def test_heartbeat_during_negotiation_and_streaming() -> None:
    nops: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(encode_frame(Response(protocol.HEARTBEAT)) + ok())
        nops.append(await reader.readline())
        writer.write(encode_frame(Response(protocol.HEARTBEAT)))
        nops.append(await reader.readline())
        await reader.read()

    async with peer(handler) as address, connected(address) as conn:
        for _ in range(100):
            if len(nops) == 2:
                break
            await asyncio.sleep(0.01)
        assert conn.connected
    assert nops == [b"NOP\n", b"NOP\n"]


async def test_timed_out_request_keeps_its_slot() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(ok())
        for _ in range(2):
            await reader.readline()
            await reader.readexactly(5)
        await asyncio.sleep(0.2)
        writer.write(encode_frame(Response(b"first")) + encode_frame(Response(b"second")))
        await reader.read()

    async with peer(handler) as address, connected(address) as conn:
        first = asyncio.create_task(conn.request(protocol.pub("t", b"1"), timeout=0.05))
        second = asyncio.create_task(conn.request(protocol.pub("t", b"2")))
        with pytest.raises(TimeoutError):
            await first
        assert await asyncio.wait_for(second, 2) == b"second"


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A peer that negotiates, then reads everything and answers nothing."""
    await read_identify(reader)
    writer.write(ok())
    await reader.read()


async def timed(awaitable: Awaitable[Any]) -> tuple[BaseException | None, float]:
    """What ``awaitable`` raised (or None), and how long it took."""
    started = time.monotonic()
    try:
        await awaitable
    except BaseException as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


async def test_requests_to_a_silent_peer_time_out_on_time() -> None:
    async with peer(silent) as address, connected(address) as conn:
        results = await asyncio.gather(
            *(timed(conn.request(protocol.pub("t", b"%d" % i), timeout=0.2)) for i in range(100))
        )
        for error, elapsed in results:
            assert isinstance(error, TimeoutError)
            assert 0.18 < elapsed < 0.6
        # later requests, with a shorter timeout than those before them, too
        first = asyncio.ensure_future(timed(conn.request(protocol.pub("t", b"a"), timeout=5)))
        await asyncio.sleep(0.05)
        error, elapsed = await timed(conn.request(protocol.pub("t", b"b"), timeout=0.1))
        assert isinstance(error, TimeoutError) and 0.09 < elapsed < 0.5
        assert not first.done()
        assert conn.connected
        await conn.close()
        error, _ = await first
        assert isinstance(error, ConnectionClosed)
        assert not conn.requests.deadlines and not conn.requests.deadlines.armed


async def test_short_timeout_after_a_long_one_was_answered() -> None:
    """The sweep, armed for an answered request due in 5 s, is re-armed earlier."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(ok())
        await reader.readline()
        await reader.readexactly(5)
        writer.write(ok())  # the first request only
        await reader.read()

    async with peer(handler) as address, connected(address) as conn:
        assert await conn.request(protocol.pub("t", b"1"), timeout=5) == protocol.OK
        error, elapsed = await timed(conn.request(protocol.pub("t", b"2"), timeout=0.1))
        assert isinstance(error, TimeoutError) and elapsed < 0.5


async def test_answers_clear_the_deadlines_and_cancelled_requests_keep_their_slot(
    nsqd: NsqdProcess,
) -> None:
    async with connected(nsqd.tcp_address) as conn:
        answers = await asyncio.gather(
            *(conn.request(protocol.pub("t", b"%d" % i), timeout=5) for i in range(500))
        )
        assert answers == [protocol.OK] * 500
        assert not conn.requests.deadlines  # nothing kept for the sweep once answered
        cancelled = conn.submit(protocol.pub("t", b"x"), timeout=5)
        cancelled.cancel()
        mixed = [conn.submit(protocol.pub("t", b"y"), timeout=t) for t in (5, None, 0.5, 5)]
        assert await asyncio.gather(*mixed) == [protocol.OK] * 4
        assert not conn.requests.deadlines and not conn.requests


@pytest.mark.parametrize("compression", ["deflate", "snappy"])
async def test_compressed_ok_in_the_same_segment(compression: str) -> None:
    """nsqd may send the compressed OK right behind the plain IDENTIFY answer."""
    received: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        answer = {"max_rdy_count": 100, "msg_timeout": 5000, compression: True}
        if compression == "deflate":
            compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
            squeeze = lambda b: compressor.compress(b) + compressor.flush(zlib.Z_SYNC_FLUSH)  # noqa: E731
            decompress = zlib.decompressobj(-15).decompress
        else:
            squeeze = snappy.StreamCompressor().add_chunk
            decompress = snappy.StreamDecompressor().decompress
        writer.write(encode_frame(Response(json.dumps(answer).encode())) + squeeze(ok()))
        writer.write(squeeze(encode_frame(Response(b"ANSWER"))[:5]))
        received.append(decompress(await reader.read(1000)))
        writer.write(squeeze(encode_frame(Response(b"ANSWER"))[5:]))
        await reader.read()

    config = ConnectionConfig(compression=compression)
    async with peer(handler) as address, connected(address, config) as conn:
        assert conn.server.max_rdy_count == 100 and conn.server.msg_timeout == 5.0
        assert await asyncio.wait_for(conn.request(b"NOP\n"), 2) == b"ANSWER"
    assert received == [b"NOP\n"]


def test_config_from_settings(tmp_path: Path) -> None:
    secret = SimpleNamespace(get_secret_value=lambda: "s3")
    settings = SimpleNamespace(
        heartbeat_interval=10.0,
        msg_timeout=120.0,
        output_buffer_size=-1,
        output_buffer_timeout=0.1,
        sample_rate=5,
        client_id="cid",
        hostname="host",
        compression="deflate",
        deflate_level=3,
        dial_timeout=1.5,
        auth_secret=secret,
        tls_v1=False,
        tls_ca_file=None,
    )
    config = ConnectionConfig.from_settings(settings)
    assert (config.heartbeat_interval, config.msg_timeout) == (10.0, 120.0)
    assert (config.output_buffer_size, config.output_buffer_timeout) == (-1, 0.1)
    assert (config.sample_rate, config.client_id, config.hostname) == (5, "cid", "host")
    assert (config.compression, config.deflate_level, config.dial_timeout) == ("deflate", 3, 1.5)
    assert config.auth_secret == "s3" and "s3" not in repr(config)
    assert config.ssl_context is None
    defaults = ConnectionConfig.from_settings(object())
    assert defaults == ConnectionConfig(client_id=defaults.client_id, hostname=defaults.hostname)
    with pytest.raises(ConfigurationError, match="tls_ca_file"):
        ConnectionConfig.from_settings(
            SimpleNamespace(tls_v1=True, tls_ca_file=tmp_path / "missing.pem")
        )
    with pytest.raises(ConfigurationError, match="compression"):
        ConnectionConfig(compression="zstd")


def test_server_info_from_identify() -> None:
    assert ServerInfo.from_identify(b"OK") == ServerInfo()
    info = ServerInfo.from_identify(
        b'{"max_rdy_count":10,"version":"1.3.0","max_msg_timeout":60000,"msg_timeout":2000,'
        b'"output_buffer_timeout":25,"future_field":1}'
    )
    assert (info.max_rdy_count, info.max_msg_timeout, info.msg_timeout) == (10, 60.0, 2.0)
    assert info.output_buffer_timeout == 0.025
