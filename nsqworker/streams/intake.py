"""Handing out what a stream subscription reads: chunks to messages, in order, within the
window (the reading half of :class:`~nsqworker.streams.subscription.StreamSubscription`).

A chunk arrives whole in a link's ``data_received`` (:mod:`nsqworker.streams.link`).
While the window has room its records become messages there and then, walked straight
from the chunk's bytes (:meth:`Intake._walk`, the hot path). A full window keeps the rest
of the chunk, and the chunks after it, in the reader's backlog, handed out in order by
one task per reader as room comes (:meth:`Intake._pump`); retries go that way always,
each held until due (:mod:`nsqworker.streams.held`). Credit for one more chunk is
granted as each chunk is started.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nsqworker.message import Message, Undecodable
from nsqworker.streams import wire
from nsqworker.streams.amqp import Decoded, decode
from nsqworker.streams.offsets import Watermark
from nsqworker.streams.retries import ATTEMPTS, NOT_BEFORE, UNDECODABLE, origin

if TYPE_CHECKING:
    from nsqworker.streams.held import Holds, Item
    from nsqworker.streams.link import StreamLink
    from nsqworker.transport import Receiver

__all__ = ["Intake", "Reader"]

_monotonic = time.monotonic
_DATA_SHORT = b"\x00Su\xa0"  # an AMQP 1.0 data section of a binary up to 255 bytes
_SIZE = struct.Struct(">I")


@dataclass(eq=False)
class Reader:
    stream: str
    retry: bool
    prefix: bytes = b""  # b"<topic>:", the start of each message id
    watermark: Watermark = field(default_factory=Watermark)
    index: int = 0  # its subscription id on its link
    link: StreamLink | None = None
    active: bool = False
    received: int = 0
    start: int = 0
    """The first offset to hand out (RabbitMQ sends the whole chunk holding it)."""
    backlog: deque[list[Any]] = field(default_factory=deque)
    """Chunks waiting for room, in order: [chunk, next record index, credited]."""
    pump: object | None = None
    """The session whose pump task hands out the backlog now (None: none runs)."""
    standing_by: bool = False  # said so in the log since it was last active


class Intake:
    """The reading half of a stream subscription (its owner sets these up)."""

    topic: str
    channel: str
    readers: list[Reader]
    in_flight: int
    _limit: int
    _mid_limit: int
    _room: asyncio.Event
    _session: object | None
    _deliver: Callable[[Message], bool] | None
    _receiver: Receiver | None
    _address: str
    _holds: Holds

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError  # the owner's (SubscriptionKit's), ahead in its bases

    async def _wait_for_room(self, started: bool = False) -> None:
        while self.in_flight >= (self._mid_limit if started else self._limit):
            self._room.clear()
            await self._room.wait()

    # --- messages --------------------------------------------------------------

    def new_session(self) -> object:
        """A new session: from now on only what links pass with it is taken (the
        deliveries of earlier connections are ignored)."""
        self._session = session = object()
        return session

    def on_chunk(self, session: object, chunk: wire.Chunk) -> None:
        """A chunk from a link of ``session`` (in its ``data_received``): handed out now
        while there is room, else kept in order for :meth:`_pump`."""
        if session is not self._session or not 0 <= chunk.subscription_id < len(self.readers):
            return
        reader = self.readers[chunk.subscription_id]
        if reader.backlog or reader.retry or self.in_flight >= self._limit:
            reader.backlog.append([wire.split(chunk), 0, False])
            if reader.pump is not session:
                reader.pump = session
                self._spawn(self._pump(reader, session))
            return
        assert reader.link is not None
        reader.link.credit(reader.index)
        if chunk.records is None:
            rest = self._walk(reader, chunk)
            if rest is None:
                return
            chunk, stop = rest, 0
        else:
            stop = self._hand_out(reader, chunk, 0)
            if stop < 0:
                return
        reader.backlog.append([chunk, stop, True])
        reader.pump = session
        self._spawn(self._pump(reader, session))

    def _walk(self, reader: Reader, chunk: wire.Chunk) -> wire.Chunk | None:
        """Hand out an unsplit chunk's records (see :class:`~nsqworker.streams.wire.Chunk`)
        straight from its bytes while there is room: None when all were handed out, else
        the rest of the chunk, split.

        The hot path: a record that is one AMQP data section of up to 255 bytes (what
        nsqworker and most clients publish) becomes a Message here, with no call per
        record for splitting, decoding or taking; anything else goes through
        :meth:`_take`."""
        data, count, first = chunk.data, chunk.entries, chunk.first_offset
        mark, prefix, deliver = reader.watermark, reader.prefix, self._deliver
        topic, channel, address, owner = self.topic, self.channel, self._address, self._receiver
        delivered, passed, unpack = mark.delivered, mark.passed, _SIZE.unpack_from
        stamp, now, skip = chunk.timestamp * 1_000_000, _monotonic(), reader.start - first
        end, pos, index = len(data), 0, 0
        while index < count:
            if pos + 4 > end:
                break
            size = unpack(data, pos)[0]
            start = pos + 4
            if size & 0x8000_0000 or start + size > end:  # a sub-entry batch, or cut short
                break
            if index < skip:
                pos, index = start + size, index + 1
                continue
            if self.in_flight >= self._mid_limit:
                break
            pos, offset = start + size, first + index
            index += 1
            if size > 4 and data[start : start + 4] == _DATA_SHORT and data[start + 4] == size - 5:
                msg = Message(b"%s%d" % (prefix, offset), data[start + 5 : pos], stamp, 1, topic,
                              channel, address, owner, (reader, mark, offset), now)  # fmt: skip
                msg.origin = (topic, offset)
                # The watermark learns of it after the receiver: finished inline (the
                # common case) it is passed in one step; else it is pending (or was
                # settled already, which delivered() allows for).
                if deliver(msg):  # type: ignore[misc]
                    passed(offset)
                else:
                    self.in_flight += 1
                    delivered(offset)
            else:
                self._take(reader, decode(data[start:pos]), offset, chunk.timestamp)
            reader.received += 1
        return None if index >= count else wire.split(chunk, index, pos)

    def _hand_out(self, reader: Reader, chunk: wire.Chunk, index: int) -> int:
        """Hand out a split chunk's records from ``index`` while there is room (the
        path of chunks kept for room): the index where it stopped, or -1 when every
        record was handed out."""
        records, first = chunk.records, chunk.first_offset
        assert records is not None
        index = max(index, reader.start - first)
        while index < len(records):
            if self.in_flight >= self._mid_limit:
                return index
            record = records[index]
            message = decode(record) if record.__class__ is bytes else record
            self._take(reader, message, first + index, chunk.timestamp)
            reader.received += 1
            index += 1
        return -1

    async def _pump(self, reader: Reader, session: object) -> None:
        """Hand out ``reader``'s kept chunks in order as room comes (retries: each
        held until due)."""
        try:
            while reader.backlog and session is self._session:
                entry = reader.backlog[0]
                chunk, index, credited = entry
                await self._wait_for_room(started=credited)
                if session is not self._session or reader.link is None:
                    return
                if not reader.backlog or reader.backlog[0] is not entry:
                    continue  # dropped meanwhile (a new role): read again from the offset
                if not credited:
                    entry[2] = True
                    reader.link.credit(reader.index)
                if reader.retry:
                    await self._hand_out_retries(reader, session, entry)
                    index = -1
                else:
                    index = entry[1] = self._hand_out(reader, chunk, index)
                if index < 0 and reader.backlog and reader.backlog[0] is entry:
                    reader.backlog.popleft()
        finally:
            if reader.pump is session:
                reader.pump = None

    async def _hand_out_retries(self, reader: Reader, session: object, entry: list[Any]) -> None:
        """Each retry of the chunk in ``entry``: held until due, then handed out; stops
        when the reader's backlog was dropped (a new role, a lost connection)."""
        chunk = entry[0]
        records, first, timestamp = chunk.records, chunk.first_offset, chunk.timestamp
        assert records is not None
        for i in range(max(entry[1], reader.start - first), len(records)):
            record, offset = records[i], first + i
            message = record if type(record) is not bytes else decode(record)
            if type(message) is Decoded:
                wait = self._holds.wait_until(message.properties.get(NOT_BEFORE), reader.stream)
                if wait > 0:
                    item = (reader, reader.watermark, message, offset, timestamp)
                    await self._holds.hold(item, wait)
                    entry[1] = i + 1
                    continue
            await self._wait_for_room(started=True)
            if session is not self._session or not reader.backlog or reader.backlog[0] is not entry:
                return
            self._take(reader, message, offset, timestamp)
            reader.received += 1
            entry[1] = i + 1

    def _current(self, item: Item) -> bool:
        reader, mark = item[0], item[1]
        return mark is reader.watermark and reader.active and self._session is not None

    def _take_due(self, item: Item) -> None:
        reader, _, message, offset, timestamp = item
        self._take(reader, message, offset, timestamp, fresh=False)
        reader.received += 1

    def _take(
        self, reader: Reader, message: Any, offset: int, timestamp: int, fresh: bool = True
    ) -> None:
        """Hand one message (its body as bytes, or a ``Decoded``) to the receiver;
        ``fresh`` False for a held retry (its offset is already in the watermark)."""
        why: str | None = None
        attempts = 1
        first = offset
        if type(message) is bytes:  # one data section (streams.amqp.decode)
            body = message
        else:  # a Decoded: properties, several sections, or not readable at all
            body, why = message.body, message.error
            if reader.retry:  # the topic's own stream is always attempt 1 (publishers'
                props = message.properties  # x-attempts are not trusted there)
                count = props.get(ATTEMPTS)
                attempts = count if type(count) is int and count > 1 else 1
                undecodable = props.get(UNDECODABLE)
                if why is None and undecodable is not None:
                    why = undecodable if isinstance(undecodable, str) else repr(undecodable)
                first, timestamp = origin(props, offset, timestamp)
        mark = reader.watermark
        args = (
            reader.prefix + str(first).encode(), body, timestamp * 1_000_000,
            attempts, self.topic, self.channel, self._address, self._receiver,
            (reader, mark, offset), _monotonic(),
        )  # fmt: skip
        msg = Message(*args) if why is None else Undecodable(*args, reason=why)
        msg.origin = (self.topic, first)
        if fresh:
            mark.delivered(offset)
        self.in_flight += 1
        if self._deliver(msg):  # type: ignore[misc]
            mark.settled(offset)
            self.in_flight -= 1
