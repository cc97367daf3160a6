"""RPC over NSQ against real nsqd: endpoints run in a Worker, clients call them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
import structlog

from nsqworker.errors import ConnectionClosed, NoConnection
from nsqworker.message import Message
from nsqworker.rpc import RpcClient, RpcError, RpcTimeout, SyncRpcClient, codec, rpc
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_until
from nsqworker.worker import Worker

TOPIC = "pricing"


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


def settings_for(*nsqds: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [n.tcp_address for n in nsqds],
        "retry_delay": 0.05,
        "backoff_multiplier": 0.0,
        "reconnect_delay": 0.05,
        "max_reconnect_delay": 0.5,
        "drain_timeout": 5.0,
        "dial_timeout": 2.0,
    }
    values.update(overrides)
    return Settings(**values)


def pricing(registry: Registry, **options: Any) -> None:
    """The endpoint most tests call: prices a sku, fails on sku "bad"."""

    @rpc(TOPIC, registry=registry, **options)
    async def quote(request: Any) -> Any:
        if isinstance(request, bytes):
            return request[::-1]
        if request.get("sku") == "bad":
            raise LookupError(f"no sku {request['sku']!r}")
        return {"sku": request["sku"], "price": 42, "echo": request.get("echo")}


def topic_names(nsqd: NsqdProcess) -> list[str]:
    return [t["topic_name"] for t in nsqd.stats()["topics"]]


# --- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "value", "expected"),
    [
        ("json", {"sku": "A1", "echo": "é"}, {"sku": "A1", "price": 42, "echo": "é"}),
        (
            "msgpack",
            {"sku": "A1", "echo": b"\x00\xff"},
            {"sku": "A1", "price": 42, "echo": b"\x00\xff"},
        ),
        ("binary", b"\x00abc\xff", b"\xffcba\x00"),
    ],
)
async def test_round_trip_per_encoding(
    nsqd: NsqdProcess, encoding: str, value: Any, expected: Any
) -> None:
    registry = Registry()
    pricing(registry)
    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        assert await client.call(TOPIC, value, encoding=encoding, timeout=10) == expected
        assert (client.calls, client.fallbacks, client.late_replies) == (1, 0, 0)


async def test_thousands_of_concurrent_calls_on_one_client(nsqd: NsqdProcess) -> None:
    registry = Registry()
    pricing(registry, max_in_flight=500)
    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        calls = [client.call(TOPIC, {"sku": f"s{i}", "echo": i}, timeout=30) for i in range(3000)]
        answers = await asyncio.gather(*calls)
        assert [a["echo"] for a in answers] == list(range(3000))
        assert [a["sku"] for a in answers] == [f"s{i}" for i in range(3000)]
        assert client.pending == 0


async def test_calls_before_start_share_one_start(nsqd: NsqdProcess) -> None:
    registry = Registry()
    pricing(registry)
    client = RpcClient([nsqd.tcp_address], settings=settings_for(nsqd))
    async with Worker(registry, settings_for(nsqd)):
        try:
            answers = await asyncio.gather(
                *(client.call(TOPIC, {"sku": "A1", "echo": n}, timeout=10) for n in range(50))
            )
            assert [a["echo"] for a in answers] == list(range(50))
            assert len([t for t in topic_names(nsqd) if t.startswith("rpc_")]) == 1
        finally:
            await client.close()


async def test_sync_client_from_threads(nsqd: NsqdProcess) -> None:
    registry = Registry()
    pricing(registry)
    results: dict[int, Any] = {}

    def caller(client: SyncRpcClient, n: int) -> None:
        results[n] = client.call(TOPIC, {"sku": "A1", "echo": n}, timeout=10)

    async with Worker(registry, settings_for(nsqd)):
        client = await asyncio.to_thread(
            SyncRpcClient, [nsqd.tcp_address], settings=settings_for(nsqd)
        )
        threads = [threading.Thread(target=caller, args=(client, n)) for n in range(8)]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join(20) for t in threads])
        await asyncio.to_thread(client.close)
        with pytest.raises(ConnectionClosed):
            client.call(TOPIC, {})
    assert {n: r["echo"] for n, r in results.items()} == {n: n for n in range(8)}


# --- failures -------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_an_endpoint_exception_is_raised_as_rpc_error(
    nsqd: NsqdProcess, encoding: str
) -> None:
    registry = Registry()
    pricing(registry)
    async with (
        Worker(registry, settings_for(nsqd, rpc_error_details=True)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd), encoding=encoding) as client,
    ):
        with pytest.raises(RpcError) as info:
            await client.call(TOPIC, {"sku": "bad"}, timeout=10)
        assert (info.value.type, info.value.message) == ("LookupError", "no sku 'bad'")
        assert info.value.topic == TOPIC
        # The request was answered, so it is finished, not retried.
        await wait_until(lambda: nsqd.depth(TOPIC, "rpc") == 0, message="depth 0")
        assert await client.call(TOPIC, {"sku": "ok"}, timeout=10) == {
            "sku": "ok", "price": 42, "echo": None,
        }  # fmt: skip


async def test_binary_request_gets_its_error_as_json(nsqd: NsqdProcess) -> None:
    registry = Registry()

    @rpc("upper", registry=registry)
    def upper(request: bytes) -> bytes:  # a plain function runs in a thread
        return request.decode("ascii").upper().encode()

    async with (
        Worker(registry, settings_for(nsqd, rpc_error_details=True)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd), encoding="binary") as client,
    ):
        assert await client.call("upper", b"abc", timeout=10) == b"ABC"
        with pytest.raises(RpcError, match="UnicodeDecodeError from 'upper': 'ascii' codec"):
            await client.call("upper", "é".encode(), timeout=10)


async def test_timeout_then_the_late_reply_is_dropped_and_counted(nsqd: NsqdProcess) -> None:
    registry = Registry()

    @rpc("slow", registry=registry)
    async def slow(request: dict[str, Any]) -> str:
        await asyncio.sleep(request["sleep"])
        return "done"

    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        started = time.monotonic()
        with pytest.raises(RpcTimeout, match=r"no response from 'slow' within 0\.2s"):
            await client.call("slow", {"sleep": 0.6}, timeout=0.2)
        # uvloop's clock counts whole milliseconds, so its timer may fire a fraction of
        # one early against time.monotonic(); a busy machine may be slow to wake
        assert 0.199 <= time.monotonic() - started < 2.0
        assert (client.timeouts, client.pending) == (1, 0)
        await wait_until(lambda: client.late_replies == 1, message="the late reply")
        assert await client.call("slow", {"sleep": 0}, timeout=10) == "done"


async def test_no_endpoint_is_a_timeout(nsqd: NsqdProcess) -> None:
    async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
        with pytest.raises(RpcTimeout):
            await client.call("nobody_home", {}, timeout=0.2)


async def test_unsupported_encoding_gets_255_and_is_resent_as_json(nsqd: NsqdProcess) -> None:
    registry = Registry()
    pricing(registry, encodings=["json"])
    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        answer = await client.call(TOPIC, {"sku": "A1"}, encoding="msgpack", timeout=10)
        assert answer == {"sku": "A1", "price": 42, "echo": None}
        assert client.fallbacks == 1
        # A binary value cannot become JSON: a clear error instead of a resend.
        with pytest.raises(RpcError, match="lacks binary and the value cannot be sent as JSON"):
            await client.call(TOPIC, b"raw", encoding="binary", timeout=10)


@pytest.mark.parametrize("encoding", [codec.MSGPACK, 2, codec.RESERVED, codec.UNSUPPORTED])
async def test_the_255_reply_on_the_wire(nsqd: NsqdProcess, encoding: int) -> None:
    """An endpoint lacking an encoding (msgpack here, an unknown one, the reserved 254,
    even 255) answers the seed's 18 bytes, vsn, id, 0xff, so the caller falls back at
    once instead of timing out."""
    registry = Registry()
    pricing(registry, encodings=["json"])
    request = (
        codec.ReplyAddress("127.0.0.1", nsqd.tcp_port, "rpc_raw_replies").request(
            b"I" * 16, encoding, b"\x80"
        )
        if encoding < codec.RESERVED
        else (
            codec.encode_request(
                b"I" * 16, codec.JSON, "127.0.0.1", nsqd.tcp_port, "rpc_raw_replies", b"{}"
            )
        )
    )
    if encoding >= codec.RESERVED:  # no client builds these: patch the encoding byte
        request = request[:17] + bytes([encoding]) + request[18:]
    async with Worker(registry, settings_for(nsqd)):
        nsqd.publish(TOPIC, request)
        got = await read_messages(nsqd, "rpc_raw_replies", 1)
    assert got == [b"\x00" + b"I" * 16 + b"\xff"]


async def test_undecodable_requests_are_dead_lettered(nsqd: NsqdProcess) -> None:
    registry = Registry()
    letters: list[tuple[bytes, str]] = []

    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append((msg.body, reason))

    pricing(registry, on_dead_letter=on_dead_letter)
    bad_json = codec.encode_request(
        b"J" * 16, codec.JSON, "127.0.0.1", nsqd.tcp_port, "rpc_r", b"{"
    )
    async with Worker(registry, settings_for(nsqd)):
        nsqd.publish(TOPIC, b"\x00 not a request")
        nsqd.publish(TOPIC, b"\x01" + b"x" * 40)
        nsqd.publish(TOPIC, bad_json)
        await wait_until(lambda: len(letters) == 3, message="three dead letters")
        await wait_until(lambda: nsqd.depth(TOPIC, "rpc") == 0, message="depth 0")
    reasons = {body: reason for body, reason in letters}
    assert "15 bytes, shorter than its 24-byte header" in reasons[b"\x00 not a request"]
    assert "version 1; this side speaks version 0" in reasons[b"\x01" + b"x" * 40]
    assert reasons[bad_json].startswith("RPC body is not JSON")
    # The request with a good frame but a bad body was also answered with an error.
    answers = await read_messages(nsqd, "rpc_r", 1)
    error = json.loads(codec.decode_response(answers[0]).body)["error"]
    assert error["type"] == "RpcDecodeError"


async def read_messages(nsqd: NsqdProcess, topic: str, count: int) -> list[bytes]:
    """The first ``count`` messages of ``topic``, read on a new channel (a topic with no
    channel keeps its messages for the first one)."""
    got: list[bytes] = []

    async def reader(msg: Message) -> None:
        got.append(msg.body)

    readers = Registry()
    readers.task(topic, channel="peek")(reader)
    async with Worker(readers, settings_for(nsqd)):
        await wait_until(lambda: len(got) >= count, message=f"{count} messages on {topic}")
    return got


# --- topology -------------------------------------------------------------------------


async def test_reply_to_a_different_nsqd_than_the_request(nsqd_factory: NsqdFactory) -> None:
    requests_nsqd, replies_nsqd = nsqd_factory(), nsqd_factory()
    registry = Registry()
    pricing(registry)
    client = RpcClient(
        [requests_nsqd.tcp_address],
        reply_nsqd=replies_nsqd.tcp_address,
        settings=settings_for(requests_nsqd),
    )
    # The reply nsqd is none of the endpoint's: a pattern allows it (no credentials).
    endpoint_settings = settings_for(
        requests_nsqd, client_id="pricing-endpoint", rpc_reply_addresses=["127.0.0.1:*"]
    )
    async with Worker(registry, endpoint_settings), client:
        assert (await client.call(TOPIC, {"sku": "A1"}, timeout=10))["price"] == 42
        assert client.reply_topic in topic_names(replies_nsqd)
        assert client.reply_topic not in topic_names(requests_nsqd)
        assert TOPIC not in topic_names(replies_nsqd)
        # The reply connection took the options of the worker's settings.
        producers = replies_nsqd.stats()["producers"]
        assert [p["client_id"] for p in producers] == ["pricing-endpoint"]


async def test_client_finds_nsqd_through_lookupd(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    nsqd = nsqd_factory(nsqlookupd)
    registry = Registry()
    pricing(registry)
    client = RpcClient(
        lookupd_http_addresses=[nsqlookupd.http_address], settings=settings_for(nsqd)
    )
    async with Worker(registry, settings_for(nsqd)):
        await wait_until(lambda: nsqlookupd.nodes(), message="nsqd registered")
        async with client:
            assert client.reply_nsqd.endswith(f":{nsqd.tcp_port}")
            assert client.nsqd_http_address is not None
            assert client.nsqd_http_address.endswith(f":{nsqd.http_port}")
            assert (await client.call(TOPIC, {"sku": "L"}, timeout=10))["sku"] == "L"


@pytest.mark.parametrize("with_http", [True, False], ids=["http-delete", "ephemeral-only"])
async def test_client_close_removes_its_reply_topic(nsqd: NsqdProcess, with_http: bool) -> None:
    registry = Registry()
    pricing(registry)
    http = nsqd.http_address if with_http else None
    client = RpcClient([nsqd.tcp_address], settings=settings_for(nsqd), nsqd_http_address=http)
    async with Worker(registry, settings_for(nsqd)):
        async with client:
            await client.call(TOPIC, {"sku": "A1"}, timeout=10)
            assert client.reply_topic in topic_names(nsqd)
        await wait_until(lambda: client.reply_topic not in topic_names(nsqd), message="topic gone")
    with pytest.raises(ConnectionClosed):
        await client.call(TOPIC, {"sku": "A1"})


async def test_no_nsqd_is_a_clear_error() -> None:
    from nsqworker.testing import free_port

    address = f"127.0.0.1:{free_port()}"
    client = RpcClient([address], settings=Settings(nsqd_tcp_addresses=[address], dial_timeout=0.2))
    with pytest.raises(NoConnection, match="could not subscribe to the RPC reply topic"):
        await client.start()
    await client.close()


def test_sync_client_raises_at_once_when_nsqd_is_down() -> None:
    from nsqworker.testing import free_port

    address = f"127.0.0.1:{free_port()}"
    settings = Settings(nsqd_tcp_addresses=[address], dial_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(NoConnection, match="could not subscribe"):
        SyncRpcClient([address], settings=settings)
    assert time.monotonic() - started < 10


def test_bad_declarations_fail_at_import() -> None:
    from nsqworker.errors import LocalProtocolError
    from nsqworker.task import TaskDefinitionError

    registry = Registry()
    with pytest.raises(TaskDefinitionError, match=r"two must take exactly one positional"):

        @rpc("t", registry=registry)
        def two(a: Any, b: Any) -> None: ...

    with pytest.raises(TaskDefinitionError, match="invalid topic name"):
        rpc("bad topic", registry=registry)(lambda request: request)
    with pytest.raises(LocalProtocolError, match="unknown RPC encoding 'yaml'"):
        rpc("t", registry=registry, encodings=["yaml"])
    assert len(registry) == 0


# --- draining -------------------------------------------------------------------------


async def test_drain_answers_the_calls_in_flight(nsqd: NsqdProcess) -> None:
    registry = Registry()
    entered: list[int] = []

    @rpc("work", registry=registry, max_in_flight=50)
    async def work(request: int) -> int:
        entered.append(request)
        await asyncio.sleep(0.3)
        return request * 2

    async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
        worker = Worker(registry, settings_for(nsqd, drain_timeout=5.0))
        await worker.start()
        calls = asyncio.gather(*(client.call("work", n, timeout=10) for n in range(20)))
        await wait_until(lambda: len(entered) == 20, message="all handlers running")
        await worker.stop()
        assert await calls == [n * 2 for n in range(20)]


async def test_drain_requeues_what_it_cannot_answer_and_nothing_is_lost(
    nsqd: NsqdProcess,
) -> None:
    registry = Registry()
    release = asyncio.Event()
    handled: list[int] = []

    @rpc("stuck", registry=registry, max_in_flight=50)
    async def stuck(request: int) -> int:
        handled.append(request)
        await release.wait()
        return request + 1000

    nsqd.create_channel("stuck", "rpc")
    nsqd.restart()  # nsqd scans channels made before start at once for REQ'd messages
    async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
        first = Worker(registry, settings_for(nsqd))
        await first.start()
        calls = asyncio.gather(*(client.call("stuck", n, timeout=20) for n in range(10)))
        await wait_until(lambda: len(handled) == 10, message="all handlers running")
        await first.stop(drain_timeout=0.1)  # handlers still blocked: REQ 0
        assert not calls.done()
        release.set()
        async with Worker(registry, settings_for(nsqd)):
            assert await calls == [n + 1000 for n in range(10)]
        assert sorted(handled) == sorted([*range(10), *range(10)])  # each one twice
        assert client.late_replies == 0


async def test_reply_producers_are_pooled_and_closed_when_idle(nsqd_factory: NsqdFactory) -> None:
    from nsqworker.rpc.endpoint import ReplyPool

    one, two = nsqd_factory(), nsqd_factory()
    pool = ReplyPool(idle_timeout=0.3)
    await pool.send("127.0.0.1", one.tcp_port, "replies", b"a")
    await pool.send("127.0.0.1", one.tcp_port, "replies", b"b")
    await pool.send("127.0.0.1", two.tcp_port, "replies", b"c")
    assert len(pool) == 2  # one producer per reply nsqd
    assert (one.topic_stats("replies") or {}).get("message_count") == 2
    assert len(one.stats()["producers"]) == 1
    await wait_until(lambda: len(pool) == 0, timeout=5, message="idle producers closed")
    await wait_until(lambda: not one.stats()["producers"], timeout=5, message="disconnected")
    await pool.send("127.0.0.1", two.tcp_port, "replies", b"d")  # reopened on demand
    assert (two.topic_stats("replies") or {}).get("message_count") == 2
    await pool.close()


async def test_an_endpoint_past_its_time_limit_answers_the_caller_with_an_error(
    nsqd: NsqdProcess,
) -> None:
    """The caller hears at once (not at its own timeout) and the request is done."""
    registry = Registry()
    calls = 0

    @rpc("rpc_slow", registry=registry, timeout=0.3)
    async def slow(request: Any) -> Any:
        nonlocal calls
        calls += 1
        await asyncio.sleep(30)

    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        started = time.monotonic()
        with pytest.raises(RpcError) as info:
            await client.call("rpc_slow", {"sku": "A1"}, timeout=10)
        assert time.monotonic() - started < 5
        assert info.value.type == "RpcUserError"
        assert "ran past its time limit" in info.value.message
        await wait_until(lambda: nsqd.depth("rpc_slow", "rpc") == 0, message="depth 0")
        await asyncio.sleep(0.5)
    assert calls == 1  # answered, so finished: not retried
