"""Handing out chunks on RabbitMQ Streams without a broker: a chunk as a link hands it
over, a receiver that finishes some messages inline and leaves others pending, and a
small window. Every record is handed out once, in offset order, with the right body;
what the window cannot take waits in order; the watermark never passes a pending one."""

from __future__ import annotations

import asyncio
import struct
import zlib
from typing import Any

from nsqworker.message import Message, Undecodable
from nsqworker.settings import Settings
from nsqworker.streams import wire
from nsqworker.streams.client import StreamConnections
from nsqworker.streams.subscription import StreamSubscription
from nsqworker.testing import wait_until


def entry(record: bytes) -> bytes:
    return struct.pack(">I", len(record)) + record


def amqp(body: bytes) -> bytes:
    return b"\x00Su\xa0" + bytes((len(body),)) + body


def chunk_frame(records: list[bytes], first: int) -> bytes:
    data = b"".join(map(entry, records))
    crc = zlib.crc32(data)
    return struct.pack(
        ">HHBbbHIqQQiIII", 8, 1, 0, 0x50, 0, len(records), len(records), 1_000, 1, first,
        crc - (1 << 32) if crc >= 1 << 31 else crc, len(data), 0, 0,
    ) + data  # fmt: skip


class Link:
    address = "127.0.0.1:5552"
    closed = False

    def __init__(self) -> None:
        self.credits = 0

    def credit(self, index: int, count: int = 1) -> None:
        self.credits += count


class Receiver:
    """Finishes inline every message whose body does not start with ``slow`` (an
    undecodable one is pending: the task layer gives it up, then rejects it)."""

    def __init__(self) -> None:
        self.seen: list[Message] = []

    def deliver(self, msg: Message) -> bool:
        self.seen.append(msg)
        return not msg.body.startswith(b"slow") and not isinstance(msg, Undecodable)


async def subscription(
    window: int, start: int = 0, receiver: Receiver | None = None
) -> tuple[StreamSubscription, Any, Receiver]:
    """A subscription bound to ``receiver`` and reading a session of its own, with no
    broker: the test hands it chunks as a link of that session would."""
    settings = Settings(transport="rabbitmq-stream")
    sub = StreamSubscription(
        "t", "c", StreamConnections(settings), None, settings,  # type: ignore[arg-type]
        name="t/c", max_in_flight=window,
    )  # fmt: skip
    receiver = receiver or Receiver()
    sub.bind(receiver)  # type: ignore[arg-type]
    session = sub.new_session()
    reader = sub.readers[0]
    reader.link, reader.active, reader.start = Link(), True, start  # type: ignore[assignment]
    return sub, session, receiver


async def test_a_chunk_is_handed_out_whole_in_order_and_the_window_holds_the_rest() -> None:
    sub, session, receiver = await subscription(window=2)
    bodies = [b"a", b"slow b", b"c", b"slow d", b"e", b"f"]
    records = [amqp(b) for b in bodies]
    records[4] = b"\xff\xff"  # not AMQP: handed out as undecodable, in its place
    sub.on_chunk(session, wire.parse_chunk(chunk_frame(records, 10), lazy=True))
    assert [m.body for m in receiver.seen] == [b"a", b"slow b", b"c", b"slow d"]
    mark = sub.readers[0].watermark
    assert mark.value == 10 and sub.in_flight == 2  # the window is full: the rest waits
    sub.finish(receiver.seen[1])
    await wait_until(lambda: len(receiver.seen) == 5, 5, message="room for one more")
    assert isinstance(receiver.seen[4], Undecodable) and receiver.seen[4].body == b"\xff\xff"
    sub.reject(receiver.seen[4])
    await wait_until(lambda: len(receiver.seen) == 6, 5, message="the rest of the chunk")
    assert [m.id for m in receiver.seen] == [f"t:{o}" for o in range(10, 16)]
    assert receiver.seen[5].body == b"f" and mark.value == 12  # 13 is still pending
    sub.finish(receiver.seen[3])
    assert mark.value == 15 and sub.in_flight == 0
    await sub.close()


async def test_offsets_before_the_start_are_skipped_and_credit_is_granted_per_chunk() -> None:
    sub, session, receiver = await subscription(window=100, start=12)
    for first in (10, 15):
        records = [amqp(b"m%d" % o) for o in range(first, first + 5)]
        sub.on_chunk(session, wire.parse_chunk(chunk_frame(records, first), lazy=True))
    assert [m.body for m in receiver.seen] == [b"m%d" % o for o in range(12, 20)]
    assert sub.readers[0].link.credits == 2  # type: ignore[union-attr]
    assert sub.readers[0].watermark.value == 19
    await sub.close()


async def test_a_settle_during_the_hand_out_is_not_lost() -> None:
    """A receiver that settles a message before returning (a give-up written at once):
    the watermark must still pass it."""

    class Rejecting(Receiver):
        def deliver(self, msg: Message) -> bool:
            self.seen.append(msg)
            sub.reject(msg)
            return False

    sub, session, receiver = await subscription(window=10, receiver=Rejecting())
    records = [amqp(b"x"), amqp(b"y")]
    sub.on_chunk(session, wire.parse_chunk(chunk_frame(records, 0), lazy=True))
    await asyncio.sleep(0)
    assert sub.readers[0].watermark.value == 1 and sub.in_flight == 0
    assert [m.body for m in receiver.seen] == [b"x", b"y"]
    await sub.close()


async def test_a_walked_chunk_with_a_sub_entry_batch_goes_on_split() -> None:
    """A chunk whose entries each hold one record can still hold a sub-entry batch of
    one (or a record cut short): the walk stops there and the rest is split, in order."""
    sub, session, receiver = await subscription(window=100)
    batch = amqp(b"in a batch")
    one = bytes((0x80,)) + struct.pack(">HII", 1, len(batch) + 4, len(batch) + 4) + entry(batch)
    data = entry(amqp(b"first")) + one + entry(amqp(b"last"))
    crc = zlib.crc32(data)
    frame = struct.pack(
        ">HHBbbHIqQQiIII", 8, 1, 0, 0x50, 0, 3, 3, 1_000, 1, 40,
        crc - (1 << 32) if crc >= 1 << 31 else crc, len(data), 0, 0,
    ) + data  # fmt: skip
    chunk = wire.parse_chunk(frame, lazy=True)
    assert chunk.records is None
    sub.on_chunk(session, chunk)
    await wait_until(lambda: len(receiver.seen) == 3, 5, message="every record")
    assert [(m.id, m.body) for m in receiver.seen] == [
        ("t:40", b"first"),
        ("t:41", b"in a batch"),
        ("t:42", b"last"),
    ]
    assert sub.readers[0].watermark.value == 42
    await sub.close()
