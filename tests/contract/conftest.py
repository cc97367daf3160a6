"""One harness per transport for the contract suite: a real broker (or the memory one),
settings that reach it, and the few operations the behaviour tests need.

A transport joins the suite by adding a :class:`Harness` subclass and its name to
``TRANSPORTS`` (docs/transports.md, "Adding a transport").
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import structlog

from nsqworker.consumer import Consumer
from nsqworker.memory import MemoryTransport
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nats import NatsProducer
from nsqworker.nsq.producer import Producer
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.testing import NsqdFactory, wait_until
from nsqworker.transport import Capabilities, Publisher, Transport, create_transport

TRANSPORTS = ["nsq", "memory", "nats", "rabbitmq-stream"]


class Harness:
    """What a contract test needs from one transport."""

    name: str
    virtual_time = False
    """Delays pass without waiting (the memory transport's clock)."""

    def __init__(self) -> None:
        self.topic = f"contract_{uuid.uuid4().hex[:8]}"

    def settings(self, **overrides: Any) -> Settings:
        """Settings reaching the broker: quick retries, no backoff unless asked."""
        values: dict[str, Any] = {
            "retry_delay": 0.05,
            "backoff_multiplier": 0.0,
            "drain_timeout": 5.0,
            "log_level": "warning",
            "health_port": 0,
        }
        return Settings(**(values | self.broker_settings() | overrides))

    def broker_settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def deadline_settings(self) -> dict[str, Any]:
        """Settings giving each delivery a one-second deadline (keep-alive tests)."""
        raise NotImplementedError

    def transport(self) -> Transport | None:
        """The transport instance to hand the Worker; None: built from the settings."""
        return None

    @property
    def capabilities(self) -> Capabilities:
        """What the transport under test declares (building one connects nowhere)."""
        return (self.transport() or create_transport(self.settings())).capabilities

    async def publish(self, topic: str, bodies: list[bytes]) -> None:
        raise NotImplementedError

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        """What reads the bodies published to ``topic`` from now on."""
        raise NotImplementedError

    def publisher(self) -> Publisher:
        """A publisher as a user's code would make one (closed by the harness)."""
        raise NotImplementedError

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (letting the broker work) until ``done()``."""
        await wait_until(done, timeout=timeout, message=what)

    async def close(self) -> None:
        """Stop what the harness started."""


class NsqHarness(Harness):
    """A real nsqd, started for the test."""

    name = "nsq"

    def __init__(self, nsqd_factory: NsqdFactory) -> None:
        super().__init__()
        self.nsqd = nsqd_factory()
        self._watchers: list[Consumer] = []
        self._producers: list[Producer] = []

    def broker_settings(self) -> dict[str, Any]:
        return {
            "nsqd_tcp_addresses": [self.nsqd.tcp_address],
            "reconnect_delay": 0.05,
            "max_reconnect_delay": 0.5,
            "dial_timeout": 2.0,
        }

    def deadline_settings(self) -> dict[str, Any]:
        return {"msg_timeout": 1.0}

    async def publish(self, topic: str, bodies: list[bytes]) -> None:
        for body in bodies:
            self.nsqd.publish(topic, body)

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        seen: list[bytes] = []

        def record(msg: Message) -> Outcome:
            seen.append(msg.body)
            return FINISH

        self.nsqd.create_channel(topic, "watch")
        consumer = Consumer(topic, "watch", record, self.settings())
        await consumer.start()
        self._watchers.append(consumer)
        return lambda: list(seen)

    def publisher(self) -> Producer:
        producer = Producer([self.nsqd.tcp_address])
        self._producers.append(producer)
        return producer

    async def close(self) -> None:
        for consumer in self._watchers:
            await consumer.stop(0)
        for producer in self._producers:
            await producer.close()


class ClientHarness(Harness):
    """A broker reached through its transport's own producer and consumers."""

    def __init__(self) -> None:
        super().__init__()
        self._watchers: list[Consumer] = []
        self._producers: list[Any] = []

    def make_publisher(self) -> Any:
        raise NotImplementedError

    async def publish(self, topic: str, bodies: list[bytes]) -> None:
        await self.publisher().publish_many(topic, bodies)

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        seen: list[bytes] = []

        def record(msg: Message) -> Outcome:
            seen.append(msg.body)
            return FINISH

        consumer = Consumer(topic, f"watch{uuid.uuid4().hex[:6]}", record, self.settings())
        await consumer.start()
        self._watchers.append(consumer)
        return lambda: list(seen)

    def publisher(self) -> Any:
        if not self._producers:
            self._producers.append(self.make_publisher())
        return self._producers[0]

    async def close(self) -> None:
        for consumer in self._watchers:
            await consumer.stop(0)
        for producer in self._producers:
            await producer.close()


class NatsHarness(ClientHarness):
    """A real nats-server with JetStream, started for the test."""

    name = "nats"

    def __init__(self, server: Any) -> None:
        super().__init__()
        self.topic = f"contract.{uuid.uuid4().hex[:8]}"
        self.server = server

    def broker_settings(self) -> dict[str, Any]:
        return {
            "transport": "nats",
            "nats_servers": [self.server.url],
            "reconnect_delay": 0.05,
            "max_reconnect_delay": 0.5,
            "dial_timeout": 2.0,
        }

    def deadline_settings(self) -> dict[str, Any]:
        return {"msg_timeout": 1.0}

    def make_publisher(self) -> NatsProducer:
        return NatsProducer(settings=self.settings())


class StreamHarness(ClientHarness):
    """The session's real RabbitMQ with the stream plugin; a fresh stream per test."""

    name = "rabbitmq-stream"

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri

    def broker_settings(self) -> dict[str, Any]:
        return {"transport": "rabbitmq-stream", "rabbitmq_stream_uri": self.uri}

    def deadline_settings(self) -> dict[str, Any]:
        return {}  # no delivery deadline on a stream: keep-alive has nothing to extend

    def make_publisher(self) -> StreamProducer:
        return StreamProducer(settings=self.settings())


class MemoryHarness(Harness):
    """The in-memory transport, its clock jumping over delays."""

    name = "memory"
    virtual_time = True

    def __init__(self) -> None:
        super().__init__()
        self.broker = MemoryTransport()

    def broker_settings(self) -> dict[str, Any]:
        return {"transport": "memory"}

    def deadline_settings(self) -> dict[str, Any]:
        self.broker.ack_wait = 1.0
        return {}

    def transport(self) -> Transport:
        return self.broker

    async def publish(self, topic: str, bodies: list[bytes]) -> None:
        await self.broker.publish_many(topic, bodies)

    async def watch(self, topic: str) -> Callable[[], list[bytes]]:
        return lambda: self.broker.messages(topic)

    def publisher(self) -> MemoryTransport:
        return self.broker

    async def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            left = max(deadline - time.monotonic(), 0.1)
            await self.broker.run_until_idle(timeout=left, until=done)
            await asyncio.sleep(0.005)


@pytest.fixture(autouse=True)
def quiet_logs() -> Any:
    """Handler failures log tracebacks; rendering them would only slow the tests."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    yield
    structlog.configure(**saved)


@pytest.fixture(params=TRANSPORTS)
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """Each contract test runs once per transport."""
    harness: Harness
    if request.param == "nsq":
        harness = NsqHarness(request.getfixturevalue("nsqd_factory"))
    elif request.param == "nats":
        harness = NatsHarness(request.getfixturevalue("nats_server"))
    elif request.param == "rabbitmq-stream":
        harness = StreamHarness(request.getfixturevalue("rabbitmq"))
    else:
        harness = MemoryHarness()
    try:
        yield harness
    finally:
        await harness.close()
