"""The stream protocol's StreamStats (key 28) and what a lag needs beside it, sans-IO.

rstream lacks StreamStats, so this module encodes the few requests the console's lag
reading sends (the handshake, QueryOffset, StreamStats, Subscribe, Credit, Unsubscribe,
Close) and decodes their answers from bytes; :mod:`nsqworker.streams.lag` speaks them
over a socket. Every decoder checks lengths: a short or hostile frame raises
:class:`StatsProtocolError`, never ``struct.error`` or an ``IndexError``.

StreamStats answers chunk ids (a chunk's id is the offset of its first record):
``first_chunk_id``, ``committed_chunk_id`` (the last chunk a consumer may read) and
``last_chunk_id``, ``-1`` for an empty stream. The offset after the last committed record
is the committed chunk's id plus its record count, read from that chunk's header
(:func:`decode_deliver_header`) after subscribing at its id.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from nsqworker.errors import RemoteProtocolError
from nsqworker.streams.errors import RESPONSE_CODES

__all__ = [
    "Frame",
    "FrameBuffer",
    "Response",
    "StatsProtocolError",
    "decode_deliver_header",
    "decode_frame",
    "decode_response",
    "decode_stream_stats",
    "encode_close",
    "encode_credit",
    "encode_frame",
    "encode_open",
    "encode_peer_properties",
    "encode_query_offset",
    "encode_sasl_authenticate",
    "encode_sasl_handshake",
    "encode_stream_stats",
    "encode_string",
    "encode_subscribe",
    "encode_tune",
    "encode_unsubscribe",
]

SUBSCRIBE: Final = 7
DELIVER: Final = 8
CREDIT: Final = 9
QUERY_OFFSET: Final = 11
UNSUBSCRIBE: Final = 12
PEER_PROPERTIES: Final = 17
SASL_HANDSHAKE: Final = 18
SASL_AUTHENTICATE: Final = 19
TUNE: Final = 20
OPEN: Final = 21
CLOSE: Final = 22
HEARTBEAT: Final = 23
STREAM_STATS: Final = 28
RESPONSE_BIT: Final = 0x8000
OK: Final = 1
STREAM_DOES_NOT_EXIST: Final = 2
NO_OFFSET: Final = 19
OFFSET_TYPE_LAST: Final = 2
OFFSET_TYPE_OFFSET: Final = 4
MAX_FRAME: Final = 1024 * 1024
"""The largest frame accepted (and asked for in Tune): one chunk of a default stream."""
CHUNK_MAGIC: Final = 0x50
"""An osiris chunk header's magic (high nibble 5) and version (low nibble 0)."""


class StatsProtocolError(RemoteProtocolError):
    """A frame from the server that is short, malformed, or not the one expected."""


@dataclass(frozen=True)
class Frame:
    """One frame: ``key`` (the response bit included), ``version`` and the rest."""

    key: int
    version: int
    payload: bytes


@dataclass(frozen=True)
class Response:
    """A request's answer: its key (without the response bit), correlation id, code and
    what follows the code."""

    key: int
    correlation_id: int
    code: int
    rest: bytes

    @property
    def reason(self) -> str:
        """The response code in words."""
        return RESPONSE_CODES.get(self.code, f"response code {self.code}")


# -- encoding ------------------------------------------------------------------------------


def encode_string(value: str) -> bytes:
    data = value.encode()
    if len(data) > 0x7FFF:
        raise ValueError(f"string of {len(data)} bytes is too long for the stream protocol")
    return struct.pack(">h", len(data)) + data


def encode_frame(key: int, body: bytes, version: int = 1) -> bytes:
    return struct.pack(">IHH", len(body) + 4, key, version) + body


def encode_peer_properties(correlation_id: int, properties: dict[str, str]) -> bytes:
    """PeerProperties (17): the client's name and product."""
    body = struct.pack(">Ii", correlation_id, len(properties))
    body += b"".join(encode_string(k) + encode_string(v) for k, v in properties.items())
    return encode_frame(PEER_PROPERTIES, body)


def encode_sasl_handshake(correlation_id: int) -> bytes:
    """SaslHandshake (18): which mechanisms the server offers."""
    return encode_frame(SASL_HANDSHAKE, struct.pack(">I", correlation_id))


def encode_sasl_authenticate(correlation_id: int, username: str, password: str) -> bytes:
    """SaslAuthenticate (19) with PLAIN: ``\\0user\\0password``."""
    opaque = b"\0" + username.encode() + b"\0" + password.encode()
    body = struct.pack(">I", correlation_id) + encode_string("PLAIN")
    return encode_frame(SASL_AUTHENTICATE, body + struct.pack(">i", len(opaque)) + opaque)


def encode_tune(frame_max: int, heartbeat: int) -> bytes:
    """Tune (20), the client's answer to the server's."""
    return encode_frame(TUNE, struct.pack(">II", frame_max, heartbeat))


def encode_open(correlation_id: int, vhost: str) -> bytes:
    """Open (21) the virtual host."""
    return encode_frame(OPEN, struct.pack(">I", correlation_id) + encode_string(vhost))


def encode_close(correlation_id: int, code: int = OK, reason: str = "done") -> bytes:
    """Close (22) the connection."""
    return encode_frame(CLOSE, struct.pack(">IH", correlation_id, code) + encode_string(reason))


