"""One harness per transport for the contract suite: a real broker (or the memory one),
settings that reach it, and the few operations the behaviour tests need.

A transport joins the suite by adding a :class:`Harness` subclass and its name to
``TRANSPORTS`` (docs/transports.md, "Adding a transport").

Every harness also answers what the broker itself settled (:meth:`Harness.settled`), so a
contract test checks the broker's counts, not only the worker's: a lost FIN, ack or offset
store fails it. Brokers that redeliver on a deadline run with a short one
(:data:`MSG_TIMEOUT`), so that "nothing came back" after :meth:`Harness.quiet` means
something.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from nsqworker.consumer import Consumer
from nsqworker.memory import MemoryTransport
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nats import NatsProducer
from nsqworker.nats.jetstream import consumer_name
from nsqworker.nsq.producer import Producer
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer
from nsqworker.streams.client import Endpoint
from nsqworker.streams.lag import stream_lags
from nsqworker.streams.retries import retry_streams
from nsqworker.testing import NsqdFactory, wait_until
from nsqworker.transport import Capabilities, Publisher, Transport, create_transport

TRANSPORTS = ["nsq", "memory", "nats", "rabbitmq-stream"]

MSG_TIMEOUT = 1.5
"""Seconds nsqd (``--msg-timeout``) and JetStream (the consumer's ``ack_wait``) wait for
an answer before they deliver a message again (their defaults are 60 and 30 s)."""
QUIET = 3 * MSG_TIMEOUT
"""Seconds a negative check waits, after a positive sync point, for something that
should not come (a redelivery): three message timeouts."""


@dataclass(frozen=True)
class Settled:
    """What the broker says one channel of one topic settled, in its own counts.

    ``settled``: messages the broker will never give the channel again (finished, or
    rejected after their dead letter): nsqd's ``message_count`` less the unsettled (its
    ``finish_count`` is per client, gone with the connection); JetStream's ack floor
    (the stream sequence every message up to which is acked or terminated); on a stream,
    the messages the channel's stored offset passes, less the retry copies, which are
    counted by the copies' own offsets (a message moved to a retry stream is not done).

    ``unsettled``: messages not settled yet, waiting, in flight or deferred: nsqd's
    ``depth + in_flight_count + deferred_count``; JetStream's ``num_pending +
    num_ack_pending``; on a stream, the lag behind the stored offsets of the topic's
    stream and of the channel's retry streams (while it is not 0, a stream's harness
    reports -1 for the other two).

    ``retried``: deliveries the broker had to make again: nsqd's ``requeue_count +
    timeout_count``; JetStream's deliveries past one per message (consumer sequence less
    stream sequence delivered); on a stream, the copies in the retry streams.
    """

    settled: int
    unsettled: int
    retried: int

    def matches(self, settled: int, unsettled: int, retried: int | None) -> bool:
        """These counts (``retried=None``: any)."""
        return (self.settled, self.unsettled) == (settled, unsettled) and (
            retried is None or self.retried == retried
        )


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

    async def settled(self, topic: str, channel: str) -> Settled:
        """What the broker says ``channel`` of ``topic`` settled (see :class:`Settled`)."""
        raise NotImplementedError

    async def until_settled(
        self, topic: str, channel: str, settled: int, *, unsettled: int = 0,
        retried: int | None = 0, timeout: float = 20,
    ) -> Settled:  # fmt: skip
        """Wait until the broker's counts for ``channel`` of ``topic`` are these (it may
        still be writing them; ``retried=None``: any number); the last counts read are
        in the error. Returns them."""
        deadline = time.monotonic() + timeout
        while not (now := await self.settled(topic, channel)).matches(settled, unsettled, retried):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: the broker says {topic}/{channel} {now}, not settled"
                    f" {settled}, unsettled {unsettled}, retried {retried} (waited {timeout:g}s)"
                )
            await asyncio.sleep(0.05)
        return now

    async def quiet(self) -> None:
        """Let :data:`QUIET` seconds pass: a negative check's window, after a positive
        sync point, for a redelivery that must not come."""
        await asyncio.sleep(QUIET)

    async def close(self) -> None:
        """Stop what the harness started."""


class NsqHarness(Harness):
    """A real nsqd, started for the test."""

    name = "nsq"

    def __init__(self, nsqd_factory: NsqdFactory) -> None:
        super().__init__()
        self.nsqd = nsqd_factory(extra_args=[f"--msg-timeout={int(MSG_TIMEOUT * 1000)}ms"])
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

    async def settled(self, topic: str, channel: str) -> Settled:
        first = await self._settled(topic, channel)
        if first.unsettled:
            return first
        # A message nsqd took from the channel for a client and has not put in flight
        # yet is counted nowhere for a moment: all settled only if it still is 0.1 s on.
        await asyncio.sleep(0.1)
        return await self._settled(topic, channel)

    async def _settled(self, topic: str, channel: str) -> Settled:
        stats = await asyncio.to_thread(self.nsqd.channel_stats, topic, channel)
        if stats is None:
            return Settled(0, 0, 0)
        # nsqd counts FINs per client (gone with its connection): per channel, what came
        # in (message_count, requeues not counted again) less what is still held is
        # what was finished.
        unsettled = stats["depth"] + stats["in_flight_count"] + stats["deferred_count"]
        return Settled(
            settled=stats["message_count"] - unsettled,
            unsettled=unsettled,
            retried=stats["requeue_count"] + stats["timeout_count"],
        )

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
        self._client: Any = None

    def broker_settings(self) -> dict[str, Any]:
        return {
            "transport": "nats",
            "nats_servers": [self.server.url],
            "reconnect_delay": 0.05,
            "max_reconnect_delay": 0.5,
            "dial_timeout": 2.0,
            "msg_timeout": MSG_TIMEOUT,  # the consumer's ack_wait
        }

    async def settled(self, topic: str, channel: str) -> Settled:
        import nats

        if self._client is None:
            self._client = await nats.connect(self.server.url)
        js = self._client.jetstream()
        stream = await js.find_stream_name_by_subject(topic)
        info = await js.consumer_info(stream, await consumer_name(js, stream, topic, channel))
        delivered = info.delivered.consumer_seq - info.delivered.stream_seq
        return Settled(
            settled=info.ack_floor.stream_seq,
            unsettled=(info.num_pending or 0) + (info.num_ack_pending or 0),
            retried=delivered,
        )

    async def close(self) -> None:
        await super().close()
        if self._client is not None:
            await self._client.close()

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

    async def quiet(self) -> None:
        """No redelivery deadline on a stream: a restarted reader starts at the stored
        offset at once; this window is ample for it to read what follows."""
        await asyncio.sleep(MSG_TIMEOUT)

    async def settled(self, topic: str, channel: str) -> Settled:
        """The lags first; the messages behind the stored offsets are counted (a read
        of each stream) only once nothing is unsettled: -1 until then."""
        streams = [topic, *retry_streams(topic, channel)]
        lags = await stream_lags(self.settings(), [(s, channel) for s in streams])
        # A retry stream exists once a retry was made: a missing one is a LagError.
        behind = {s: lag for s in streams if isinstance(lag := lags[(s, channel)], int)}
        if unsettled := sum(behind.values()):
            return Settled(-1, unsettled, -1)
        passed = await self._passed(list(behind), channel)
        # Nothing unsettled: every retry copy is passed, and each message of the topic
        # the offset passed is done for good.
        return Settled(passed.get(topic, 0), 0, sum(passed.get(s, 0) for s in streams[1:]))

    async def _passed(self, streams: list[str], reference: str) -> dict[str, int]:
        """Per stream, the messages at or before the offset ``reference`` stored (offsets
        also number RabbitMQ's offset-tracking records: they are not counted)."""
        from rstream import Consumer as Reader
        from rstream import ConsumerOffsetSpecification, OffsetType
        from rstream.exceptions import OffsetNotFound

        e = Endpoint.from_settings(self.settings())
        reader = Reader(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                        password=e.password)  # fmt: skip
        await reader.start()
        counts: dict[str, int] = {}
        try:
            for stream in streams:
                try:
                    stored = await reader.query_offset(stream, reference)
                except OffsetNotFound:
                    counts[stream] = 0
                    continue
                offsets: list[int] = []
                await reader.subscribe(
                    stream, lambda msg, ctx, seen=offsets: seen.append(ctx.offset),
                    initial_credit=100,
                    offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
                )  # fmt: skip
                await wait_until(
                    lambda seen=offsets, last=stored: bool(seen) and seen[-1] >= last,
                    10, f"{stream} read to {stored}",
                )  # fmt: skip
                counts[stream] = sum(1 for offset in offsets if offset <= stored)
        finally:
            await reader.close()
        return counts


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

    async def settled(self, topic: str, channel: str) -> Settled:
        return self._settled(topic, channel)

    def _settled(self, topic: str, channel: str) -> Settled:
        b = self.broker
        return Settled(
            settled=len(b.finished(topic, channel)) + len(b.rejected(topic, channel)),
            unsettled=b.pending(topic, channel),
            retried=len(b.retried(topic, channel)) + b.timed_out(topic, channel),
        )

    async def until_settled(
        self, topic: str, channel: str, settled: int, *, unsettled: int = 0,
        retried: int | None = 0, timeout: float = 20,
    ) -> Settled:  # fmt: skip
        await self.until(
            lambda: self._settled(topic, channel).matches(settled, unsettled, retried),
            timeout, f"{topic}/{channel} settled {settled}, unsettled {unsettled}, retried"
            f" {retried} (now {self._settled(topic, channel)})",
        )  # fmt: skip
        return self._settled(topic, channel)

    async def quiet(self) -> None:
        """Virtual time: a deadline's worth of it passes at once, and what is due runs."""
        self.broker.advance(3 * self.broker.ack_wait)
        await self.broker.run_until_idle(timeout=5)

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
