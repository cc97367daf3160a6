"""Reading what lies on a dead-letter topic: the envelope :mod:`nsqworker.dead_letters`
writes, or anything else (a foreign or hostile message), without ever raising.

Pure functions over bytes: :func:`read_envelope` returns the envelope's fields and the
original body when it can be recovered whole, or the reason it cannot (not JSON, not an
envelope, bad base64, a truncated body, a size or SHA-256 that does not match, an
invalid original topic). :func:`preview` is the start of a body as one line of text with
every control or invisible character escaped, safe to print in a terminal or a table.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["PREVIEW_CHARS", "Reading", "preview", "read_envelope"]

PREVIEW_CHARS: Final = 80
"""Characters of a body shown in a listing (before escaping)."""
_REQUIRED: Final = ("topic", "body")
_MAX_ENVELOPE: Final = 64 * 1024 * 1024  # a dead letter is at most a broker message


@dataclass(frozen=True)
class Reading:
    """What :func:`read_envelope` found: ``envelope`` (the parsed JSON object, or None when
    the message is not an envelope), ``body`` (the original body when recoverable whole),
    ``problem`` (why it cannot be replayed; None when it can) and ``shown``."""

    envelope: dict[str, Any] | None
    body: bytes | None
    problem: str | None
    shown: bytes
    """What a listing shows: the original body, what could be read of it, or the whole
    message when it is not an envelope."""


def read_envelope(data: bytes, check_topic: Callable[[str], object] | None = None) -> Reading:
    """Parse ``data`` (one message of a dead-letter topic); never raises.

    ``check_topic`` (the transport's name rule) raises for an original topic the broker
    would not take: such an envelope is listed with that problem and never replayed.
    """
    envelope = _parse(data)
    if envelope is None:
        return Reading(None, None, "not a dead-letter envelope (not a JSON object)", data)
    missing = [key for key in _REQUIRED if not isinstance(envelope.get(key), str)]
    if missing:
        why = f"not a dead-letter envelope (no {' or '.join(missing)} as text)"
        return Reading(None, None, why, data)
    topic = envelope["topic"]
    body, problem = _body(envelope)
    if problem is None and check_topic is not None:
        try:
            check_topic(topic)
        except Exception as exc:  # InvalidName, or anything a hostile name provokes
            problem = f"invalid original topic: {_one_line(exc)}"
    if problem is None and body == b"":
        problem = "empty body (brokers refuse empty messages)"
    shown = body if body is not None else envelope["body"].encode("utf-8", "replace")
    return Reading(envelope, body if problem is None else None, problem, shown)


def _parse(data: bytes) -> dict[str, Any] | None:
    if len(data) > _MAX_ENVELOPE:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError
        return None
    return doc if isinstance(doc, dict) else None


def _body(envelope: dict[str, Any]) -> tuple[bytes | None, str | None]:
    """The original body and None, or what could be read of it and the problem."""
    text: str = envelope["body"]
    encoding = envelope.get("body_encoding")
    if encoding is None:
        try:
            body = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
            return None, "body is not valid text (a lone surrogate)"
    elif encoding == "base64":
        try:
            body = base64.b64decode(text.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            return None, f"bad base64 body ({_one_line(exc)})"
    else:
        return None, f"unknown body_encoding {str(encoding)[:40]!r}"
    size = envelope.get("body_size")
    digest = envelope.get("body_sha256")
    if envelope.get("body_truncated") is True:
        whole = f" of {size} bytes" if isinstance(size, int) else ""
        sha = f", sha256 {str(digest)[:64]}" if digest else ""
        return body, f"body truncated to {len(body)} bytes{whole}{sha}; the rest is lost"
    if size is not None and (type(size) is not int or size != len(body)):
        return body, f"body is {len(body)} bytes, the envelope says {str(size)[:20]}"
    if digest is not None and hashlib.sha256(body).hexdigest() != digest:
        return body, "body does not match the envelope's body_sha256"
    return body, None


def preview(data: bytes, chars: int = PREVIEW_CHARS) -> str:
    """The first ``chars`` characters of ``data`` as one line: UTF-8 where it decodes
    (invalid bytes as ``\\xNN``), control, format and separator characters escaped
    (``\\n``, ``\\x1b``, ``\\u202e``), a backslash doubled, ``…`` when cut."""
    text = data[: chars * 4].decode("utf-8", errors="surrogateescape")
    cut = len(text) > chars or len(data) > chars * 4
    return "".join(_escape(c) for c in text[:chars]) + ("…" if cut else "")


_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    if unicodedata.category(char)[0] in "CZ" and char != " ":  # controls, format, separators
        return (
            f"\\x{code:02x}"
            if code < 0x100
            else f"\\u{code:04x}"
            if code < 0x10000
            else f"\\U{code:08x}"
        )
    return char


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
