"""RPC endpoints against hostile requests, with real nsqd (docs/security.md).

The "fake nsqd" here (nsqworker.testing.faults) is an attacker's server, not a broker
under test: it records who connects and what they send, and asks for AUTH the way a
real nsqd would.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import structlog

from nsqworker.message import Message
from nsqworker.rpc import RpcClient, codec, rpc
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdFactory, NsqdProcess, NsqlookupdProcess, wait_until
from nsqworker.testing.faults import AuthAskingServer, SilentServer
from nsqworker.testing.holds import window
from nsqworker.worker import Worker

SECRET = "top-secret-token"


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
        "drain_timeout": 5.0,
        "auth_secret": SECRET,
    }
    values.update(overrides)
    return Settings(**values)


def endpoint(registry: Registry, letters: list[str], **options: Any) -> None:
    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append(reason)

    @rpc("sec_rpc", registry=registry, on_dead_letter=on_dead_letter, **options)
    async def answer(request: Any) -> Any:
        return {"ok": request}


def request_to(port: int, topic: str = "rpc_attacker", host: str = "127.0.0.1") -> bytes:
    return codec.encode_request(b"A" * 16, codec.JSON, host, port, topic, b'{"x": 1}')


async def test_a_request_naming_an_unknown_nsqd_gets_no_connection_and_no_secret(
    nsqd: NsqdProcess,
) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    with AuthAskingServer() as fake:
        async with Worker(registry, settings_for(nsqd)):
            nsqd.publish("sec_rpc", request_to(fake.port))
            await wait_until(lambda: letters, message="the request dead-lettered")
            # A known reply nsqd still works: the caller's nsqd is the request's nsqd.
            async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
                assert await client.call("sec_rpc", 7, timeout=10) == {"ok": 7}
            await asyncio.sleep(0.2)
            assert fake.accepted == 0
            assert SECRET.encode() not in fake.received
    assert f"reply nsqd 127.0.0.1:{fake.port} is not trusted" in letters[0]


async def test_an_allowed_pattern_gets_a_connection_without_credentials(
    nsqd: NsqdProcess,
) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    settings = settings_for(nsqd, rpc_reply_addresses=["127.0.0.*:*"])
    with AuthAskingServer() as fake:
        async with Worker(registry, settings):
            nsqd.publish("sec_rpc", request_to(fake.port))
            await wait_until(lambda: letters, timeout=10, message="the request dead-lettered")
            assert fake.accepted >= 1  # allowed: dialled
            assert b"IDENTIFY" in fake.received
            assert SECRET.encode() not in fake.received
            assert b"AUTH" not in fake.received
    assert f"reply nsqd 127.0.0.1:{fake.port} unreachable" in letters[0]


async def test_a_reply_topic_outside_rpc_reply_topics_is_refused(nsqd: NsqdProcess) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    async with Worker(registry, settings_for(nsqd)):
        nsqd.publish("sec_rpc", request_to(nsqd.tcp_port, topic="orders"))
        await wait_until(lambda: letters, message="the request dead-lettered")
    assert "reply topic 'orders' is not allowed" in letters[0]
    assert "orders" not in [t["topic_name"] for t in nsqd.stats()["topics"]]


async def test_a_flood_naming_a_hanging_reply_nsqd_does_not_starve_the_endpoint(
    nsqd: NsqdProcess,
) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    # The worst case: an allowed address that accepts and never answers.
    with SilentServer() as fake:
        settings = settings_for(nsqd, rpc_reply_addresses=[f"127.0.0.1:{fake.port}"])
        async with Worker(registry, settings):
            nsqd.mpublish("sec_rpc", [request_to(fake.port)] * 300, binary=True)
            await asyncio.sleep(0.5)
            started = time.monotonic()
            async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
                answers = await asyncio.gather(
                    *(client.call("sec_rpc", n, timeout=20) for n in range(5))
                )
            took = time.monotonic() - started
            assert answers == [{"ok": n} for n in range(5)]
            assert took < window(5.0), f"good calls waited {took:.1f} s behind the flood"
            await wait_until(lambda: len(letters) == 300, timeout=20, message="300 dead letters")
        assert fake.accepted <= 3  # dialled once (and its retry), not once per request
    assert all("unreachable" in r or "failed less than" in r for r in letters)


async def test_a_reply_nsqd_listed_by_lookupd_is_trusted(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    requests_nsqd, replies_nsqd = nsqd_factory(nsqlookupd), nsqd_factory(nsqlookupd)
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    settings = settings_for(lookupd_http_addresses=[nsqlookupd.http_address])
    replies_nsqd.publish("warmup", b"x")  # both registered with lookupd
    requests_nsqd.publish("sec_rpc_warm", b"x")
    await wait_until(lambda: len(nsqlookupd.nodes()) == 2, message="both nsqd registered")
    client = RpcClient(
        [requests_nsqd.tcp_address],
        reply_nsqd=f"127.0.0.1:{replies_nsqd.tcp_port}",
        settings=settings_for(requests_nsqd),
    )
    async with Worker(registry, settings), client:
        assert await client.call("sec_rpc", 1, timeout=15) == {"ok": 1}
    assert not letters


async def test_a_reply_nsqd_outside_lookupd_allowed_nsqd_is_not_trusted(
    nsqlookupd: NsqlookupdProcess, nsqd_factory: NsqdFactory
) -> None:
    requests_nsqd, other_nsqd = nsqd_factory(nsqlookupd), nsqd_factory(nsqlookupd)
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    settings = settings_for(
        lookupd_http_addresses=[nsqlookupd.http_address],
        lookupd_allowed_nsqd=[f"127.0.0.1:{requests_nsqd.tcp_port}"],
    )
    other_nsqd.publish("warmup", b"x")  # both registered with lookupd
    requests_nsqd.publish("sec_rpc", b"x")  # dead-lettered too: not a request
    await wait_until(lambda: len(nsqlookupd.nodes()) == 2, message="both nsqd registered")
    async with Worker(registry, settings):
        await wait_until(lambda: letters, message="the warm-up dead-lettered")
        requests_nsqd.publish("sec_rpc", request_to(other_nsqd.tcp_port))
        await wait_until(lambda: len(letters) == 2, message="the request dead-lettered")
    assert f"reply nsqd 127.0.0.1:{other_nsqd.tcp_port} is not trusted" in letters[1]
    assert "rpc_attacker" not in [t["topic_name"] for t in other_nsqd.stats()["topics"]]


async def test_nested_json_is_rejected_without_backoff(nsqd: NsqdProcess) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    settings = settings_for(nsqd, backoff_multiplier=1.0)  # a failure would pause 1 s, 2, 4...
    deep = b"[" * 100_000
    async with Worker(registry, settings):
        for n in range(4):
            body = codec.encode_request(bytes([n]) * 16, codec.JSON, "127.0.0.1",
                                        nsqd.tcp_port, "rpc_bomb", deep)  # fmt: skip
            nsqd.publish("sec_rpc", body)
        nested = b'{"a":' * 70 + b"1" + b"}" * 70  # parses, but deeper than max_depth 64
        nsqd.publish("sec_rpc", request_to(nsqd.tcp_port, topic="rpc_bomb")[:-8] + nested)
        await wait_until(lambda: len(letters) == 5, message="5 dead letters")
        started = time.monotonic()
        async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
            assert await client.call("sec_rpc", 1, timeout=10) == {"ok": 1}
        assert time.monotonic() - started < 3.0  # no backoff level to wait out
    assert sum("nested too deeply" in r for r in letters) == 4
    assert any("deeper than 64 levels" in r for r in letters)


async def test_a_msgpack_body_of_empty_maps_is_rejected_without_backoff(
    nsqd: NsqdProcess,
) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    settings = settings_for(nsqd, backoff_multiplier=1.0)
    count = 1_000_000  # one byte each: 64 MB of dicts if decoded
    bomb = b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count
    async with Worker(registry, settings):
        nsqd.publish("sec_rpc", codec.encode_request(
            b"M" * 16, codec.MSGPACK, "127.0.0.1", nsqd.tcp_port, "rpc_bomb", bomb))  # fmt: skip
        await wait_until(lambda: letters, message="dead-lettered")
        started = time.monotonic()
        async with RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client:
            assert await client.call("sec_rpc", 1, timeout=10, encoding="msgpack") == {"ok": 1}
        assert time.monotonic() - started < 3.0  # no backoff level to wait out
    assert "MiB of lists and maps" in letters[0]


async def test_a_request_over_max_request_size_is_rejected(nsqd: NsqdProcess) -> None:
    registry, letters = Registry(), list[str]()
    endpoint(registry, letters, max_request_size=1000)
    async with Worker(registry, settings_for(nsqd)):
        body = codec.encode_request(b"B" * 16, codec.JSON, "127.0.0.1", nsqd.tcp_port,
                                    "rpc_big", b"[" + b"0," * 1000 + b"0]")  # fmt: skip
        nsqd.publish("sec_rpc", body)
        await wait_until(lambda: letters, message="dead-lettered")
    assert "2003 bytes is over the endpoint's max_request_size of 1000" in letters[0]


async def test_error_replies_are_generic_unless_the_author_chose_the_text(
    nsqd: NsqdProcess,
) -> None:
    from nsqworker.rpc import RpcError, RpcUserError

    class OutOfStock(RpcUserError):
        pass

    registry = Registry()

    @rpc("fails", registry=registry)
    async def fails(request: str) -> None:
        if request == "user":
            raise OutOfStock("sku A1 is out of stock")
        raise RuntimeError("cannot reach postgres://admin:hunter2@db:5432/orders")

    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        with pytest.raises(RpcError) as info:
            await client.call("fails", "internal", timeout=10)
        assert info.value.type == "EndpointError"
        assert "hunter2" not in str(info.value)
        assert "error id " in info.value.message  # the message id, in the endpoint's log
        with pytest.raises(RpcError) as info:
            await client.call("fails", "user", timeout=10)
        assert (info.value.type, info.value.message) == ("OutOfStock", "sku A1 is out of stock")


async def test_the_functions_own_publishing_errors_are_generic(nsqd: NsqdProcess) -> None:
    from nsqworker.nsq.producer import Producer
    from nsqworker.rpc import RpcError

    registry = Registry()

    @rpc("publishes", registry=registry)
    async def publishes(request: str) -> Any:
        if request == "result":
            return {1, 2}  # a set: not JSON; the caller hears what went wrong
        async with Producer([nsqd.tcp_address]) as producer:
            await producer.publish("internal.billing/ledger", b"x")  # InvalidName

    async with (
        Worker(registry, settings_for(nsqd)),
        RpcClient([nsqd.tcp_address], settings=settings_for(nsqd)) as client,
    ):
        with pytest.raises(RpcError) as info:
            await client.call("publishes", "publish", timeout=10)
        assert info.value.type == "EndpointError"
        assert "billing" not in str(info.value) and "error id " in info.value.message
        with pytest.raises(RpcError) as info:
            await client.call("publishes", "result", timeout=10)
        assert (info.value.type, info.value.message) == (
            "LocalProtocolError",
            "cannot encode set as JSON: Object of type set is not JSON serializable",
        )


async def test_the_seed_clients_rcp_reply_topic_is_answered_by_default(nsqd: NsqdProcess) -> None:
    """ensq_rpc, the seed's reference client, names its reply topic ``rcp-<hash>``: a
    request built by hand as it sends one (docs/rpc.md) gets its answer, settings left
    at their defaults."""
    import struct

    from nsqworker.consumer import Consumer
    from nsqworker.message import FINISH, Outcome

    replies: list[bytes] = []

    def record(msg: Message) -> Outcome:
        replies.append(msg.body)
        return FINISH

    registry, letters = Registry(), list[str]()
    endpoint(registry, letters)
    host, topic, request_id = b"127.0.0.1", b"rcp-123456789", bytes(range(16))
    # vsn 0, id, encoding 1 (JSON), len(host), len(topic), port, host, topic, body
    request = struct.pack(">B16sBBBI", 0, request_id, 1, len(host), len(topic), nsqd.tcp_port)
    request += host + topic + b"21"
    nsqd.create_channel("rcp-123456789", "caller")
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.05, drain_timeout=5.0)
    assert "rcp-*" in settings.rpc_reply_topics  # the default, not set here
    reader = Consumer("rcp-123456789", "caller", record, settings)
    await reader.start()
    try:
        async with Worker(registry, settings):
            nsqd.publish("sec_rpc", request)
            await wait_until(lambda: replies or letters, timeout=15, message="the reply")
    finally:
        await reader.stop(0)
    assert letters == []
    assert replies == [b"\x00" + request_id + b"\x01" + b'{"ok":21}']