def encode_query_offset(correlation_id: int, reference: str, stream: str) -> bytes:
    """QueryOffset (11): the offset stored under ``reference`` (a consumer's name)."""
    return encode_frame(QUERY_OFFSET, struct.pack(">I", correlation_id) + encode_string(reference)
                  + encode_string(stream))  # fmt: skip


def encode_stream_stats(correlation_id: int, stream: str) -> bytes:
    """StreamStats (28) of ``stream``."""
    return encode_frame(STREAM_STATS, struct.pack(">I", correlation_id) + encode_string(stream))


def encode_subscribe(correlation_id: int, subscription_id: int, stream: str,
                     offset_type: int, offset: int, credit: int) -> bytes:  # fmt: skip
    """Subscribe (7) from ``offset_type`` (:data:`OFFSET_TYPE_LAST`: the last chunk;
    :data:`OFFSET_TYPE_OFFSET`: the chunk of ``offset``) with ``credit`` chunks."""
    body = struct.pack(">IB", correlation_id, subscription_id) + encode_string(stream)
    body += struct.pack(">H", offset_type)
    if offset_type == OFFSET_TYPE_OFFSET:  # first, last and next carry no offset
        body += struct.pack(">Q", offset)
    body += struct.pack(">Hi", credit, 0)
    return encode_frame(SUBSCRIBE, body)


def encode_credit(subscription_id: int, credit: int) -> bytes:
    """Credit (9): ``credit`` more chunks for the subscription."""
    return encode_frame(CREDIT, struct.pack(">BH", subscription_id, credit))


def encode_unsubscribe(correlation_id: int, subscription_id: int) -> bytes:
    """Unsubscribe (12)."""
    return encode_frame(UNSUBSCRIBE, struct.pack(">IB", correlation_id, subscription_id))


# -- decoding ------------------------------------------------------------------------------


class _Cursor:
    """Reads big-endian values from ``data``; running past its end is a protocol error."""

    __slots__ = ("at", "data", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.what, self.at = data, what, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise StatsProtocolError(f"{self.what}: {len(self.data)} bytes, too short")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return int(value)

    def string(self) -> str:
        size = self.take(">h")
        if size < 0:
            return ""
        if self.at + size > len(self.data):
            raise StatsProtocolError(f"{self.what}: a string runs past the frame's end")
        raw = self.data[self.at : self.at + size]
        self.at += size
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise StatsProtocolError(f"{self.what}: a string is not UTF-8") from exc


def decode_frame(data: bytes) -> Frame:
    """A frame without its size prefix."""
    cursor = _Cursor(data, "frame")
    key, version = cursor.take(">H"), cursor.take(">H")
    return Frame(key, version, data[cursor.at :])


class FrameBuffer:
    """Bytes from the socket in, whole frames out."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._data = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data``; the frames it completes.

        Raises:
            StatsProtocolError: a frame announces more than ``max_frame`` bytes, or fewer
                than a key and version.
        """
        self._data += data
        frames = []
        while len(self._data) >= 4:
            (size,) = struct.unpack_from(">I", self._data)
            if size > self.max_frame or size < 4:
                raise StatsProtocolError(f"frame of {size} bytes (limit {self.max_frame})")
            if len(self._data) < 4 + size:
                break
            frames.append(decode_frame(bytes(self._data[4 : 4 + size])))
            del self._data[: 4 + size]
        return frames


def decode_response(frame: Frame) -> Response:
    """A response frame's correlation id and code (Tune and Deliver are not responses)."""
    if not frame.key & RESPONSE_BIT:
        raise StatsProtocolError(f"key {frame.key} is a request, not a response")
    cursor = _Cursor(frame.payload, f"response to key {frame.key & ~RESPONSE_BIT}")
    correlation_id, code = cursor.take(">I"), cursor.take(">H")
    return Response(frame.key & ~RESPONSE_BIT, correlation_id, code, frame.payload[cursor.at :])


def decode_stream_stats(rest: bytes) -> dict[str, int]:
    """StreamStats' statistics (``[key string, value int64]``) after an OK code."""
    cursor = _Cursor(rest, "StreamStats response")
    count = cursor.take(">i")
    if count < 0 or count * 10 > len(rest):  # each takes at least 2 + 8 bytes
        raise StatsProtocolError(f"StreamStats response: {count} statistics in {len(rest)} bytes")
    stats = {}
    for _ in range(count):
        name = cursor.string()
        stats[name] = cursor.take(">q")
    return stats


def decode_query_offset(rest: bytes) -> int:
    """QueryOffset's offset after an OK code."""
    return _Cursor(rest, "QueryOffset response").take(">Q")


def decode_deliver_header(frame: Frame) -> tuple[int, int, int]:
    """``(subscription id, chunk's first offset, record count)`` of a Deliver (8) frame,
    version 1 (the subscription id, then the chunk) or 2 (a committed offset between)."""
    cursor = _Cursor(frame.payload, "Deliver")
    subscription_id = cursor.take(">B")
    if frame.version >= 2:
        cursor.take(">Q")
    magic = cursor.take(">B")
    if magic >> 4 != CHUNK_MAGIC >> 4:
        raise StatsProtocolError(f"Deliver: chunk magic {magic:#x}, not an osiris chunk")
    cursor.take(">b")  # chunk type
    cursor.take(">H")  # entries
    records = cursor.take(">I")
    cursor.take(">q")  # timestamp
    cursor.take(">Q")  # epoch
    first_offset = cursor.take(">Q")
    return subscription_id, first_offset, records
