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
for ``quiet`` seconds (or, with a ``limit``, until that many dead letters are in hand:
a listing of the first 500 never reads a stream of 200,000), and unsubscribes. The
watermark moves up over a prefix of removed dead letters, so later reads skip them.

A replay publishes under the publisher reference ``nsqworker-replay-<topic>`` with the
dead letter's offset + 1 as its publishing id: RabbitMQ stores a publishing id only once
per reference and stream, so a replay run again after a crash between its publish and
its tombstone, or two replays at once, store each dead letter once. Ids must rise, so a
dead letter older than the last one replayed to the same stream (one skipped by an
earlier ``--id`` replay) is published without that id, and the replay says so.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from nsqworker.admin.stores import QUIET, Stored
from nsqworker.errors import ConfigurationError, PublishError
from nsqworker.streams.amqp import decode
from nsqworker.streams.client import StreamConnections, check_stream
from nsqworker.streams.producer import StreamProducer

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["REFERENCE", "StreamStore", "replay_reference", "tombstone_stream"]

log = logging.getLogger("nsqworker.admin")

REFERENCE: Final = "nsqworker-dead-letters"
"""The offset-tracking reference of the tools' watermark on a dead-letter stream."""
CREDIT: Final = 8


def replay_reference(topic: str) -> str:
    """The publisher reference of the replays of the dead-letter stream ``topic``."""
    return f"nsqworker-replay-{topic}"


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
        self.replayer = StreamProducer(
            settings=settings, connections=self.connections, reference=replay_reference(topic)
        )
        self._last_replayed: dict[str, int] = {}
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
            tombstones = await self._read_all(consumer, self.tombstones, 0)
        self.removed = {int(body) for _, body, _ in tombstones if body.isdigit()}
        messages = await self._read_all(consumer, self.topic, self.watermark + 1, limit)
        self.read_offsets = sorted(offset for offset, _, _ in messages)
        found = [
            Stored(str(offset), body, datetime.fromtimestamp(ms / 1000, UTC))
            for offset, body, ms in sorted(messages)
            if offset > self.watermark and offset not in self.removed
        ]
        await self._advance()
        return found if limit is None else found[:limit]

    async def _read_all(
        self, consumer: Any, stream: str, start: int, limit: int | None = None
    ) -> list[tuple[int, bytes, int]]:
        """``(offset, body, chunk timestamp ms)`` of every message from ``start``; with
        ``limit``, the read ends once that many not removed are in hand."""
        from rstream import ConsumerOffsetSpecification, OffsetType

        loop = asyncio.get_running_loop()
        got: list[tuple[int, bytes, int]] = []
        last = [loop.time()]
        enough = loop.create_future()
        kept = [0]

        def on_message(message: Any, context: Any) -> None:
            if enough.done():
                return  # the rest of a chunk past the limit: not needed
            body = message if isinstance(message, bytes) else message.body
            got.append((context.offset, bytes(body), context.timestamp))
            last[0] = loop.time()
            if limit is not None and context.offset not in self.removed:
                kept[0] += 1
                if kept[0] >= limit:
                    enough.set_result(None)

        subscription = await consumer.subscribe(
            stream, on_message, decoder=decode, initial_credit=CREDIT,
            offset_specification=ConsumerOffsetSpecification(OffsetType.OFFSET, start),
        )  # fmt: skip
        last[0] = loop.time()
        try:
            while (idle := loop.time() - last[0]) < self.quiet and not enough.done():
                await asyncio.wait([enough], timeout=self.quiet - idle)
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
        await _ready(self._tombstone, offset)
        self.removed.add(offset)

    async def _tombstone(self, offset: int) -> None:
        try:
            await self.producer.send(self.tombstones, [str(offset).encode()])
        except PublishError as exc:
            if exc.code != "E_STREAMNOTAVAILABLE":
                raise
            # made a moment ago (by another replay or purge at once): not ready yet
            from rstream.exceptions import StreamNotAvailable

            raise StreamNotAvailable(str(exc)) from None

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

    async def publish(self, item: Stored, topic: str, body: bytes) -> None:
        """Publish under the replay reference, the dead letter's offset + 1 as the
        publishing id (without it, and with a note, when a later one went there first)."""
        publishing_id = int(item.id) + 1
        if topic not in self._last_replayed:
            self._last_replayed[topic] = await self._sequence(topic)
        if publishing_id < self._last_replayed[topic]:
            self.notes.append(
                f"dead letter {item.id} was replayed to {topic} without de-duplication: a"
                " later dead letter of the same stream was replayed there first"
            )
            await self.producer.send(topic, [body])
            return
        await self.replayer.send(topic, [body], publishing_ids=[publishing_id])
        self._last_replayed[topic] = publishing_id

    async def _sequence(self, topic: str) -> int:
        """The last publishing id RabbitMQ stored for the replay reference on ``topic``."""
        from rstream import exceptions

        client = await (await self.connections.producer()).default_client
        try:
            return int(await client.query_publisher_sequence(topic, self.replayer.reference))
        except exceptions.StreamDoesNotExist:
            return 0

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
