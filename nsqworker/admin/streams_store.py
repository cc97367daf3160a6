"""Dead letters on RabbitMQ Streams: an append-only log, read without a stored offset;
removals recorded as tombstones.

A stream cannot delete one message, so "removed" means: recorded in the tombstone
stream ``<topic>.nsqworker-removed`` (one confirmed message per removal, its body the
dead letter's offset), and no longer listed, replayed or purged by the tools. The bytes
stay in the dead-letter stream until its retention (``max-age``, ``max-length-bytes``)
drops their segment, and anything else that reads the stream still sees them.

A read subscribes from the tools' watermark (the offset stored under the reference
:data:`REFERENCE`: every dead letter at or below it is removed), with no single active
consumer and no offset stored for anyone else, collects messages until nothing new came
for ``quiet`` seconds, and unsubscribes. The watermark moves up over a prefix of removed
dead letters, so later reads skip them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from nsqworker.admin.stores import QUIET, Stored
from nsqworker.errors import ConfigurationError
from nsqworker.streams.amqp import decode
from nsqworker.streams.client import StreamConnections, check_stream
from nsqworker.streams.producer import StreamProducer

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["REFERENCE", "StreamStore", "tombstone_stream"]

log = logging.getLogger("nsqworker.admin")

REFERENCE: Final = "nsqworker-dead-letters"
"""The offset-tracking reference of the tools' watermark on a dead-letter stream."""
CREDIT: Final = 8


def tombstone_stream(topic: str) -> str:
    """The stream recording the removed dead letters of ``topic``."""
    return f"{topic}.nsqworker-removed"


class StreamStore:
    """A dead-letter stream; see the module docstring."""

    def __init__(self, settings: Settings, topic: str, *, quiet: float = QUIET) -> None:
        self.settings = settings
        self.notes: list[str] = []  # nothing to say: a read here is complete
        self.topic = check_stream(topic)
        self.tombstones = check_stream(tombstone_stream(topic), "topic")
        self.quiet = quiet
        self.connections = StreamConnections(settings)
        self.producer = StreamProducer(settings=settings, connections=self.connections)
        self.removed: set[int] = set()
        self.watermark = -1
        self.read_offsets: list[int] = []

    async def __aenter__(self) -> StreamStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def read(self, limit: int | None = None) -> list[Stored]:
        """The dead letters not removed, in stream order (the order they were written)."""
        from rstream import exceptions

        consumer = await self.connections.consumer()
        if not await _ready(consumer.stream_exists, self.topic):
            return []
        try:
            self.watermark = await _ready(consumer.query_offset, self.topic, REFERENCE)
        except exceptions.OffsetNotFound:
            self.watermark = -1
        tombstones: list[tuple[int, bytes, int]] = []
        if await _ready(consumer.stream_exists, self.tombstones):
            tombstones, messages = await asyncio.gather(
                self._read_all(consumer, self.tombstones, 0),
                self._read_all(consumer, self.topic, self.watermark + 1),
            )
        else:
            messages = await self._read_all(consumer, self.topic, self.watermark + 1)
        self.removed = {int(body) for _, body, _ in tombstones if body.isdigit()}
        self.read_offsets = sorted(offset for offset, _, _ in messages)
        found = [
            Stored(str(offset), body, datetime.fromtimestamp(ms / 1000, UTC))
            for offset, body, ms in sorted(messages)
            if offset > self.watermark and offset not in self.removed
        ]
        await self._advance()
        return found if limit is None else found[:limit]

    async def _read_all(
        self, consumer: Any, stream: str, start: int
    ) -> list[tuple[int, bytes, int]]:
        """``(offset, body, chunk timestamp ms)`` of every message from ``start``."""
        from rstream import ConsumerOffsetSpecification, OffsetType

        loop = asyncio.get_running_loop()
        got: list[tuple[int, bytes, int]] = []
        last = [loop.time()]

        def on_message(message: Any, context: Any) -> None:
            body = message if isinstance(message, bytes) else message.body
            got.append((context.offset, bytes(body), context.timestamp))
            last[0] = loop.time()

        subscription = await consumer.subscribe(
            stream, on_message, decoder=decode, initial_credit=CREDIT,
            offset_specification=ConsumerOffsetSpecification(OffsetType.OFFSET, start),
        )  # fmt: skip
        last[0] = loop.time()
        try:
            while (idle := loop.time() - last[0]) < self.quiet:
                await asyncio.sleep(self.quiet - idle)
        finally:
            try:
                await consumer.unsubscribe(subscription)
            except Exception:
                log.debug("unsubscribe from %s failed", stream, exc_info=True)
        return got

    async def remove(self, item: Stored) -> None:
        """Append the dead letter's tombstone; returns once RabbitMQ confirmed it."""
        offset = int(item.id)
        if offset <= self.watermark:
            raise ConfigurationError(f"dead letter {item.id} was already removed")
        await self.producer.send(self.tombstones, [str(offset).encode()])
        self.removed.add(offset)

    async def _advance(self) -> None:
        """Store the watermark past the removed dead letters at the start of what was read."""
        mark = self.watermark
        for offset in self.read_offsets:
            if offset <= mark:
                continue
            if offset not in self.removed:
                break
            mark = offset
        if mark > self.watermark:
            consumer = await self.connections.consumer()
            await consumer.store_offset(self.topic, REFERENCE, mark)
            self.watermark = mark

    @property
    def failed_removals(self) -> dict[str, str]:
        """None: each removal was answered before :meth:`remove` returned."""
        return {}

    def publisher(self, item: Stored) -> StreamProducer:
        """A producer on the store's connections."""
        return self.producer

    async def close(self) -> None:
        """Move the watermark over what was removed; close the connections."""
        try:
            if self.read_offsets:
                await self._advance()
        except Exception as exc:  # the tombstones are the record; the watermark is a shortcut
            log.debug("storing the watermark of %s failed: %s", self.topic, exc)
        finally:
            await self.connections.close()


async def _ready(call: Any, *args: Any) -> Any:
    """``await call(*args)``, asked again for up to 30 s while RabbitMQ answers "stream not
    available", or not in time: it does for a moment after it created a stream, or while
    it recovers one (the worker's subscription does the same, streams/subscription.py)."""
    from rstream import exceptions

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30.0
    while True:
        try:
            return await call(*args)
        except (exceptions.StreamNotAvailable, TimeoutError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)
