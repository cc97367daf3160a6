"""One topic/channel on RabbitMQ Streams: the topic's stream and the channel's retry stream,
each read by a single active consumer named after the channel.

A stream has no per-message acknowledgement, redelivery or delivery counter, so this
subscription supplies them:

* **window**: the rstream callback waits while the receiver's window is full; rstream
  grants the next chunk's credit only when it moves on to that chunk, so a slow handler
  holds back the broker instead of filling memory (initial credit 1: one chunk ahead).
* **acks**: the offset stored on the server is the contiguous low watermark of settled
  messages (:mod:`nsqworker.streams.offsets`), written every :data:`STORE_EVERY` seconds,
  at stop and when this process loses the active role, never past an unfinished message.
* **retry after a delay**: the message is appended to ``<topic>.<channel>.retry`` with its
  attempt count and not-before time (AMQP application properties ``x-attempts``,
  ``x-not-before`` in ms); its own offset is then settled. The same channel reads the
  retry stream in order and holds each message until it is due (a longer delay ahead can
  make a shorter one behind it late, never early).
* **fail-over**: both readers subscribe with single active consumer under the channel's
  name; when the active process dies, RabbitMQ activates another, which resumes from the
  stored offset (messages after it may be handled twice, never skipped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nsqworker.message import Message, Undecodable
from nsqworker.streams.amqp import decode
from nsqworker.streams.capabilities import CAPABILITIES
from nsqworker.streams.client import StreamConnections, check_stream
from nsqworker.streams.offsets import Watermark
from nsqworker.transport import Flow, Receiver, SubscriptionStats, Timer

if TYPE_CHECKING:
    from nsqworker.settings import Settings
    from nsqworker.streams.producer import StreamProducer

__all__ = ["StreamSubscription", "retry_stream"]

log = logging.getLogger("nsqworker.streams")

STORE_EVERY = 0.5
"""Seconds between writes of a moved watermark."""
STANDBY_NOTICE = 2.0
"""Seconds after subscribing without being made active before a reader says it stands by
(RabbitMQ tells a consumer when it becomes active, not that it waits)."""
CREDIT = 3
"""Chunks the broker may send ahead of the one being read (rstream grants one more as
it starts each chunk): what a full window holds back beyond itself. One ahead left the
reader waiting on the broker about half the time."""
ATTEMPTS, NOT_BEFORE, UNDECODABLE = b"x-attempts", b"x-not-before", b"x-undecodable"
MAX_NOT_BEFORE = CAPABILITIES.max_retry_delay
"""The longest a retry is held (the transport's ``max_retry_delay``): a later
``x-not-before`` was not written by nsqworker."""
_monotonic = time.monotonic


def retry_stream(topic: str, channel: str) -> str:
    """The stream holding ``channel``'s retries of ``topic``."""
    return f"{topic}.{channel}.retry"


@dataclass(eq=False)
class _Reader:
    stream: str
    retry: bool
    prefix: bytes = b""  # b"<stream>:", the start of each message id
    watermark: Watermark = field(default_factory=Watermark)
    subscription_id: int | None = None
    active: bool = False
    received: int = 0
    chunk: tuple[int, int] = (-1, -1)
    """(the chunk's timestamp, the offset after the last message taken from it)."""
    standing_by: bool = False  # said so in the log since it was last active


class StreamSubscription:
    """``topic`` read by the consumer ``channel``; see the module docstring."""

    def __init__(
        self,
        topic: str,
        channel: str,
        connections: StreamConnections,
        producer: StreamProducer,
        settings: Settings,
        *,
        name: str,
        max_in_flight: int,
    ) -> None:
        self.topic = check_stream(topic)
        self.channel = check_stream(channel, "channel")
        self.name = name
        self.settings = settings
        self.connections = connections
        self.producer = producer
        self.window = max_in_flight
        self.in_flight = 0
        self.readers = [
            _Reader(topic, retry=False, prefix=f"{topic}:".encode()),
            _Reader(check_stream(retry_stream(topic, channel)), retry=True,
                    prefix=f"{retry_stream(topic, channel)}:".encode()),
        ]  # fmt: skip
        self._flow = Flow.OPEN
        self._stopping = False
        self._subscribed = False
        self._room = asyncio.Event()
        self._receiver: Receiver | None = None
        self._deliver: Callable[[Message], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retrying = 0
        self._consumer: Any = None
        self._lost = asyncio.Event()
        self._address = connections.endpoint.address
        self._warned_not_before = False

    def __repr__(self) -> str:
        return f"<StreamSubscription {self.topic}/{self.channel} window={self.window}>"

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Create the streams if missing and subscribe to both as the channel."""
        if self._receiver is not None:
            return
        self._receiver = receiver
        self._deliver = receiver.deliver
        self._loop = asyncio.get_running_loop()
        for reader in self.readers:
            await self.connections.ensure_stream(reader.stream)
        await self._connect()
        self._room.set()
        self._spawn(self._store_loop())
        self._spawn(self._keep())
        self._spawn(self._tell_standby())

    async def _connect(self) -> None:
        self._consumer = consumer = await self.connections.consumer(self._on_close)
        for reader in self.readers:
            reader.subscription_id = await self._subscribe(consumer, reader)
        self._subscribed = True

    async def _on_close(self, info: Any) -> None:
        if not self._stopping and self._subscribed:
            log.warning("%s: connection to RabbitMQ lost (%s); resubscribing", self.name, info)
            self._subscribed = False
            self._lost.set()

    async def _keep(self) -> None:
        """Resubscribe after a lost connection, with backoff; the readers resume from
        the stored offsets (what was in hand then may be handled again, never skipped)."""
        while not self._stopping:
            await self._lost.wait()
            old, self._consumer = self._consumer, None
            if old is not None:
                await self.connections.close_consumer(old)
            delay = self.settings.reconnect_delay
            while not self._stopping:
                try:
                    await self._connect()
                    log.info("%s: resubscribed", self.name)
                    self._spawn(self._tell_standby())
                    break
                except Exception as exc:
                    log.warning(
                        "%s: resubscribing failed (%s); again in %.1fs", self.name, exc, delay
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.settings.max_reconnect_delay)
            self._lost.clear()

    async def _subscribe(self, consumer: Any, reader: _Reader) -> int:
        take = self._take

        def on_message(message: Any, context: Any) -> Coroutine[Any, Any, None] | None:
            # rstream awaits what the callback returns, if anything: the hot path (room
            # in the window, nothing to wait for) returns nothing, and costs no coroutine.
            if reader.retry or self.in_flight >= self._allowed(reader, context):
                return self._on_message(reader, message, context)
            take(reader, message, context)
            return None

        async def on_update(active: bool, context: Any) -> Any:
            return await self._on_update(reader, active)

        subscription_id: int = await consumer.subscribe(
            reader.stream, on_message, decoder=decode, initial_credit=CREDIT,
            properties={"single-active-consumer": "true", "name": self.channel},
            subscriber_name=self.channel, consumer_update_listener=on_update,
        )  # fmt: skip
        return subscription_id

    async def _on_update(self, reader: _Reader, active: bool) -> Any:
        """RabbitMQ made this process the channel's active consumer (or took it away)."""
        from rstream import OffsetSpecification, OffsetType, exceptions

        if not active:
            await self._store(reader)
            reader.active = False
            self._standing_by(reader)
            return OffsetSpecification(OffsetType.NEXT, 0)
        consumer = self._consumer
        reader.watermark = Watermark()
        reader.active = True
        reader.standing_by = False
        try:
            stored = await consumer.query_offset(reader.stream, self.channel)
        except exceptions.OffsetNotFound:
            log.info("%s: active on %s from its start", self.name, reader.stream)
            return OffsetSpecification(OffsetType.FIRST, 0)
        reader.watermark.stored = reader.watermark.value = stored
        log.info("%s: active on %s after offset %d", self.name, reader.stream, stored)
        return OffsetSpecification(OffsetType.OFFSET, stored + 1)

    async def _tell_standby(self) -> None:
        """Say so for each reader RabbitMQ has not made active soon after subscribing."""
        await asyncio.sleep(STANDBY_NOTICE)
        for reader in self.readers:
            if not reader.active and self._subscribed:
                self._standing_by(reader)

    def _standing_by(self, reader: _Reader) -> None:
        """One INFO line when ``reader`` waits as a single-active-consumer standby. The
        protocol says only whether this consumer is active, never which one is, so the
        line names the command that lists the group (this process's connection among
        them, by its name)."""
        if reader.standing_by or self._stopping:
            return
        reader.standing_by = True
        log.info(
            "%s: standing by for %s on %s; the active consumer is another connection"
            " (RabbitMQ does not say which: `rabbitmq-streams list_stream_group_consumers"
            " --stream %s --reference %s` lists the group, this one as 'nsqworker %s');"
            " this process takes over when it stops",
            self.name, self.channel, reader.stream, reader.stream, self.channel,
            self.settings.client_id,
        )  # fmt: skip

    async def stop(self) -> None:
        """Take no more: callbacks wait; the watermarks are written now."""
        self._stopping = True
        self._flow = Flow.PAUSED
        for reader in self.readers:
            await self._store(reader)

    async def close(self) -> None:
        """Wait for retries being appended, write the watermarks, unsubscribe."""
        self._stopping = True
        deadline = _monotonic() + 5.0
        while self._retrying and _monotonic() < deadline:
            await asyncio.sleep(0.02)
        for task in list(self._tasks):
            task.cancel()
        consumer = self._consumer
        for reader in self.readers:
            await self._store(reader)
            if consumer is not None and reader.subscription_id is not None:
                try:
                    await consumer.unsubscribe(reader.subscription_id)
                except Exception:
                    log.debug("unsubscribe failed", exc_info=True)
                reader.subscription_id = None
        if consumer is not None:
            await self.connections.close_consumer(consumer)
        self._consumer = None
        self._subscribed = False

    @property
    def subscribed(self) -> bool:
        """True while both readers are subscribed."""
        return self._subscribed and self._consumer is not None

    @property
    def ready(self) -> bool:
        """Subscribed (as the active consumer or a standby one) and not stopping."""
        return self.subscribed and not self._stopping

    def clock(self) -> float:
        """Monotonic seconds: the clock of ``received_at``."""
        return _monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """``callback`` after ``delay`` seconds, on the loop."""
        return (self._loop or asyncio.get_running_loop()).call_later(delay, callback)

    # --- flow ------------------------------------------------------------------

    def set_flow(self, flow: Flow, window: int) -> None:
        """At most ``window`` unsettled (1 when probing, none when paused)."""
        self._flow, self.window = flow, window
        self._room.set()

    def _allowed(self, reader: _Reader | None = None, context: Any = None) -> int:
        """How many may be unsettled for the next message (of ``reader``, at ``context``).

        A backoff pause withholds credit, so the broker sends nothing more; the rest of
        the chunk being read was already sent, and is delivered as nsqd delivers what it
        put on the wire before RDY 0 (a drain delivers nothing more)."""
        if self._stopping:
            return 0
        if self._flow is Flow.PAUSED:
            if reader is not None and reader.chunk == (context.timestamp, context.offset):
                return self.window
            return 0
        return 1 if self._flow is Flow.PROBE else self.window

    async def _wait_for_room(self, reader: _Reader | None = None, context: Any = None) -> None:
        while self.in_flight >= self._allowed(reader, context):
            self._room.clear()
            await self._room.wait()

    # --- messages --------------------------------------------------------------

    async def _on_message(self, reader: _Reader, message: Any, context: Any) -> None:
        await self._wait_for_room(reader, context)
        if reader.retry and type(message) is not bytes:
            wait = self._wait_until(message.properties.get(NOT_BEFORE))
            if wait > 0:
                await asyncio.sleep(wait)
                await self._wait_for_room(reader, context)
        self._take(reader, message, context)

    def _wait_until(self, due: Any) -> float:
        """Seconds to hold a retry with this ``x-not-before`` (ms since the epoch), at
        most :data:`MAX_NOT_BEFORE`: anyone allowed to write to the retry stream could
        otherwise stall every retry of the channel for ever."""
        if type(due) is not int:
            return 0.0
        wait = due / 1000 - time.time()
        if wait > MAX_NOT_BEFORE:
            if not self._warned_not_before:
                self._warned_not_before = True
                log.warning(
                    "%s: a retry in %s is due in %.0fs, over the bound of %.0fs (not written"
                    " by nsqworker); holding it %.0fs", self.name, self.readers[1].stream,
                    wait, MAX_NOT_BEFORE, MAX_NOT_BEFORE,
                )  # fmt: skip
            wait = MAX_NOT_BEFORE
        return wait

    def _take(self, reader: _Reader, message: Any, context: Any) -> None:
        reason: str | None = None
        attempts = 1
        if type(message) is bytes:  # one data section (streams.amqp.decode)
            body = message
        else:  # a Decoded: properties, several sections, or not AMQP at all
            body, reason = message.body, message.error
            if reader.retry:  # the topic's own stream is always attempt 1 (publishers'
                props = message.properties  # x-attempts are not trusted there)
                count = props.get(ATTEMPTS)
                attempts = count if type(count) is int and count > 1 else 1
                why = props.get(UNDECODABLE)
                if reason is None and why is not None:
                    reason = why if isinstance(why, str) else repr(why)
        offset = context.offset
        reader.chunk = (context.timestamp, offset + 1)
        mark = reader.watermark
        args = (
            reader.prefix + str(offset).encode(), body, context.timestamp * 1_000_000,
            attempts, self.topic, self.channel, self._address, self._receiver,
            (reader, mark, offset), _monotonic(),
        )  # fmt: skip
        msg = Message(*args) if reason is None else Undecodable(*args, reason=reason)
        reader.received += 1
        mark.delivered(offset)
        self.in_flight += 1
        if self._deliver(msg):  # type: ignore[misc]
            mark.settled(offset)
            self.in_flight -= 1

    def _settled(self, reader: _Reader, mark: Watermark, offset: int) -> None:
        # ``mark`` is the watermark of the session that delivered it: after a resubscribe
        # the reader has a new one, and a late settle must not touch it.
        mark.settled(offset)
        self.in_flight -= 1
        self._room.set()

    def ack(self, msg: Message) -> None:
        """The offset may pass this message."""
        self._settled(*msg.receipt)

    def reject(self, msg: Message) -> None:
        """Given up (its dead letter is written): the offset may pass it."""
        self._settled(*msg.receipt)

    def retry(self, msg: Message, delay: float) -> None:
        """Append it to the retry stream, due in ``delay`` seconds; then settle it here."""
        self._retrying += 1
        self._spawn(self._append_retry(msg, delay))

    async def _append_retry(self, msg: Message, delay: float) -> None:
        reader, mark, offset = msg.receipt
        props: dict[str, Any] = {
            "x-attempts": msg.attempts + 1,
            "x-not-before": int((time.time() + delay) * 1000),
        }
        if isinstance(msg, Undecodable):  # its give-up failed: still never a handler's
            props["x-undecodable"] = msg.reason
        backoff = 0.1
        try:
            while True:
                try:
                    await self.producer.send(self.readers[1].stream, [msg.body], props)
                    break
                except Exception as exc:  # the offset stays behind it until this works
                    log.warning("%s: appending a retry failed (%s); again", self.name, exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
            self._settled(reader, mark, offset)
        finally:
            self._retrying -= 1

    def keep_alive(self, msg: Message) -> None:
        """Nothing to extend: a stream has no delivery deadline."""

    def keep_alive_interval(self, msg: Message) -> float | None:
        """None: no keep-alive needed."""
        return None

    def max_hold(self, msg: Message) -> float | None:
        """None: a message may be held as long as it runs."""
        return None

    # --- offsets -----------------------------------------------------------------

    async def _store(self, reader: _Reader) -> None:
        mark = reader.watermark
        consumer = self._consumer
        if not mark.dirty or consumer is None or not reader.active:
            return
        value = mark.value
        assert value is not None
        try:
            await consumer.store_offset(reader.stream, self.channel, value)
            mark.stored = value
        except Exception as exc:
            self.connections.errors["store_offset"] = (
                self.connections.errors.get("store_offset", 0) + 1
            )
            log.warning(
                "%s: storing offset %d of %s failed: %s", self.name, value, reader.stream, exc
            )

    async def _store_loop(self) -> None:
        while True:
            await asyncio.sleep(STORE_EVERY)
            for reader in self.readers:
                await self._store(reader)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """The window, what is in hand, and per stream the watermark and role."""
        return SubscriptionStats(
            connected=int(self.subscribed),
            window=self._allowed(),
            in_flight=self.in_flight,
            errors=dict(self.connections.errors),
            connections=[
                {
                    "address": self.connections.endpoint.address,
                    "stream": r.stream,
                    "active": r.active,
                    "offset": r.watermark.value,
                    "stored": r.watermark.stored,
                    "received": r.received,
                }
                for r in self.readers
            ],
        )

    def describe(self) -> dict[str, Any]:
        """Where this subscription reads from (for logs)."""
        return {
            "rabbitmq": self.connections.endpoint.address,
            "streams": [r.stream for r in self.readers],
        }
