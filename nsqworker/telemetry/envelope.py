"""The trace envelope: W3C trace context carried ahead of a message body, pure bytes.

NSQ messages have no headers, so a producer that opts in (``Producer(envelope=True)``
or ``NSQWORKER_TRACING_ENVELOPE=true``) writes this frame and our consumer strips it
before the handler sees ``msg.body``. Layout (integers big-endian)::

    offset  size  field
    0       4     magic     C1 FF 4E 57   ("\\xc1\\xffNW")
    4       1     version   01
    5       2     H         length of the header in bytes
    7       H     header    UTF-8 "key=value" lines joined by "\\n" (may be empty)
    7+H     4     CRC-32    zlib.crc32 of bytes 0 .. 7+H (magic, version, H, header)
    11+H    ...   body      the application's bytes, unchanged

Header keys are what the OpenTelemetry propagator writes (``traceparent``,
``tracestate``, ``baggage``) plus ``content-type`` when the producer knows it.

A raw body is never mistaken for an envelope: ``C1`` and ``FF`` never occur in UTF-8
text (so no JSON, CSV or plain-text body starts with them), ``C1`` is unused in
msgpack, and a body that does start with the magic must also carry the right version,
a length that fits and a matching CRC-32 of the header (one chance in 2**32 for random
bytes) and a well-formed header. Anything else is handed over untouched.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context

__all__ = [
    "ENVELOPE_MAGIC",
    "ENVELOPE_VERSION",
    "MAX_HEADER_SIZE",
    "is_envelope",
    "unwrap_envelope",
    "with_sampled_flag",
    "wrap_envelope",
]

ENVELOPE_MAGIC = b"\xc1\xffNW"
"""First four bytes of every envelope; invalid as the start of UTF-8 text."""
ENVELOPE_VERSION = 1
"""The only version written and read; other versions are passed through untouched."""
MAX_HEADER_SIZE = 0xFFFF
"""The header length field is two bytes."""

_PREFIX = ENVELOPE_MAGIC + bytes([ENVELOPE_VERSION])
_FIXED = len(_PREFIX) + 2  # magic, version, header length
_CRC = 4
_MIN_SIZE = _FIXED + _CRC


def wrap_envelope(body: bytes, headers: Mapping[str, str]) -> bytes:
    """Frame ``body`` behind ``headers`` (e.g. ``traceparent``, ``content-type``).

    Raises:
        ValueError: a key is empty or holds ``=`` or a newline, a value holds a
            newline, or the encoded header exceeds 65535 bytes.
    """
    for key, value in headers.items():
        if not key or "=" in key or "\n" in key or "\n" in value:
            raise ValueError(
                f"envelope header {key!r}={value!r}: keys must be non-empty without '=' or "
                "newlines, values without newlines"
            )
    header = "\n".join(f"{key}={value}" for key, value in headers.items()).encode()
    if len(header) > MAX_HEADER_SIZE:
        raise ValueError(f"envelope header is {len(header)} bytes; at most {MAX_HEADER_SIZE}")
    framed = _PREFIX + len(header).to_bytes(2, "big") + header
    return framed + zlib.crc32(framed).to_bytes(4, "big") + body


def unwrap_envelope(data: bytes) -> tuple[bytes, dict[str, str] | None]:
    """Split an envelope into ``(body, headers)``; anything else is ``(data, None)``.

    ``data`` is returned as the very same object when it is not a valid envelope of
    the version this code reads, so raw bodies from other clients are never altered.
    """
    header = _header(data)
    if header is None:
        return data, None
    headers = _parse(header)
    if headers is None:
        return data, None
    return data[_MIN_SIZE + len(header) :], headers


def is_envelope(data: bytes) -> bool:
    """Whether ``data`` is a well-formed envelope that :func:`unwrap_envelope` strips."""
    header = _header(data)
    return header is not None and _parse(header) is not None


def _header(data: bytes) -> bytes | None:
    """The header bytes when magic, version, length and CRC-32 all check out."""
    if len(data) < _MIN_SIZE or not data.startswith(_PREFIX):
        return None
    size = int.from_bytes(data[len(_PREFIX) : _FIXED], "big")
    end = _FIXED + size
    if end + _CRC > len(data):
        return None
    if zlib.crc32(data[:end]) != int.from_bytes(data[end : end + _CRC], "big"):
        return None
    return data[_FIXED:end]


def _parse(header: bytes) -> dict[str, str] | None:
    """``key=value`` lines as a dict; None when not UTF-8, malformed or repeated."""
    if not header:
        return {}
    try:
        text = header.decode()
    except UnicodeDecodeError:
        return None
    headers: dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if not sep or not key or key in headers:
            return None
        headers[key] = value
    return headers


def with_sampled_flag(remote: Context, sampled: bool) -> Context:
    """``remote``'s span context with ``sampled`` in place of its sampled flag.

    Any publisher can set the flag in an envelope; the consumer puts its own sampler's
    decision there instead (a random draw at its ratio: not one made from the trace
    id, which the publisher chooses too), so a parent-based sampler follows ours.
    """
    span_ctx = trace.get_current_span(remote).get_span_context()
    if not span_ctx.is_valid:
        return remote
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT)
    ours = trace.SpanContext(span_ctx.trace_id, span_ctx.span_id, True, flags, span_ctx.trace_state)
    return trace.set_span_in_context(trace.NonRecordingSpan(ours))
