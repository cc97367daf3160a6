"""The transport registry, capability checks at worker start, and what the memory
transport does that the contract suite does not show (no server needed)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.memory import MemoryTransport
from nsqworker.message import Message
from nsqworker.rpc import rpc
from nsqworker.settings import Settings, SettingsError
from nsqworker.task import Registry
from nsqworker.transport import (
    create_transport,
    register_transport,
    transport_names,
    unregister_transport,
)
from nsqworker.worker import Worker


def test_the_registry_knows_the_built_in_transports_and_builds_them() -> None:
    assert {"nsq", "memory"} <= set(transport_names())
    transport = create_transport(Settings(nsqd_tcp_addresses=["127.0.0.1:4150"]))
    assert transport.capabilities.name == "nsq"
    assert transport.describe() == {"nsqd": "127.0.0.1:4150"}
    assert isinstance(create_transport(Settings(transport="memory")), MemoryTransport)


def test_an_unknown_transport_fails_in_settings_naming_the_choices() -> None:
    with pytest.raises(
        SettingsError, match="is not a transport; the transports are memory, nats, nsq"
    ):
        Settings(transport="kafka")


def test_a_registered_transport_is_chosen_by_name() -> None:
    made: list[Any] = []

    def factory(settings: Settings) -> MemoryTransport:
        made.append(settings)
        return MemoryTransport()

    register_transport("memory-test", factory)
    try:
        settings = Settings(transport="memory-test")
        assert isinstance(create_transport(settings), MemoryTransport) and made == [settings]
        with pytest.raises(ConfigurationError, match="transport name"):
            register_transport("bad name!", factory)
        assert "bad name!" not in transport_names()
    finally:
        unregister_transport("memory-test")
    assert "memory-test" not in transport_names()
    with pytest.raises(SettingsError, match="is not a transport"):
        Settings(transport="memory-test")


async def test_a_task_that_needs_a_capability_is_refused_at_start() -> None:
    reg = Registry()

    @rpc("pricing", registry=reg)
    async def quote(request: dict[str, Any]) -> dict[str, Any]:
        return request

    worker = Worker(reg, Settings(transport="memory"), transport=MemoryTransport())
    with pytest.raises(ConfigurationError) as caught:
        await worker.start()
    text = str(caught.value)
    assert "an @rpc endpoint" in text and "needs a transport with rpc" in text
    assert "transport 'memory' has not" in text


async def test_memory_redelivers_an_unanswered_delivery_and_ignores_its_late_answer() -> None:
    broker = MemoryTransport(ack_wait=5.0)
    reg = Registry()
    release = asyncio.Event()
    first: list[Message] = []

    @reg.task("t", channel="c")
    async def handle(msg: Message) -> None:  # the first delivery waits past ack_wait
        if msg.attempts == 1:
            first.append(msg)
            await release.wait()

    # keep_alive off for this task's transport: the first delivery outlives ack_wait
    broker.capabilities = dataclasses.replace(broker.capabilities, keep_alive=False)
    async with Worker(reg, Settings(transport="memory"), transport=broker):
        await broker.publish("t", b"x")
        await broker.run_until_idle(until=lambda: bool(first))
        started = time.monotonic()
        broker.advance(6.0)  # past ack_wait: delivered again
        await broker.run_until_idle(until=lambda: len(broker.finished("t", "c")) == 1)
        release.set()  # the first delivery's answer comes too late: ignored
        await asyncio.sleep(0.01)
    assert time.monotonic() - started < 2
    assert [(d.body, d.attempts) for d in broker.finished("t", "c")] == [(b"x", 2)]
    assert broker.acked("t", "c") == broker.finished("t", "c")  # the old name still works
    assert broker.timed_out("t", "c") == 1 and broker.pending("t", "c") == 0


async def test_memory_keeps_messages_published_before_the_first_channel() -> None:
    broker = MemoryTransport()
    await broker.publish_many("early", [b"a", b"b"])
    reg = Registry()
    seen: list[bytes] = []

    @reg.task("early", channel="one")
    async def one(msg: Message) -> None:
        seen.append(msg.body)

    async with Worker(reg, Settings(transport="memory"), transport=broker):
        await broker.run_until_idle()
    assert seen == [b"a", b"b"]


async def test_memory_run_until_idle_names_what_is_still_busy() -> None:
    broker = MemoryTransport()
    reg = Registry()

    @reg.task("stuck", channel="c")
    async def stuck(msg: Message) -> None:
        await asyncio.sleep(10)

    async with Worker(reg, Settings(transport="memory", drain_timeout=0), transport=broker):
        await broker.publish("stuck", b"x")
        with pytest.raises(TimeoutError, match="stuck/c: 0 ready, 1 in flight"):
            await broker.run_until_idle(timeout=0.2)


def test_memory_refuses_what_a_broker_would() -> None:
    broker = MemoryTransport()
    with pytest.raises(ValueError, match="empty"):
        broker.publish_nowait("t", b"")
    with pytest.raises(ConfigurationError, match="ack_wait"):
        MemoryTransport(ack_wait=0)
    with pytest.raises(ValueError, match="forward"):
        broker.advance(-1)


def test_producer_for_follows_the_transport_of_its_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nsqworker import Producer, producer_for
    from nsqworker.nats import NatsProducer

    nats = producer_for(Settings(transport="nats", nats_servers=["nats://127.0.0.1:4222"]))
    assert isinstance(nats, NatsProducer) and nats.connection.servers == ["nats://127.0.0.1:4222"]
    nsq = producer_for(Settings(nsqd_tcp_addresses=["127.0.0.1:4150"]), timeout=2.0)
    assert type(nsq) is Producer and nsq.addresses == ["127.0.0.1:4150"] and nsq.timeout == 2.0
    assert isinstance(Producer(["127.0.0.1:4150"]), Producer)  # an nsqd address: NSQ
    monkeypatch.setenv("NSQWORKER_TRANSPORT", "nats")
    assert isinstance(producer_for(), NatsProducer)
    monkeypatch.setenv("NSQWORKER_TRANSPORT", "memory")
    with pytest.raises(ConfigurationError, match="'memory' has no producer"):
        producer_for()


def test_producer_with_another_transports_settings_still_works_and_warns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nsqworker import Producer, SyncProducer
    from nsqworker.nats import NatsProducer

    with pytest.warns(DeprecationWarning, match="producer_for"):
        nats = Producer(settings=Settings(transport="nats"))
    assert isinstance(nats, NatsProducer)
    monkeypatch.setenv("NSQWORKER_TRANSPORT", "nats")
    with pytest.warns(DeprecationWarning, match="producer_for"):
        assert isinstance(Producer(), NatsProducer)
    sync = SyncProducer(timeout=1.0)  # wraps the transport's producer, as documented
    try:
        assert isinstance(sync.producer, NatsProducer)
    finally:
        sync.close()
    monkeypatch.setenv("NSQWORKER_TRANSPORT", "memory")
    with pytest.raises(ConfigurationError, match="'memory' has no producer"):
        Producer()


async def test_the_memory_transport_has_the_method_its_hint_names() -> None:
    broker = MemoryTransport()
    with pytest.raises(TypeError, match=r"use publish_json\(\)"):
        await broker.publish("hinted", {"id": 1})
    await broker.publish_json("hinted", {"id": 1, "name": "é"})
    assert broker.messages("hinted") == ['{"id":1,"name":"é"}'.encode()]
