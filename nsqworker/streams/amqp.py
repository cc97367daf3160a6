"""Reading AMQP 1.0 message bodies from a stream, the common case without a decoder.

Stream clients (rstream, the Java and Go clients) write each message as an AMQP 1.0
bare message; one that is just a data section, ``0x00 0x53 0x75`` then a binary
(``0xa0`` + 1-byte length, or ``0xb0`` + 4-byte length), is what nsqworker and most
producers send. :func:`decode` returns that body as bytes at once and hands anything
else (application properties, several sections, AMQP values) to rstream's decoder.
"""

from __future__ import annotations

from typing import Any

__all__ = ["decode"]

_DATA = b"\x00Su"


def decode(data: bytes) -> Any:
    """The body as ``bytes`` for a message of one data section, else rstream's
    ``AMQPMessage`` (with ``body`` and ``application_properties``)."""
    if data[:3] == _DATA:
        code = data[3] if len(data) > 3 else None
        if code == 0xA0 and len(data) == 5 + data[4]:
            return data[5:]
        if code == 0xB0 and len(data) == 8 + int.from_bytes(data[4:8], "big"):
            return data[8:]
    from rstream import amqp_decoder

    return amqp_decoder(data)
