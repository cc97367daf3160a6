"""``Retry`` and ``Reject`` raised by an ``@rpc`` endpoint, on a real nsqd and a real
nats-server, checked where the broker keeps the truth (docs/rpc.md):

* NSQ, ``Retry``: REQ, so nsqd delivers the request again and the caller, still waiting,
  gets the answer of the later delivery: one reply, one REQ, one FIN;
* NSQ, ``Reject``: an error reply, then the dead letter: one reply, one dead letter,
  finished, never retried;
* NATS, ``Retry``: answered at once with a 503 (core NATS never delivers a request
  again), nothing dead-lettered, the function called once;
* NATS, ``Reject``: a 400 reply, then the dead letter in its JetStream stream, once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from typing import Any

import pytest

from nsqworker.errors import RpcError
from nsqworker.message import Message
from nsqworker.rpc import RpcClient, rpc
from nsqworker.settings import Settings
from nsqworker.task import Registry, Reject, Retry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.testing.holds import holds_async
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration

CHANNEL = "rpc"


def nsq_settings(nsqd: NsqdProcess) -> Settings:
    return Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], retry_delay=0.05, backoff_multiplier=0.0,
        drain_timeout=5.0, health_port=0, log_level="critical",
    )  # fmt: skip


def nats_settings(url: str) -> Settings:
    return Settings(
        transport="nats", nats_servers=[url], retry_delay=0.05, backoff_multiplier=0.0,
        drain_timeout=5.0, health_port=0, log_level="critical",
    )  # fmt: skip


def channel(nsqd: NsqdProcess, topic: str) -> dict[str, Any]:
    return nsqd.channel_stats(topic, CHANNEL) or {}


def fins(stats: dict[str, Any]) -> int:
    """FINs nsqd counted on a channel (its clients' counts)."""
    return sum(int(c.get("finish_count", 0)) for c in stats.get("clients") or [])


def kept(stats: dict[str, Any]) -> int:
    """Messages nsqd still holds for a channel: waiting, deferred or in flight."""
    return sum(int(stats.get(k, 0)) for k in ("depth", "deferred_count", "in_flight_count"))


def published(nsqd: NsqdProcess, topic: str) -> int:
    """Messages nsqd took on ``topic`` (0 when it does not exist)."""
    stats = nsqd.topic_stats(topic)
    return int(stats["message_count"]) if stats else 0


# --- NSQ ----------------------------------------------------------------------------


async def test_nsq_retry_is_a_req_and_the_later_delivery_answers_the_caller(
    nsqd: NsqdProcess,
) -> None:
    topic, dead = f"price_{uuid.uuid4().hex[:6]}", f"price_dead_{uuid.uuid4().hex[:6]}"
    calls: Counter[str] = Counter()
    registry = Registry()

    @rpc(topic, registry=registry, dead_letter_topic=dead, max_attempts=5)
    async def quote(request: dict[str, Any]) -> dict[str, Any]:
        calls[request["sku"]] += 1
        if calls[request["sku"]] == 1:
            raise Retry(0.05, reason="prices not loaded yet")
        return {"sku": request["sku"], "price": 42, "attempt": calls[request["sku"]]}

    settings = nsq_settings(nsqd)
    async with Worker(registry, settings), RpcClient([nsqd.tcp_address], settings=settings) as c:
        # Generous: nsqd scans a new channel's deferred messages only every 5 s.
        answer = await c.call(topic, {"sku": "A1"}, timeout=30)
        assert answer == {"sku": "A1", "price": 42, "attempt": 2}
        assert calls == {"A1": 2}
        # nsqd's counts: one REQ, then one FIN; nothing left; one reply published.
        await wait_until(
            lambda: kept(channel(nsqd, topic)) == 0 and fins(channel(nsqd, topic)) == 1, 10,
            lambda: f"the request finished once: {channel(nsqd, topic)}",
        )  # fmt: skip
        assert channel(nsqd, topic)["requeue_count"] == 1
        assert published(nsqd, c.reply_topic) == 1
        assert published(nsqd, dead) == 0


async def test_nsq_reject_answers_with_an_error_then_dead_letters_once(
    nsqd: NsqdProcess,
) -> None:
    topic, dead = f"price_{uuid.uuid4().hex[:6]}", f"price_dead_{uuid.uuid4().hex[:6]}"
    calls: list[Any] = []
    letters: list[tuple[str, str]] = []
    registry = Registry()

    def on_dead_letter(msg: Message, reason: str) -> None:
        letters.append((msg.topic, reason))

    @rpc(topic, registry=registry, dead_letter_topic=dead, max_attempts=5,
         on_dead_letter=on_dead_letter)  # fmt: skip
    async def quote(request: dict[str, Any]) -> dict[str, Any]:
        calls.append(request)
        raise Reject(f"malformed order {request['sku']}")

    settings = nsq_settings(nsqd)
    async with Worker(registry, settings), RpcClient([nsqd.tcp_address], settings=settings) as c:
        with pytest.raises(RpcError) as raised:
            await c.call(topic, {"sku": "B2"}, timeout=30)
        assert (raised.value.type, raised.value.message) == ("Reject", "malformed order B2")
        # The reply first, then the dead letter: the request is finished, never retried.
        await wait_until(lambda: published(nsqd, dead) == 1, 10, "the dead letter on nsqd")
        await wait_until(
            lambda: kept(channel(nsqd, topic)) == 0 and fins(channel(nsqd, topic)) == 1, 10,
            lambda: f"the request finished: {channel(nsqd, topic)}",
        )  # fmt: skip
        assert channel(nsqd, topic)["requeue_count"] == 0
        assert letters == [(topic, "malformed order B2")]
        assert published(nsqd, c.reply_topic) == 1
        await holds_async(
            lambda: len(calls) == 1 and published(nsqd, dead) == 1, 1.0,
            "the rejected request came back",
        )  # fmt: skip


# --- NATS ---------------------------------------------------------------------------


async def stream_messages(client: Any, subject: str) -> list[dict[str, Any]]:
    """The messages JetStream stored on ``subject``'s stream, as JSON ([] if none)."""
    from nats.js.errors import NotFoundError

    js = client.jetstream()
    try:
        name = await js.find_stream_name_by_subject(subject)
        info = await js.stream_info(name)
    except NotFoundError:
        return []
    first, count = info.state.first_seq, info.state.messages
    stored = [await js.get_msg(name, seq) for seq in range(first, first + count)]
    return [json.loads(m.data or b"{}") for m in stored]


async def test_nats_retry_and_reject_codes_and_dead_letters(
    nats_server: NatsServerProcess,
) -> None:
    import nats

    topic = f"rpc.gaps{uuid.uuid4().hex[:6]}"
    dead = f"rpcdead.gaps{uuid.uuid4().hex[:6]}"
    calls: list[Any] = []
    registry = Registry()

    @rpc(topic, registry=registry, dead_letter_topic=dead)
    async def quote(request: Any) -> Any:
        calls.append(request)
        if request == "later":
            raise Retry(0.05, reason="warming up")
        raise Reject("malformed order")

    client = await nats.connect(nats_server.url)
    try:
        async with Worker(registry, nats_settings(nats_server.url)) as worker:
            await wait_until(lambda: worker.ready, 20, "the endpoint subscribed")
            # Retry: a 503 at once (the caller retries), no redelivery, no dead letter.
            later = await client.request(topic, b'"later"', timeout=10)
            assert later.headers is not None
            assert later.headers.get("Nats-Service-Error-Code") == "503"
            assert json.loads(later.data)["error"]["type"] == "RpcUserError"
            # Reject: a 400 reply, then one dead letter in the dead-letter stream.
            rejected = await client.request(topic, b'"bad"', timeout=10)
            assert rejected.headers is not None
            assert rejected.headers.get("Nats-Service-Error-Code") == "400"
            assert json.loads(rejected.data)["error"] == {
                "type": "Reject", "message": "malformed order",
            }  # fmt: skip
            stored: list[dict[str, Any]] = []

            async def one_letter() -> bool:
                stored[:] = await stream_messages(client, dead)
                return len(stored) == 1

            await wait_async(one_letter, 10, lambda: f"one dead letter: {stored}")
            assert (stored[0]["topic"], stored[0]["reason"]) == (topic, "malformed order")
            assert stored[0]["body"] == '"bad"'
            # Neither request comes back: each reached the function once.
            await holds_async(lambda: calls == ["later", "bad"], 1.0, f"redelivered: {calls}")
            assert len(await stream_messages(client, dead)) == 1
    finally:
        await client.close()


async def wait_async(check: Any, timeout: float, message: Any) -> None:
    """:func:`wait_until` for an async ``check``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, message()
        await asyncio.sleep(0.05)
