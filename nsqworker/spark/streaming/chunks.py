"""Osiris chunks, as RabbitMQ delivers them, into records; sans-IO.

A Deliver frame (key 8) carries one chunk: a 48-byte header (magic, chunk type, entry
and record counts, timestamp, epoch, the chunk's first offset, a CRC of the data, the
data's and trailer's lengths, the size of a bloom filter), the filter, then the entries.
An entry is a simple one (a 31-bit size, then the message) or a sub-batch (``0x80`` and
a compression code, a record count, sizes, then records each a 32-bit size and the
message; compression 0 is none, 1 gzip). Each record is one offset: the chunk's first
offset plus its index in the chunk.

Two ways to read a chunk's records: :attr:`Chunk.records`, each record's bytes (any
entry, any AMQP message), and :meth:`Chunk.plain_bodies`, the bodies as one Arrow array
when every record is a simple entry holding a single AMQP data section (what nsqworker
and most clients publish): one pass over the entry sizes, then the bodies gathered by
numpy, with no Python object per record.

Every length is checked: a short, corrupt or unknown chunk raises :class:`ChunkError`,
never ``struct.error`` or a silently short read (a Spark batch that lost records would
be exactly-once about the wrong data).
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Final

from nsqworker.streams.stats import StatsProtocolError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Chunk", "ChunkError", "decode_chunk"]

_HEADER = struct.Struct(">BbHIqQQiIIB3x")
_SIZE = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size  # 48
USER_DATA: Final = 0
"""The chunk type of messages; RabbitMQ never delivers its tracking chunks (1 and 2)."""
_COMPRESSION = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_DATA_SECTION = (0x00, 0x53, 0x75)
"""An AMQP 1.0 data section's descriptor; then ``0xa0`` + 1-byte or ``0xb0`` + 4-byte length."""


