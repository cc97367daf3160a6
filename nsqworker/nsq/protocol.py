"""The NSQ V2 protocol without I/O: commands to bytes, bytes to frames.

Nothing here awaits or touches a socket. Encoders are pure functions that validate
their arguments and return the exact bytes to send; :class:`Decoder` takes byte
chunks split anywhere and hands back whole frames. nsqd v1.3.0's behaviour is the
reference where the published protocol text is older (names up to 64 characters,
RDY as a window, IDENTIFY ranges).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from nsqworker.errors import (
    LocalProtocolError,
    MessageTooLarge,
    RemoteProtocolError,
)
from nsqworker.names import check_channel, check_topic, is_valid_name

__all__ = ["check_channel", "check_topic", "is_valid_name"]  # NSQ's rule is the portable one

MAGIC_V2: Final = b"  V2"

FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

HEARTBEAT: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

MESSAGE_ID_LENGTH: Final = 16
# timestamp (8) + attempts (2) + id (16)
MESSAGE_HEADER_LENGTH: Final = 26

# nsqd v1.3.0 defaults; a server can be configured otherwise, so callers pass what
# they learned when they know better.
DEFAULT_MAX_RDY_COUNT: Final = 2500
DEFAULT_MAX_MSG_SIZE: Final = 1024 * 1024
DEFAULT_MAX_BODY_SIZE: Final = 5 * 1024 * 1024
DEFAULT_MAX_REQ_TIMEOUT_MS: Final = 60 * 60 * 1000
DEFAULT_MAX_MSG_TIMEOUT_MS: Final = 15 * 60 * 1000
# A frame larger than this is taken as a hostile or broken peer, not a message.
DEFAULT_MAX_FRAME_SIZE: Final = 64 * 1024 * 1024


_SIZE: Final = struct.Struct(">I")
_HEADER: Final = struct.Struct(">iI")
_MESSAGE: Final = struct.Struct(">qH16s")
_MESSAGE_FRAME: Final = struct.Struct(">iIqH16s")
_TWO_SIZES: Final = struct.Struct(">II")
_JUST_BYTES: Final = {bytes}


class Response(NamedTuple):
    """A response frame (``OK``, ``CLOSE_WAIT``, ``_heartbeat_``, IDENTIFY JSON...)."""

    data: bytes


class ErrorFrame(NamedTuple):
    """An error frame: nsqd's ``E_*`` code and its explanation."""

    data: bytes

    @property
    def code(self) -> str:
        """The ``E_*`` code."""
        return self.data.split(b" ", 1)[0].decode("ascii", "replace")


