"""Osiris chunks, as RabbitMQ delivers them, into records; sans-IO.

A Deliver frame (key 8) carries one chunk: a 48-byte header (magic, chunk type, entry
and record counts, timestamp, epoch, the chunk's first offset, a CRC of the data, the
data's and trailer's lengths, the size of a bloom filter), the filter, then the entries.
An entry is a simple one (a 31-bit size, then the message) or a sub-batch (``0x80`` and
a compression code, a record count, sizes, then records each a 32-bit size and the
message; compression 0 is none, 1 gzip). Each record is one offset: the chunk's first
offset plus its index in the chunk.

Every length is checked: a short, corrupt or unknown chunk raises :class:`ChunkError`,
never ``struct.error`` or a silently short read (a Spark batch that lost records would
be exactly-once about the wrong data).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

from nsqworker.streams.stats import StatsProtocolError

__all__ = ["Chunk", "ChunkError", "decode_chunk"]

_HEADER = struct.Struct(">BbHIqQQiIIB3x")
HEADER_SIZE: Final = _HEADER.size  # 48
USER_DATA: Final = 0
"""The chunk type of messages; RabbitMQ never delivers its tracking chunks (1 and 2)."""
_COMPRESSION = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class ChunkError(StatsProtocolError):
    """A chunk that is short, fails its CRC, or uses a compression we cannot read."""


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``first_offset``, ``timestamp_ms`` (when RabbitMQ wrote it) and its
    ``records`` (the AMQP 1.0 messages, record ``i`` at offset ``first_offset + i``)."""

    first_offset: int
    timestamp_ms: int
    records: list[bytes]


def decode_chunk(payload: bytes | memoryview, version: int = 1) -> Chunk:
    """The chunk of a Deliver frame's payload (the subscription id first; version 2
    puts a committed offset after it)."""
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
    out = _entries(data, entries, first)
    if len(out) != records:
        raise ChunkError(f"chunk at offset {first}: {len(out)} records, its header says {records}")
    return Chunk(first, timestamp, out)


def _entries(data: memoryview, entries: int, first: int) -> list[bytes]:
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
