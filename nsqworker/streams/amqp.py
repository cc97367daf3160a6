"""Reading AMQP 1.0 messages from a stream; never raises.

Stream clients (rstream, the Java and Go clients) write each message as an AMQP 1.0
bare message; one that is just a data section, ``0x00 0x53 0x75`` then a binary
(``0xa0`` + 1-byte length, or ``0xb0`` + 4-byte length), is what nsqworker and most
producers send. :func:`decode` returns that body as bytes at once and hands anything
else (application properties, several sections, AMQP values) to rstream's decoder.

rstream decodes a chunk's messages one by one in its delivery loop: a decoder that
raised there would end the loop, and the chunk's later messages would never be
delivered while the stored offset moves past them (silent loss). So a message that is
not AMQP 1.0 (or has a body that is not bytes) is returned as a :class:`Decoded` with
``error`` set and its raw bytes as the body; the subscription hands it on as an
:class:`~nsqworker.message.Undecodable`, which the task layer dead-letters at once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Decoded", "decode"]

_DATA = b"\x00Su"


class Decoded:
    """A message that is not a single data section: ``body`` (bytes), the application
    ``properties`` (keys as bytes, as rstream gives them), and ``error`` (why it could
    not be read; then ``body`` is the raw message) or None."""

    __slots__ = ("body", "error", "properties")

    def __init__(self, body: bytes, properties: dict[Any, Any], error: str | None = None):
        self.body = body
        self.properties = properties
        self.error = error

    def __repr__(self) -> str:
        return f"<Decoded {len(self.body)} bytes error={self.error!r}>"


def decode(data: bytes) -> bytes | Decoded:
    """The body as ``bytes`` for a message of one data section, else a :class:`Decoded`."""
    if data[:3] == _DATA:
        code = data[3] if len(data) > 3 else None
        if code == 0xA0 and len(data) > 4 and len(data) == 5 + data[4]:
            return data[5:]
        if code == 0xB0 and len(data) == 8 + int.from_bytes(data[4:8], "big"):
            return data[8:]
    return _decode_full(bytes(data))


def _decode_full(data: bytes) -> Decoded:
    from rstream import amqp_decoder

    try:
        message = amqp_decoder(data)
        props = message.application_properties
        body = message.body
        if body is None:  # no data section: an AMQP value (or sequence), or nothing
            body = message.value
        if isinstance(body, list):  # several data sections
            body = b"".join(body)
        elif isinstance(body, str):
            body = body.encode("utf-8")
        elif body is None:
            body = b""
        if not isinstance(body, bytes | bytearray | memoryview):
            return Decoded(data, {}, f"AMQP body of type {type(body).__name__}, not data")
        if props is not None and not isinstance(props, dict):
            return Decoded(data, {}, "AMQP application properties that are not a map")
        return Decoded(bytes(body), props or {})
    except Exception as exc:  # RecursionError too: anything but a crash of the chunk
        return Decoded(data, {}, f"not an AMQP 1.0 message ({type(exc).__name__}: {exc})")