class ChunkError(StatsProtocolError):
    """A chunk that is short, fails its CRC, or uses a compression we cannot read."""


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``first_offset``, ``timestamp_ms`` (when RabbitMQ wrote it), ``count``
    (its records: record ``i`` is at offset ``first_offset + i``), and its entries'
    ``data`` (CRC checked), read by :attr:`records` or :meth:`plain_bodies`."""

    first_offset: int
    timestamp_ms: int
    count: int
    entries: int = field(repr=False)
    data: bytes | memoryview = field(repr=False)

    @cached_property
    def records(self) -> list[bytes]:
        """Each record's bytes (an AMQP 1.0 message), in offset order.

        Raises:
            ChunkError: an entry runs past the data, a sub-batch cannot be read, or the
                entries hold another number of records than the header says.
        """
        out = _entries(self.data, self.entries, self.first_offset)
        if len(out) != self.count:
            raise ChunkError(
                f"chunk at offset {self.first_offset}: {len(out)} records, "
                f"its header says {self.count}"
            )
        return out

    def plain_bodies(self) -> pa.BinaryArray | None:
        """Every record's body as one Arrow array, when each record is a simple entry
        holding one AMQP data section and nothing else; None when any is not (a
        sub-batch, properties, several sections: read :attr:`records` then)."""
        if self.entries != self.count or not self.count:
            return None
        starts = _simple_entries(self.data, self.entries)
        if starts is None:
            return None
        return _bodies(self.data, starts)


def decode_chunk(payload: bytes | memoryview, version: int = 1) -> Chunk:
    """The chunk of a Deliver frame's payload (the subscription id first; version 2
    puts a committed offset after it).

    Raises:
        ChunkError: a short payload, a wrong magic or chunk type, or a CRC mismatch.
    """
    view = memoryview(payload)
    at = 1 + (8 if version >= 2 else 0)
    if len(view) < at + HEADER_SIZE:
        raise ChunkError(f"Deliver of {len(view)} bytes: shorter than a chunk header")
    (magic, chunk_type, entries, records, timestamp, _epoch, first, crc, data_length,
     _trailer_length, filter_size) = _HEADER.unpack_from(view, at)  # fmt: skip
    if magic >> 4 != 5:
        raise ChunkError(f"chunk magic {magic:#x}, not an osiris chunk")
    if chunk_type != USER_DATA:
        raise ChunkError(f"chunk type {chunk_type} at offset {first}, not messages")
    start = at + HEADER_SIZE + filter_size
    data = view[start : start + data_length]
    if len(data) != data_length:
        raise ChunkError(f"chunk at offset {first}: {len(data)} of {data_length} data bytes")
    if zlib.crc32(data) & 0xFFFFFFFF != crc & 0xFFFFFFFF:
        raise ChunkError(f"chunk at offset {first}: CRC mismatch")
    return Chunk(first, timestamp, records, entries, data)


def _simple_entries(data: bytes | memoryview, entries: int) -> array[int] | None:
    """Where each of ``entries`` simple entries starts, and the data's end last; None
    when an entry is a sub-batch or the sizes do not add up to the data exactly."""
    starts = array("q")
    append, unpack = starts.append, _SIZE.unpack_from
    at, end = 0, len(data)
    for _ in range(entries):
        if at + 4 > end:
            return None
        (size,) = unpack(data, at)
        if size & 0x80000000:  # a sub-batch's header byte
            return None
        append(at)
        at += 4 + size
    if at != end:
        return None
    append(at)
    return starts


def _bodies(data: bytes | memoryview, starts: array[int]) -> pa.BinaryArray | None:
    """The bodies of the simple entries at ``starts`` (each ``size, 0x00 0x53 0x75,
    0xa0 len8 | 0xb0 len32, body``, the body running to the entry's end), gathered into
    one Arrow array; None when any entry is not exactly one data section."""
    import numpy as np
    import pyarrow as pa

    buf = np.frombuffer(data, np.uint8)
    edges = np.frombuffer(starts, np.int64)
    at = edges[:-1]
    sizes = edges[1:] - at - 4  # each record's bytes
    if int(sizes.min()) < 5:
        return None
    head = buf[at[:, None] + np.arange(4, 9)]  # a record's first five bytes
    if not (
        (head[:, 0] == _DATA_SECTION[0])
        & (head[:, 1] == _DATA_SECTION[1])
        & (head[:, 2] == _DATA_SECTION[2])
    ).all():
        return None
    short = head[:, 3] == 0xA0
    body_at = np.where(short, 9, 12)  # from the entry's start
    lengths = sizes + 4 - body_at
    if not (short | (head[:, 3] == 0xB0)).all() or int(lengths.min()) < 0:
        return None
    if not (head[short, 4] == lengths[short]).all():  # vbin8: the length byte
        return None
    if not short.all():
        wide = at[~short] + 8  # vbin32: four bytes, big-endian
        stated = buf[wide[:, None] + np.arange(4)].astype(np.int64) @ np.array(
            [1 << 24, 1 << 16, 1 << 8, 1], np.int64
        )
        if not (stated == lengths[~short]).all():
            return None
    keep = np.ones(len(buf), bool)  # drop each entry's size and AMQP header
    keep[(at[:, None] + np.arange(9)).ravel()] = False
    if not short.all():
        keep[(at[~short, None] + np.arange(9, 12)).ravel()] = False
    offsets = np.zeros(len(at) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 1 << 31:
        return None  # past a BinaryArray's 32-bit offsets: the record path splits it
    values = buf[keep]
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(at), [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)]
    )


def _entries(data: bytes | memoryview, entries: int, first: int) -> list[bytes]:
    out: list[bytes] = []
    at, end = 0, len(data)
    for _ in range(entries):
        if at + 4 > end:
            raise ChunkError(f"chunk at offset {first}: an entry runs past its data")
        head = data[at]
        if not head & 0x80:
            size = int.from_bytes(data[at : at + 4]) & 0x7FFFFFFF
            at += 4
            if at + size > end:
                raise ChunkError(f"chunk at offset {first}: an entry runs past its data")
            out.append(bytes(data[at : at + size]))
            at += size
            continue
        if at + 11 > end:
            raise ChunkError(f"chunk at offset {first}: a sub-batch header runs past its data")
        count = int.from_bytes(data[at + 1 : at + 3])
        size = int.from_bytes(data[at + 7 : at + 11])
        body = data[at + 11 : at + 11 + size]
        if len(body) != size:
            raise ChunkError(f"chunk at offset {first}: a sub-batch runs past its data")
        at += 11 + size
        out += _sub_batch(bytes(body), (head >> 4) & 0x7, count, first)
    return out


def _sub_batch(body: bytes, compression: int, count: int, first: int) -> list[bytes]:
    if compression == 1:
        try:
            body = zlib.decompress(body, wbits=31)
        except zlib.error as exc:
            raise ChunkError(f"chunk at offset {first}: gzip sub-batch: {exc}") from exc
    elif compression != 0:
        name = _COMPRESSION.get(compression, str(compression))
        raise ChunkError(
            f"chunk at offset {first}: a sub-batch compressed with {name}; "
            "only uncompressed and gzip sub-batches can be read"
        )
    out = []
    at = 0
    for _ in range(count):
        if at + 4 > len(body):
            raise ChunkError(f"chunk at offset {first}: a sub-batch record runs past its end")
        size = int.from_bytes(body[at : at + 4])
        at += 4
        if at + size > len(body):
            raise ChunkError(f"chunk at offset {first}: a sub-batch record runs past its end")
        out.append(body[at : at + size])
        at += size
    return out