class MessageFrame(NamedTuple):
    """A message frame, unpacked."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


Frame = Response | ErrorFrame | MessageFrame


# --- validation -------------------------------------------------------------------


def _check_body(body: bytes, limit: int | None) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise LocalProtocolError(f"message body must be bytes, got {type(body).__name__}")
    if len(body) == 0:
        raise LocalProtocolError("message body is empty; nsqd rejects empty messages")
    if limit is not None and len(body) > limit:
        raise MessageTooLarge(len(body), limit)


def _check_id(message_id: bytes) -> None:
    if len(message_id) != MESSAGE_ID_LENGTH:
        raise LocalProtocolError(
            f"message id must be {MESSAGE_ID_LENGTH} bytes, got {len(message_id)}: {message_id!r}"
        )


def _check_ms(value: int, what: str, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise LocalProtocolError(f"{what} must be an int of milliseconds, got {value!r}")
    if not 0 <= value <= maximum:
        raise LocalProtocolError(f"{what} must be within 0..{maximum} ms, got {value}")
    return value


# --- encoders ----------------------------------------------------------------------


def identify(data: dict[str, Any]) -> bytes:
    """``IDENTIFY`` with its size-prefixed JSON body."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def auth(secret: bytes | str) -> bytes:
    """``AUTH`` with its size-prefixed secret."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return b"AUTH\n" + _SIZE.pack(len(raw)) + raw


def sub(topic: str, channel: str) -> bytes:
    """``SUB topic channel``."""
    check_topic(topic)
    check_channel(channel)
    return f"SUB {topic} {channel}\n".encode()


def pub(topic: str, body: bytes, max_size: int | None = None) -> bytes:
    """``PUB topic`` with one message body."""
    check_topic(topic)
    _check_body(body, max_size)
    return b"PUB " + topic.encode() + b"\n" + _SIZE.pack(len(body)) + bytes(body)


def dpub(
    topic: str,
    delay_ms: int,
    body: bytes,
    max_size: int | None = None,
    max_delay_ms: int = DEFAULT_MAX_REQ_TIMEOUT_MS,
) -> bytes:
    """``DPUB topic delay_ms``: publish a message nsqd holds back for ``delay_ms``."""
    check_topic(topic)
    _check_ms(delay_ms, "DPUB delay", max_delay_ms)
    _check_body(body, max_size)
    return b"DPUB %s %d\n" % (topic.encode(), delay_ms) + _SIZE.pack(len(body)) + bytes(body)


def mpub(
    topic: str, bodies: list[bytes], max_size: int | None = None, max_body_size: int | None = None
) -> bytes:
    """``MPUB topic`` with several messages in one atomic command."""
    check_topic(topic)
    return mpub_line(b"MPUB " + topic.encode() + b"\n", bodies, max_size, max_body_size)


def mpub_line(
    line: bytes, bodies: list[bytes], max_size: int | None = None, max_body_size: int | None = None
) -> bytes:
    """:func:`mpub` for a topic already checked: ``line`` is ``b"MPUB topic\\n"``."""
    if not bodies:
        raise LocalProtocolError("MPUB needs at least one message")
    if {*map(type, bodies)} != _JUST_BYTES:
        for body in bodies:  # the slow path finds the culprit and names it
            _check_body(body, max_size)
        bodies = [bytes(body) for body in bodies]
    sizes = list(map(len, bodies))
    if min(sizes) == 0 or (max_size is not None and max(sizes) > max_size):
        for body in bodies:
            _check_body(body, max_size)
    count = len(sizes)
    total = 4 + 4 * count + sum(sizes)
    if max_body_size is not None and total > max_body_size:
        raise MessageTooLarge(total, max_body_size, "MPUB body")
    # One pack per message and one join: sizes and bodies interleaved by slicing.
    parts: list[bytes] = [b""] * (2 * count)
    parts[0::2] = map(_SIZE.pack, sizes)
    parts[1::2] = bodies
    return line + _TWO_SIZES.pack(total, count) + b"".join(parts)


def mpub_size(bodies: list[bytes]) -> int:
    """The size nsqd counts against ``--max-body-size`` for an MPUB of ``bodies``."""
    return 4 + sum(4 + len(b) for b in bodies)


def rdy(count: int, max_rdy_count: int = DEFAULT_MAX_RDY_COUNT) -> bytes:
    """``RDY count``: how many messages nsqd may have in flight on this connection."""
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= max_rdy_count:
        raise LocalProtocolError(f"RDY count must be within 0..{max_rdy_count}, got {count!r}")
    return b"RDY %d\n" % count


def fin(message_id: bytes) -> bytes:
    """``FIN id``: the message is done."""
    _check_id(message_id)
    return b"FIN " + message_id + b"\n"


def req(message_id: bytes, delay_ms: int, max_delay_ms: int = DEFAULT_MAX_REQ_TIMEOUT_MS) -> bytes:
    """``REQ id delay_ms``: put the message back, delivered again after the delay."""
    _check_id(message_id)
    _check_ms(delay_ms, "REQ delay", max_delay_ms)
    return b"REQ %s %d\n" % (message_id, delay_ms)


def touch(message_id: bytes) -> bytes:
    """``TOUCH id``: reset the message's in-flight timeout."""
    _check_id(message_id)
    return b"TOUCH " + message_id + b"\n"


def cls() -> bytes:
    """``CLS``: send no more messages on this connection."""
    return b"CLS\n"


def nop() -> bytes:
    """``NOP``: the answer to a heartbeat."""
    return b"NOP\n"


# --- decoder -------------------------------------------------------------------


