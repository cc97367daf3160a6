"""The RabbitMQ stream protocol's consumer side without I/O: commands to bytes, bytes to
frames and chunks (shared/protocol/rabbitmq-stream-protocol.md; the Java client and
RabbitMQ 4.0 are the reference where that text is older: Deliver's osiris chunk header,
ConsumerUpdate, sub-entry batches).

Nothing here awaits or touches a socket. Encoders are pure functions returning the exact
bytes to send; :class:`FrameReader` takes bytes split anywhere and hands back whole
frames; :func:`parse_chunk` turns a Deliver frame into its records. A record that cannot
be read (a CRC that does not match, an entry that runs past the chunk, a sub-entry batch
compressed with a codec we lack) is handed on as a :class:`~nsqworker.streams.amqp.Decoded`
with ``error`` set, in its place, so its offset is dead-lettered and passed, never lost;
a frame that cannot be a stream frame at all (a size over the limit, a Deliver too short
for its header) is a :class:`~nsqworker.errors.RemoteProtocolError`: the connection is
dropped and the subscription resumes from its stored offset.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, NamedTuple

from nsqworker.errors import NSQWorkerError, RemoteProtocolError
from nsqworker.streams.amqp import Decoded

# The keys and codes shared with stats.py, re-exported for the reading side.
from nsqworker.streams.stats import (
    CLOSE as CLOSE,
)
from nsqworker.streams.stats import (
    CREDIT as CREDIT,
)
from nsqworker.streams.stats import (
    DELIVER as DELIVER,
)
from nsqworker.streams.stats import (
    HEARTBEAT as HEARTBEAT,
)
from nsqworker.streams.stats import (
    NO_OFFSET as NO_OFFSET,
)
from nsqworker.streams.stats import (
    OK as OK,
)
from nsqworker.streams.stats import (
    OPEN as OPEN,
)
from nsqworker.streams.stats import (
    PEER_PROPERTIES as PEER_PROPERTIES,
)
from nsqworker.streams.stats import (
    QUERY_OFFSET as QUERY_OFFSET,
)
from nsqworker.streams.stats import (
    RESPONSE_BIT,
)
from nsqworker.streams.stats import (
    SASL_AUTHENTICATE as SASL_AUTHENTICATE,
)
from nsqworker.streams.stats import (
    SASL_HANDSHAKE as SASL_HANDSHAKE,
)
from nsqworker.streams.stats import (
    STREAM_DOES_NOT_EXIST as STREAM_DOES_NOT_EXIST,
)
from nsqworker.streams.stats import (
    SUBSCRIBE as SUBSCRIBE,
)
from nsqworker.streams.stats import (
    TUNE as TUNE,
)
from nsqworker.streams.stats import (
    UNSUBSCRIBE as UNSUBSCRIBE,
)
from nsqworker.streams.stats import encode_frame as _frame
from nsqworker.streams.stats import encode_string as _string

__all__ = [
    "MAX_FRAME",
    "BrokerRefused",
    "Chunk",
    "FrameReader",
    "parse_chunk",
]

# Keys and codes beyond those shared with stats.py.
RESPONSE: Final = RESPONSE_BIT  # the high bit of a key marks a response
METADATA: Final = 15
METADATA_UPDATE: Final = 16
STORE_OFFSET: Final = 10
CONSUMER_UPDATE: Final = 26
STREAM_NOT_AVAILABLE: Final = 6

FIRST: Final = 1
NEXT: Final = 3
OFFSET: Final = 4

MAX_FRAME: Final = 64 * 1024 * 1024
"""A frame larger than this is taken as a broken or hostile peer, not a chunk (RabbitMQ's
chunks are a publisher's batch or a few of them: far smaller)."""

_COMPRESSION: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
_U32: Final = struct.Struct(">I")
_HEAD: Final = struct.Struct(">HH")
_CHUNK: Final = struct.Struct(">BbbHIqQQiIII")  # sub id, magic, type, entries ... reserved
_SUB_ENTRY: Final = struct.Struct(">HII")
_RESPONSE: Final = struct.Struct(">HHIH")  # key, version, correlation id, code


class BrokerRefused(NSQWorkerError):
    """Raised when RabbitMQ answers a request with a response code other than OK;
    ``code`` is that code (see :data:`nsqworker.streams.errors.RESPONSE_CODES`)."""

    def __init__(self, code: int, what: str) -> None:
        from nsqworker.streams.errors import RESPONSE_CODES

        super().__init__(f"{what}: {RESPONSE_CODES.get(code, 'unknown')} (response code {code})")
        self.code = code


class Chunk(NamedTuple):
    """One Deliver frame: its subscription, the chunk's timestamp (ms since the epoch),
    the offset of its first record, and the records in order (bytes, or a ``Decoded``
    with ``error`` set for one that cannot be read).

    ``records`` is None for a chunk read with ``lazy=True`` whose entries are each one
    record and whose CRC matched: ``data`` then holds its ``entries`` (a size and
    the record, each), for a reader that walks them itself; :func:`split` makes the
    list from the rest of such a chunk."""

    subscription_id: int
    timestamp: int
    first_offset: int
    records: list[bytes | Decoded] | None
    data: bytes = b""
    entries: int = 0


class FrameReader:
    """Bytes in, frames out: ``feed(data)`` returns the whole frames (``bytes`` without
    the size) completed by ``data``, in order."""

    __slots__ = ("_buffer", "limit")

    def __init__(self, limit: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self.limit = limit

    def feed(self, data: bytes) -> list[bytes]:
        """The frames ``data`` completes.

        Raises:
            RemoteProtocolError: a frame size over ``limit`` or under 4.
        """
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        start, end = 0, len(buffer)
        while end - start >= 4:
            (size,) = _U32.unpack_from(buffer, start)
            if size > self.limit or size < 4:
                raise RemoteProtocolError(
                    f"stream frame of {size} bytes (a frame is 4 to {self.limit} bytes)"
                )
            if end - start - 4 < size:
                break
            frames.append(bytes(buffer[start + 4 : start + 4 + size]))
            start += 4 + size
        if start:
            del buffer[:start]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buffer)


def frame_key(frame: bytes) -> int:
    """The key of a frame (with the response bit)."""
    return int(_HEAD.unpack_from(frame)[0])


def parse_response(frame: bytes) -> tuple[int, int, int]:
    """``(key without the response bit, correlation id, response code)``.

    Raises:
        RemoteProtocolError: too short for a response.
    """
    if len(frame) < _RESPONSE.size:
        raise RemoteProtocolError(f"stream response of {len(frame)} bytes, too short")
    key, _, correlation, code = _RESPONSE.unpack_from(frame)
    return key & 0x7FFF, correlation, code


def parse_chunk(frame: bytes, check_crc: bool = True, lazy: bool = False) -> Chunk:
    """The records of a Deliver frame (version 1); with ``lazy``, a chunk of simple
    entries is left unsplit (see :class:`Chunk`).

    Raises:
        RemoteProtocolError: too short for its header, or not an osiris chunk (magic).
    """
    if len(frame) < 4 + _CHUNK.size:
        raise RemoteProtocolError(f"Deliver frame of {len(frame)} bytes, too short for a chunk")
    (sub, magic, _type, entries, records, timestamp, _epoch, first, crc, length, _trailer,
     _reserved) = _CHUNK.unpack_from(frame, 4)  # fmt: skip
    if magic >> 4 != 5:
        raise RemoteProtocolError(f"Deliver frame with chunk magic {magic:#x}, not an osiris chunk")
    if _type != 0:  # not user data (tracking): RabbitMQ sends none to consumers
        return Chunk(sub, timestamp, first, [])
    start = 4 + _CHUNK.size
    data = frame[start : start + length]  # the trailer (writer tracking) follows it
    if len(data) != length:
        why = f"chunk at offset {first} holds {len(data)} bytes of data, its header says {length}"
        return Chunk(sub, timestamp, first, _unreadable(records, why))
    if check_crc and zlib.crc32(data) & 0xFFFFFFFF != crc & 0xFFFFFFFF:
        why = f"chunk at offset {first} fails its CRC-32 check"
        return Chunk(sub, timestamp, first, _unreadable(records, why))
    if lazy and entries == records:
        return Chunk(sub, timestamp, first, None, data, records)
    return Chunk(sub, timestamp, first, _split(data, entries, records, first))


def split(chunk: Chunk, index: int = 0, position: int = 0) -> Chunk:
    """``chunk`` from its record ``index`` on (at byte ``position`` of its ``data``),
    with its records as a list."""
    if chunk.records is not None:
        return chunk._replace(
            first_offset=chunk.first_offset + index, records=chunk.records[index:]
        )
    count, first = chunk.entries - index, chunk.first_offset + index
    records = _split(chunk.data[position:], count, count, first)
    return Chunk(chunk.subscription_id, chunk.timestamp, first, records)


def _split(data: bytes, entries: int, records: int, first: int) -> list[bytes | Decoded]:
    if entries == records:
        out = _simple_entries(data, entries, first)
    else:
        out = _entries(data, entries, first)
    if len(out) != records:
        why = f"chunk at offset {first} has {len(out)} records, its header says {records}"
        out = out[:records] + _unreadable(records - len(out), why)
    return out


def _simple_entries(data: bytes, entries: int, first: int) -> list[bytes | Decoded]:
    """Entries that are each one record (no sub-entry batch): the common chunk."""
    out: list[bytes | Decoded] = []
    append = out.append
    pos, end, unpack = 0, len(data), _U32.unpack_from
    for _ in range(entries):
        if pos + 4 > end or data[pos] & 0x80:
            return out + _entries(data[pos:], entries - len(out), first + len(out))
        (size,) = unpack(data, pos)
        pos += 4
        if pos + size > end:
            why = f"record {first + len(out)} runs past its chunk ({size} bytes)"
            return out + _unreadable(entries - len(out), why)
        append(data[pos : pos + size])
        pos += size
    return out


def _entries(data: bytes, entries: int, first: int) -> list[bytes | Decoded]:
    """Entries of any kind: simple records and sub-entry batches."""
    out: list[bytes | Decoded] = []
    pos, end = 0, len(data)
    for _ in range(entries):
        offset = first + len(out)
        if pos >= end:
            return [*out, Decoded(b"", {}, f"record {offset} is missing from its chunk")]
        if not data[pos] & 0x80:
            if pos + 4 > end:
                return [*out, Decoded(b"", {}, f"record {offset} is cut short in its chunk")]
            (size,) = _U32.unpack_from(data, pos)
            pos += 4
            if pos + size > end:
                return [*out, Decoded(b"", {}, f"record {offset} runs past its chunk")]
            out.append(data[pos : pos + size])
            pos += size
            continue
        kind = (data[pos] & 0x70) >> 4
        if pos + 1 + _SUB_ENTRY.size > end:
            return [*out, Decoded(b"", {}, f"sub-entry batch at {offset} is cut short")]
        count, plain_size, size = _SUB_ENTRY.unpack_from(data, pos + 1)
        pos += 1 + _SUB_ENTRY.size
        if pos + size > end:
            return out + _unreadable(count, f"sub-entry batch at {offset} runs past its chunk")
        out += _batch(data[pos : pos + size], kind, count, plain_size, offset)
        pos += size
    return out


def _batch(
    data: bytes, kind: int, count: int, plain_size: int, first: int
) -> list[bytes | Decoded]:
    """The records of one sub-entry batch."""
    name = _COMPRESSION.get(kind, f"codec {kind}")
    try:
        if kind == 1:
            plain = zlib.decompress(data, wbits=31, bufsize=max(plain_size, 1))
        elif kind == 0:
            plain = data
        else:
            raise ValueError(f"compressed with {name}, which nsqworker does not read")
    except (ValueError, zlib.error) as exc:
        return _unreadable(count, f"sub-entry batch at {first} ({name}): {exc}")
    out = _simple_entries(plain, count, first)
    if len(out) < count:
        out += _unreadable(count - len(out), f"sub-entry batch at {first} holds fewer records")
    return out


def _unreadable(count: int, why: str) -> list[bytes | Decoded]:
    return [Decoded(b"", {}, why) for _ in range(max(count, 0))]


# --- commands (the handshake's, Credit, QueryOffset and Unsubscribe are
# nsqworker.streams.stats' encoders, shared with the lag reader) ------------------------


def _map(values: dict[str, str]) -> bytes:
    return len(values).to_bytes(4, "big") + b"".join(
        _string(k) + _string(v) for k, v in values.items()
    )


def parse_tune(frame: bytes) -> tuple[int, int]:
    """``(frame_max, heartbeat)`` of the server's Tune."""
    if len(frame) < 12:
        raise RemoteProtocolError(f"Tune frame of {len(frame)} bytes, too short")
    return _U32.unpack_from(frame, 4)[0], _U32.unpack_from(frame, 8)[0]


def close_ok(correlation: int) -> bytes:
    """The answer to the server's Close."""
    return _frame(CLOSE | RESPONSE, _U32.pack(correlation) + OK.to_bytes(2, "big"))


def heartbeat() -> bytes:
    """Heartbeat."""
    return _frame(HEARTBEAT, b"")


def subscribe(
    correlation: int,
    subscription_id: int,
    stream: str,
    offset_type: int,
    offset: int,
    credit: int,
    properties: dict[str, str],
) -> bytes:
    """Subscribe request (``offset`` is sent for the OFFSET type only)."""
    spec = offset_type.to_bytes(2, "big")
    if offset_type == OFFSET:
        spec += offset.to_bytes(8, "big")
    body = (
        _U32.pack(correlation) + bytes((subscription_id,)) + _string(stream) + spec
        + credit.to_bytes(2, "big") + _map(properties)
    )  # fmt: skip
    return _frame(SUBSCRIBE, body)


def store_offset(reference: str, stream: str, offset: int) -> bytes:
    """StoreOffset (no answer)."""
    return _frame(STORE_OFFSET, _string(reference) + _string(stream) + offset.to_bytes(8, "big"))


def parse_offset(frame: bytes) -> int:
    """The offset in a QueryOffset response."""
    if len(frame) < 18:
        raise RemoteProtocolError(f"QueryOffset response of {len(frame)} bytes, too short")
    return int.from_bytes(frame[10:18], "big")


def parse_consumer_update(frame: bytes) -> tuple[int, int, bool]:
    """``(correlation id, subscription id, active)`` of the server's ConsumerUpdate."""
    if len(frame) < 10:
        raise RemoteProtocolError(f"ConsumerUpdate frame of {len(frame)} bytes, too short")
    return _U32.unpack_from(frame, 4)[0], frame[8], bool(frame[9])


def consumer_update_answer(correlation: int, offset_type: int, offset: int) -> bytes:
    """The answer to ConsumerUpdate: where to read from (always with an offset)."""
    body = _U32.pack(correlation) + OK.to_bytes(2, "big") + offset_type.to_bytes(2, "big")
    return _frame(CONSUMER_UPDATE | RESPONSE, body + offset.to_bytes(8, "big"))


def parse_metadata_update(frame: bytes) -> str:
    """The stream a MetadataUpdate names."""
    if len(frame) < 8:
        raise RemoteProtocolError(f"MetadataUpdate frame of {len(frame)} bytes, too short")
    size = int.from_bytes(frame[6:8], "big")
    return frame[8 : 8 + size].decode("utf-8", "replace")


def parse_sasl_mechanisms(frame: bytes) -> list[str]:
    """The mechanisms of a SaslHandshake response."""
    out: list[str] = []
    if len(frame) < 14:
        return out
    count, pos = _U32.unpack_from(frame, 10)[0], 14
    for _ in range(min(count, 64)):
        if pos + 2 > len(frame):
            break
        size = int.from_bytes(frame[pos : pos + 2], "big")
        out.append(frame[pos + 2 : pos + 2 + size].decode("utf-8", "replace"))
        pos += 2 + size
    return out


def metadata(correlation: int, streams: list[str]) -> bytes:
    """Metadata request: where ``streams`` are (the answer has no response code of its
    own: each stream has one)."""
    body = _U32.pack(correlation) + _U32.pack(len(streams)) + b"".join(map(_string, streams))
    return _frame(METADATA, body)


def parse_metadata(frame: bytes) -> dict[str, tuple[int, list[tuple[str, int]]]]:
    """Per stream: its response code and its brokers ``(host, port)``, replicas first
    (in the order given) and the leader last.

    Raises:
        RemoteProtocolError: short or inconsistent.
    """
    try:
        pos = 8
        brokers: dict[int, tuple[str, int]] = {}
        (count,) = _U32.unpack_from(frame, pos)
        pos += 4
        for _ in range(min(count, 10_000)):
            reference, size = struct.unpack_from(">HH", frame, pos)
            host = frame[pos + 4 : pos + 4 + size].decode()
            pos += 4 + size
            brokers[reference] = (host, _U32.unpack_from(frame, pos)[0])
            pos += 4
        out: dict[str, tuple[int, list[tuple[str, int]]]] = {}
        (count,) = _U32.unpack_from(frame, pos)
        pos += 4
        for _ in range(min(count, 10_000)):
            (size,) = struct.unpack_from(">H", frame, pos)
            stream = frame[pos + 2 : pos + 2 + size].decode()
            pos += 2 + size
            code, leader, replicas = struct.unpack_from(">HHI", frame, pos)
            pos += 8
            refs = list(struct.unpack_from(f">{min(replicas, 10_000)}H", frame, pos))
            pos += 2 * len(refs)
            places = [brokers[r] for r in [*refs, leader] if r in brokers]
            out[stream] = (code, places)
        return out
    except (struct.error, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(f"Metadata response that cannot be read: {exc}") from None
