"""One topic/channel on RabbitMQ Streams: the topic's stream and the channel's retry streams,
each read by a single active consumer named after the channel.

A stream has no per-message acknowledgement, redelivery or delivery counter, so this
subscription supplies them:

* **reading**: our own connection (:mod:`nsqworker.streams.link`, the codec of
  :mod:`nsqworker.streams.wire`) hands each chunk over whole as it arrives; its messages
  go to the receiver in one loop while the window has room, with no task per chunk or
  message. A full window keeps the rest of the chunk (and the chunks after it) in order
  until room comes.
* **window**: credit for one more chunk is granted as each chunk is started, so the broker
  is at most :data:`CREDIT` chunks ahead: a slow handler holds back the broker instead of
  filling memory.
* **acks**: the offset stored on the server is the contiguous low watermark of settled
  messages (:mod:`nsqworker.streams.offsets`), written every :data:`STORE_EVERY` seconds,
  at stop and when this process loses the active role, never past an unfinished message.
* **retry after a delay**: the message is appended to the retry stream of its delay's
  bucket (``<topic>.<channel>.retry``, ``.retry.10m``, ``.retry.long``) with its attempt
  count, not-before time and origin (:mod:`nsqworker.streams.retries`); its own offset is
  then settled. The same channel reads the retry streams ahead, holds each retry until it
  is due (:mod:`nsqworker.streams.held`) and then hands it to the window, so a long retry
  never holds back a shorter one behind it.
* **fail-over**: every reader subscribes with single active consumer under the channel's
  name; when the active process dies, RabbitMQ activates another, which resumes from the
  stored offset (messages after it may be handled twice, never skipped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from nsqworker.message import Message, Undecodable
from nsqworker.reconnect import reconnect_delay
from nsqworker.streams import wire
from nsqworker.streams.client import StreamConnections, check_stream
from nsqworker.streams.errors import reason
from nsqworker.streams.held import Holds
from nsqworker.streams.intake import Intake, Reader
from nsqworker.streams.offsets import Watermark
from nsqworker.streams.retries import (
    retry_properties,
    retry_stream,
    retry_streams,
)
from nsqworker.subscription_kit import NoDeliveryDeadline, SubscriptionKit
from nsqworker.transport import Flow, Receiver, SubscriptionStats

if TYPE_CHECKING:
    from nsqworker.settings.streams import StreamSettings as Settings
    from nsqworker.streams.link import StreamLink
    from nsqworker.streams.producer import StreamProducer

__all__ = ["StreamSubscription", "retry_stream"]

log = logging.getLogger("nsqworker.streams")

STORE_EVERY = 0.2
"""Seconds between writes of a moved watermark: after a crash of RabbitMQ or of this
process, what is handled again is what was in flight plus what was handled in the last
``STORE_EVERY`` seconds (docs/rabbitmq-streams.md, "When RabbitMQ crashes")."""
STANDBY_NOTICE = 2.0
"""Seconds after subscribing without being made active before a reader says it stands by
(RabbitMQ tells a consumer when it becomes active, not that it waits)."""
CREDIT = 3
"""Chunks the broker may send ahead of the one being read (one more is granted as each
chunk is started): what a full window holds back beyond itself."""
_monotonic = time.monotonic


class StreamSubscription(SubscriptionKit, NoDeliveryDeadline, Intake):
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
        super().__init__(
            check_stream(topic), check_stream(channel, "channel"), name=name,
            window=max_in_flight, errors=connections.errors,
        )  # fmt: skip
        self.settings = settings
        self.connections = connections
        self.producer = producer
        self.in_flight = 0
        self.readers = [Reader(topic, retry=False, prefix=f"{topic}:".encode())] + [
            Reader(check_stream(name), retry=True, prefix=f"{topic}:".encode(), index=i + 1)
            for i, name in enumerate(retry_streams(topic, channel))
        ]
        self._limit = self._mid_limit = max_in_flight
        self._subscribed = False
        self._room = asyncio.Event()
        self._retrying = 0
        self._links: list[StreamLink] = []
        self._session: object | None = None
        """The connections whose deliveries are handed out: None once one is lost."""
        self._lost = asyncio.Event()
        self._address = connections.endpoint.address
        self._holds = Holds(name, self._take_due, self._wait_for_room, self._current)

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Create the streams if missing and subscribe to each as the channel."""
        if not self._starting(receiver):
            return
        for reader in self.readers:
            await self.connections.ensure_stream(reader.stream)
        deadline = _monotonic() + 30.0
        while True:
            try:
                await self._connect()
                break
            except wire.BrokerRefused as exc:  # a stream just created: not available yet
                if exc.code != wire.STREAM_NOT_AVAILABLE or _monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
            except Exception as exc:
                if (error := await self.connections.unresolved(self.topic, exc)) is not None:
                    raise error from None
                raise
        self._room.set()
        self._spawn(self._store_loop())
        self._spawn(self._keep())
        self._spawn(self._holds.hand_on_due())
        self._spawn(self._tell_standby())

    async def _connect(self) -> None:
        """A connection to the URI's broker, which says where each stream is read
        (RabbitMQ's advertised host and port); one connection per broker named."""
        session = self.new_session()
        callbacks = (
            partial(self.on_chunk, session),
            partial(self._on_update, session),
            partial(self._on_lost, session),
        )
        home = (self.connections.endpoint.host, self.connections.endpoint.port)
        try:
            first = await self.connections.link(home, *callbacks)
            self._links.append(first)
            places = await first.brokers([reader.stream for reader in self.readers])
            by_address = {home: first}
            for reader in self.readers:
                address = places[reader.stream]
                link = by_address.get(address)
                if link is None:
                    link = by_address[address] = await self.connections.link(address, *callbacks)
                    self._links.append(link)
                reader.link = link
                await link.subscribe(
                    reader.index, reader.stream, wire.FIRST, 0, CREDIT,
                    {"single-active-consumer": "true", "name": self.channel},
                )  # fmt: skip
            if not any(reader.link is first for reader in self.readers):
                self._links.remove(first)
                first.abort()
        except BaseException:
            self._drop_links()
            raise
        self._subscribed = True

    def _drop_links(self) -> None:
        self._session = None
        for link in self._links:
            link.abort()
        self._links = []
        for reader in self.readers:
            reader.link = None
            reader.backlog.clear()

    def _on_lost(self, session: object, why: str) -> None:
        if session is not self._session or self._stopping:
            return
        log.warning("%s: connection to RabbitMQ lost (%s); resubscribing", self.name, why)
        self._subscribed = False
        self._session = None  # what was read ahead on it is not handed out
        self._lost.set()

    async def _keep(self) -> None:
        """Resubscribe after a lost connection, with backoff; the readers resume from
        the stored offsets (what was in hand then may be handled again, never skipped)."""
        while not self._stopping:
            await self._lost.wait()
            failures = 0
            while not self._stopping:
                self._drop_links()
                try:
                    await self._connect()
                    log.info("%s: resubscribed", self.name)
                    self._spawn(self._tell_standby())
                    break
                except Exception as exc:
                    failures += 1
                    delay = reconnect_delay(
                        failures, self.settings.reconnect_delay, self.settings.max_reconnect_delay
                    )
                    log.warning(
                        "%s: resubscribing failed (%s); again in %.1fs",
                        self.name, reason(exc), delay,
                    )  # fmt: skip
                    await asyncio.sleep(delay)
            self._lost.clear()

    async def _on_update(self, session: object, index: int, active: bool) -> tuple[int, int]:
        """RabbitMQ made this process the channel's active consumer (or took it away):
        where to read from."""
        if session is not self._session or not 0 <= index < len(self.readers):
            return wire.NEXT, 0
        reader = self.readers[index]
        self._holds.drop(reader)  # read again from the stored offset, by whoever is active
        reader.backlog.clear()
        if not active:
            await self._store(reader)
            reader.active = False
            self._standing_by(reader)
            return wire.NEXT, 0
        reader.watermark = Watermark()
        reader.active = True
        reader.standing_by = False
        stored = await self._stored_offset(reader)
        if stored is None:
            log.info("%s: active on %s from its start", self.name, reader.stream)
            reader.start = 0
            return wire.FIRST, 0
        reader.watermark.stored = reader.watermark.value = stored
        reader.start = stored + 1
        log.info("%s: active on %s after offset %d", self.name, reader.stream, stored)
        return wire.OFFSET, stored + 1

    async def _stored_offset(self, reader: Reader) -> int | None:
        """The channel's stored offset on the reader's stream (None: none stored). Just
        after a restart RabbitMQ may answer "stream not available", or not in time, while
        it recovers its streams: ask again for up to a minute."""
        delay, deadline = 0.1, _monotonic() + 60.0
        while True:
            link = reader.link
            if link is None:
                raise ConnectionError(f"{reader.stream}: not connected")
            try:
                return await link.query_offset(self.channel, reader.stream)
            except wire.BrokerRefused as exc:
                if exc.code == wire.NO_OFFSET:
                    return None
                if exc.code != wire.STREAM_NOT_AVAILABLE or self._late(deadline):
                    raise
                why: BaseException = exc
            except TimeoutError as exc:
                if self._late(deadline):
                    raise
                why = exc
            log.info(
                "%s: offset of %s not readable yet (%s)", self.name, reader.stream, reason(why)
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _late(self, deadline: float) -> bool:
        return self._stopping or _monotonic() > deadline

    async def _tell_standby(self) -> None:
        """Say so for each reader RabbitMQ has not made active soon after subscribing."""
        await asyncio.sleep(STANDBY_NOTICE)
        for reader in self.readers:
            if not reader.active and self._subscribed:
                self._standing_by(reader)

    def _standing_by(self, reader: Reader) -> None:
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
        """Take no more: what is read ahead waits; the watermarks are written now."""
        self._stopping = True
        self._set_limits(Flow.PAUSED)
        for reader in self.readers:
            await self._store(reader)

    async def close(self) -> None:
        """Wait for retries being appended, write the watermarks, unsubscribe."""
        self._stopping = True
        self._set_limits(Flow.PAUSED)
        deadline = _monotonic() + 5.0
        while self._retrying and _monotonic() < deadline:
            await asyncio.sleep(0.02)
        self._cancel_tasks()
        for reader in self.readers:
            self._holds.drop(reader)  # not stored past: read again by the next consumer
            await self._store(reader)
            link = reader.link
            if link is not None and not link.closed:
                try:
                    await link.unsubscribe(reader.index)
                except Exception:
                    log.debug("unsubscribe failed", exc_info=True)
        for link in self._links:
            await link.close()
        self._drop_links()
        self._subscribed = False

    @property
    def subscribed(self) -> bool:
        """True while every reader is subscribed."""
        return self._subscribed and self._session is not None

    # --- flow ------------------------------------------------------------------

    def set_flow(self, flow: Flow, window: int) -> None:
        """At most ``window`` unsettled (1 when probing, none when paused)."""
        self.window = window
        self._set_limits(flow)
        self._room.set()

    def _set_limits(self, flow: Flow) -> None:
        """How many may be unsettled before the next message of the chunk being read
        (``_mid_limit``) and before starting a chunk (``_limit``). A backoff pause
        withholds credit, so the broker sends nothing more; the rest of the chunk being
        read was already sent, and is delivered as nsqd delivers what it put on the wire
        before RDY 0 (a drain delivers nothing more)."""
        self._flow = flow
        self._limit = self._allowed()
        self._mid_limit = self.window if flow is Flow.PAUSED and not self._stopping else self._limit

    def _settled(self, reader: Reader, mark: Watermark, offset: int) -> None:
        # ``mark`` is the watermark of the session that delivered it: after a resubscribe
        # the reader has a new one, and a late settle must not touch it.
        mark.settled(offset)
        self.in_flight -= 1
        self._room.set()

    def finish(self, msg: Message) -> None:
        """The offset may pass this message."""
        self._settled(*msg.receipt)

    def reject(self, msg: Message) -> None:
        """Rejected (its dead letter is written): the offset may pass it."""
        self._settled(*msg.receipt)

    def retry(self, msg: Message, delay: float) -> None:
        """Append it to the retry stream, due in ``delay`` seconds; then settle it here."""
        self._retrying += 1
        self._spawn(self._append_retry(msg, delay))

    async def _append_retry(self, msg: Message, delay: float) -> None:
        reader, mark, offset = msg.receipt
        props = retry_properties(msg, delay, time.time())
        stream = retry_stream(self.topic, self.channel, delay)
        if isinstance(msg, Undecodable):  # its reject failed: still never a handler's
            props["x-undecodable"] = msg.reason
        backoff = 0.1
        try:
            while True:
                try:
                    await self.producer.send(stream, [msg.body], props)
                    break
                except Exception as exc:  # the offset stays behind it until this works
                    log.warning("%s: appending a retry failed (%s); again", self.name, reason(exc))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
            self._settled(reader, mark, offset)
        finally:
            self._retrying -= 1

    # --- offsets -----------------------------------------------------------------

    async def _store(self, reader: Reader) -> None:
        mark, link = reader.watermark, reader.link
        if not mark.dirty or link is None or link.closed or not reader.active:
            return
        value = mark.value
        assert value is not None
        try:
            link.store_offset(self.channel, reader.stream, value)
            mark.stored = value
        except Exception as exc:
            self._count_error("store_offset")
            log.warning(
                "%s: storing offset %d of %s failed: %s",
                self.name, value, reader.stream, reason(exc),
            )  # fmt: skip

    async def _store_loop(self) -> None:
        while True:
            await asyncio.sleep(STORE_EVERY)
            for reader in self.readers:
                await self._store(reader)

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """The window, what is in hand, and per stream the watermark and role."""
        return SubscriptionStats(
            connected=int(self.subscribed),
            window=self._limit,
            in_flight=self.in_flight,
            errors=self._error_counts(),
            connections=[
                {
                    "address": r.link.address if r.link is not None else self._address,
                    "stream": r.stream,
                    "active": r.active,
                    "offset": r.watermark.value,
                    "stored": r.watermark.stored,
                    "received": r.received,
                    "held": self._holds.held(r),
                }
                for r in self.readers
            ],
        )