class Decoder:
    """Turns a byte stream from nsqd into frames.

    ``feed(chunk)`` returns every frame the chunk completes; the rest is kept for the
    next chunk. ``receive(chunk)`` plus ``next_frame()`` hands them out one at a time,
    which the connection needs during negotiation, when the bytes after the IDENTIFY
    answer may already be compressed (``take_buffer()`` returns them).
    """

    __slots__ = ("_buffer", "_max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buffer = b""
        self._max_frame_size = max_frame_size

    def __len__(self) -> int:
        return len(self._buffer)

    def receive(self, data: bytes) -> None:
        """Add bytes without decoding them yet."""
        self._buffer += data

    def take_buffer(self) -> bytes:
        """Return and forget the bytes not yet decoded."""
        data, self._buffer = self._buffer, b""
        return data

    def next_frame(self) -> Frame | None:
        """Decode one frame from what was received, or return None if it is incomplete."""
        frames = self._decode(1)
        return frames[0] if frames else None

    def feed(self, data: bytes) -> list[Frame]:
        """Add bytes and return every complete frame, in order."""
        if self._buffer:
            self._buffer += data
        else:
            self._buffer = data
        return self._decode(-1)

    def feed_into(
        self,
        data: bytes,
        on_message: Callable[[int, int, bytes, bytes], object],
        on_frame: Callable[[Frame], object],
    ) -> int:
        """Add bytes and hand every complete frame on, in order, as it is decoded.

        Messages go to ``on_message(timestamp, attempts, id, body)`` without a frame
        object being built (the consumer's hot path); other frames to ``on_frame``.
        Returns how many messages were handed on. If a callback raises, the frames
        already handed on stay consumed; call again with ``b""`` to go on.
        """
        data = self._buffer + data if self._buffer else data
        end = len(data)
        pos = 0
        count = 0
        unpack = _MESSAGE_FRAME.unpack_from
        header = _HEADER.unpack_from
        new = tuple.__new__  # skips NamedTuple's Python-level __new__ (one per PUB's OK)
        max_size = self._max_frame_size
        try:
            while end - pos >= 8:
                if end - pos >= 34:
                    size, frame_type, timestamp, attempts, message_id = unpack(data, pos)
                else:
                    size, frame_type = header(data, pos)
                start = pos
                stop = pos + 4 + size
                if frame_type == FRAME_MESSAGE and 30 <= size <= max_size:
                    if stop > end:
                        break
                    pos = stop
                    count += 1
                    on_message(timestamp, attempts, message_id, data[start + 34 : stop])
                    continue
                if size < 4 or size > max_size:
                    data = b""
                    raise RemoteProtocolError(
                        f"frame size {size} is outside 4..{max_size}; the peer is not nsqd "
                        "or the stream is corrupt"
                    )
                if stop > end:
                    break
                pos = stop
                if frame_type == FRAME_RESPONSE:
                    on_frame(new(Response, (data[start + 8 : stop],)))
                elif frame_type == FRAME_ERROR:
                    on_frame(ErrorFrame(data[start + 8 : stop]))
                elif frame_type == FRAME_MESSAGE:
                    data = b""
                    raise RemoteProtocolError(f"message frame of {size} bytes is too short")
                else:
                    data = b""
                    raise RemoteProtocolError(f"unknown frame type {frame_type}")
        finally:
            self._buffer = data[pos:] if pos else data
        return count

    def _decode(self, limit: int) -> list[Frame]:
        data = self._buffer
        end = len(data)
        pos = 0
        frames: list[Frame] = []
        append = frames.append
        header = _HEADER.unpack_from
        message = _MESSAGE_FRAME.unpack_from
        new = tuple.__new__  # skips NamedTuple's Python-level __new__ on the hot path
        max_size = self._max_frame_size
        while end - pos >= 8 and limit != 0:
            size, frame_type = header(data, pos)
            stop = pos + 4 + size
            if frame_type == FRAME_MESSAGE and 30 <= size <= max_size:
                if stop > end:
                    break
                _, _, timestamp, attempts, message_id = message(data, pos)
                append(new(MessageFrame, (timestamp, attempts, message_id, data[pos + 34 : stop])))
            elif size < 4 or size > max_size:
                self._buffer = b""
                raise RemoteProtocolError(
                    f"frame size {size} is outside 4..{max_size}; the peer is not nsqd "
                    "or the stream is corrupt"
                )
            elif stop > end:
                break
            elif frame_type == FRAME_RESPONSE:
                append(Response(data[pos + 8 : stop]))
            elif frame_type == FRAME_ERROR:
                append(ErrorFrame(data[pos + 8 : stop]))
            elif frame_type == FRAME_MESSAGE:
                self._buffer = b""
                raise RemoteProtocolError(f"message frame of {size} bytes is too short")
            else:
                self._buffer = b""
                raise RemoteProtocolError(f"unknown frame type {frame_type}")
            pos = stop
            limit -= 1
        self._buffer = data[pos:] if pos else data
        return frames


def encode_frame(frame: Frame) -> bytes:
    """The bytes nsqd would send for ``frame`` (used by tests and test servers)."""
    if isinstance(frame, MessageFrame):
        payload = _MESSAGE.pack(frame.timestamp, frame.attempts, frame.id) + frame.body
        frame_type = FRAME_MESSAGE
    elif isinstance(frame, ErrorFrame):
        payload, frame_type = frame.data, FRAME_ERROR
    else:
        payload, frame_type = frame.data, FRAME_RESPONSE
    return _HEADER.pack(len(payload) + 4, frame_type) + payload
