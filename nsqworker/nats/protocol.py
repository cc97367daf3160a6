"""The NATS client protocol without I/O: commands to bytes, bytes to events.

Nothing here awaits or touches a socket. Encoders are pure functions that check their
arguments and return the exact bytes to send; :class:`Decoder` takes byte chunks split
anywhere and hands back whole operations (``INFO``, ``MSG``, ``HMSG``, ``PING``,
``PONG``, ``+OK``, ``-ERR``). It serves the consume hot path of a subscription
(:mod:`nsqworker.nats.wire`); JetStream management stays on nats-py.

The wire format (nats-server 2.x)::

    MSG <subject> <sid> [reply-to] <#bytes>\\r\\n<payload>\\r\\n
    HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>\\r\\n<headers><payload>\\r\\n

where the headers are ``NATS/1.0[ <status>[ <description>]]\\r\\n`` then ``Key: value``
lines and an empty line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from nsqworker.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "Decoder",
    "Err",
    "Headers",
    "Info",
    "Msg",
    "connect",
    "parse_headers",
    "ping",
    "pong",
    "pub",
    "sub",
    "unsub",
]

CRLF: Final = b"\r\n"
PING: Final = b"PING\r\n"
PONG: Final = b"PONG\r\n"
HEADER_LINE: Final = b"NATS/1.0"
MAX_CONTROL_LINE: Final = 64 * 1024
"""A line longer than this without its CRLF is a broken or hostile peer (nats-server's
own subjects and reply subjects are far shorter)."""
DEFAULT_MAX_MESSAGE: Final = 64 * 1024 * 1024
"""Payloads larger than this are refused as hostile (a server's max_payload is at most
64 MB)."""

_WHITESPACE: Final = frozenset(b" \t\r\n")


class Info(NamedTuple):
    """The server's ``INFO``: its JSON object."""

    data: dict[str, Any]


class Msg(NamedTuple):
    """A ``MSG`` or ``HMSG``: ``headers`` is the raw header block (None for ``MSG``)."""

    subject: bytes
    sid: int
    reply: bytes
    headers: bytes | None
    payload: bytes


class Err(NamedTuple):
    """``-ERR 'text'``: the server's complaint (most close the connection)."""

    text: str


class _Simple(NamedTuple):
    op: bytes


PING_EVENT: Final = _Simple(b"PING")
PONG_EVENT: Final = _Simple(b"PONG")
OK_EVENT: Final = _Simple(b"+OK")

Event = Info | Msg | Err | _Simple


class Headers(NamedTuple):
    """A parsed header block: the status line's code and text, and the fields (the
    first value of a key that repeats)."""

    status: str | None
    description: str
    fields: dict[str, str]


# --- encoders ----------------------------------------------------------------------


def _check_subject(subject: bytes, what: str = "subject") -> bytes:
    if not subject or any(b in _WHITESPACE for b in subject):
        raise LocalProtocolError(f"NATS {what} must be non-empty without spaces: {subject!r}")
    return subject


def connect(options: dict[str, Any]) -> bytes:
    """``CONNECT {json}``."""
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + CRLF


def pub(subject: bytes, payload: bytes, reply: bytes = b"") -> bytes:
    """``PUB subject [reply] size`` and the payload."""
    _check_subject(subject)
    if reply:
        _check_subject(reply, "reply subject")
        return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)
    return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)


def sub(subject: bytes, sid: int) -> bytes:
    """``SUB subject sid``."""
    _check_subject(subject)
    return b"SUB %s %d\r\n" % (subject, sid)


def unsub(sid: int) -> bytes:
    """``UNSUB sid``: the server forgets the subscription (and its pull requests find
    no one)."""
    return b"UNSUB %d\r\n" % sid


def ping() -> bytes:
    """``PING``: the server answers ``PONG`` after everything sent before it."""
    return PING


def pong() -> bytes:
    """``PONG``: the answer to the server's ``PING``."""
    return PONG


# --- headers -----------------------------------------------------------------------


def parse_headers(block: bytes) -> Headers:
    """The status and fields of an ``HMSG`` header block.

    Raises:
        RemoteProtocolError: the block does not start with ``NATS/1.0`` or a field line
            has no colon.
    """
    lines = block.split(CRLF)
    first = lines[0]
    if not first.startswith(HEADER_LINE):
        raise RemoteProtocolError(f"header block does not start with NATS/1.0: {first[:80]!r}")
    status: str | None = None
    description = ""
    rest = first[len(HEADER_LINE) :].strip()
    if rest:
        code, _, text = rest.partition(b" ")
        status = code.decode("ascii", "replace")
        description = text.strip().decode("utf-8", "replace")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        key, colon, value = line.partition(b":")
        if not colon or not key.strip():
            raise RemoteProtocolError(f"header line without a name and colon: {line[:80]!r}")
        name = key.strip().decode("utf-8", "replace")
        if name not in fields:
            fields[name] = value.strip().decode("utf-8", "replace")
    return Headers(status, description, fields)


# --- decoder -----------------------------------------------------------------------


class Decoder:
    """Turns a byte stream from nats-server into events.

    ``feed(chunk)`` returns every event the chunk completes; ``feed_into`` hands
    messages to a callback without building an event (the consumer's hot path). Bytes
    of an incomplete operation are kept for the next chunk. A stream that is not the
    NATS protocol raises :class:`RemoteProtocolError`; the connection is then useless.
    """

    __slots__ = ("_buffer", "max_message")

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE) -> None:
        self._buffer = b""
        self.max_message = max_message

    def __len__(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Event]:
        """Add bytes and return every complete event, in order."""
        events: list[Event] = []

        def on_msg(
            subject: bytes, sid: int, reply: bytes, hdr: bytes | None, payload: bytes
        ) -> None:
            events.append(Msg(subject, sid, reply, hdr, payload))

        self.feed_into(data, on_msg, events.append)
        return events

    def feed_into(
        self,
        data: bytes,
        on_msg: Callable[[bytes, int, bytes, bytes | None, bytes], object],
        on_event: Callable[[Event], object],
    ) -> int:
        """Add bytes and hand every complete operation on, in order: messages to
        ``on_msg(subject, sid, reply, headers, payload)``, the rest to ``on_event``.
        Returns how many messages were handed on. If a callback raises, what was handed
        on stays consumed."""
        data = self._buffer + data if self._buffer else data
        end = len(data)
        pos = 0
        count = 0
        find = data.find
        limit = self.max_message
        try:
            while pos < end:
                eol = find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > MAX_CONTROL_LINE:
                        raise self._broken(f"a line of over {MAX_CONTROL_LINE} bytes without CRLF")
                    break
                if data[pos] == 77:  # "M": MSG, the usual case
                    args = data[pos:eol].split()
                    nargs = len(args)
                    if nargs == 5 and args[0] == b"MSG":  # a reply: JetStream's
                        _, subject, sid, reply, size = args
                    elif nargs == 4 and args[0] == b"MSG":
                        _, subject, sid, size = args
                        reply = b""
                    else:
                        raise self._broken(f"malformed MSG line {data[pos:eol][:120]!r}")
                    try:  # int() is the check: cheaper than isdigit() on the hot path
                        n, number = int(size), int(sid)
                    except ValueError:
                        n = number = -1
                    if n < 0 or number < 0 or n > limit:
                        self._stop(eol, size)
                        self._sid(sid)  # one of the two raises, naming what is wrong
                    stop = eol + 2 + n
                    if stop + 2 > end:
                        break
                    if not data.startswith(CRLF, stop):
                        raise self._broken("a MSG payload not followed by CRLF")
                    pos = stop + 2
                    count += 1
                    on_msg(subject, number, reply, None, data[eol + 2 : stop])
                    continue
                line = data[pos:eol]
                op = line.split(None, 1)[0].upper() if line.strip() else b""
                if op == b"HMSG":
                    args = line.split()
                    if len(args) == 5:
                        subject, sid, reply, hsize, size = args[1], args[2], b"", args[3], args[4]
                    elif len(args) == 6:
                        subject, sid, reply, hsize, size = args[1:6]
                    else:
                        raise self._broken(f"malformed HMSG line {line[:120]!r}")
                    stop = self._stop(eol, size)
                    hstop = self._stop(eol, hsize)
                    if hstop > stop:
                        raise self._broken(f"HMSG header size {hsize!r} over its total {size!r}")
                    if stop + 2 > end:
                        break
                    if data[stop : stop + 2] != CRLF:
                        raise self._broken("an HMSG payload not followed by CRLF")
                    pos = stop + 2
                    count += 1
                    on_msg(subject, self._sid(sid), reply, data[eol + 2 : hstop], data[hstop:stop])
                    continue
                pos = eol + 2
                if op == b"PING":
                    on_event(PING_EVENT)
                elif op == b"PONG":
                    on_event(PONG_EVENT)
                elif op == b"+OK":
                    on_event(OK_EVENT)
                elif op == b"-ERR":
                    text = line[4:].strip().strip(b"'").decode("utf-8", "replace")
                    on_event(Err(text))
                elif op == b"INFO":
                    on_event(Info(self._info(line[4:])))
                else:
                    raise self._broken(f"unknown operation {line[:120]!r}")
        except RemoteProtocolError:
            data, pos = b"", 0  # the stream is lost: nothing after the fault means anything
            raise
        finally:
            self._buffer = data[pos:] if pos else data
        return count

    def _stop(self, eol: int, size: bytes) -> int:
        if not size.isdigit() or len(size) > 10:
            raise self._broken(f"message size {size[:20]!r} is not a number")
        n = int(size)
        if n > self.max_message:
            raise self._broken(f"message size {n} over the limit of {self.max_message}")
        return eol + 2 + n

    def _sid(self, sid: bytes) -> int:
        if not sid.isdigit() or len(sid) > 19 or int(sid) < 0:
            raise self._broken(f"subscription id {sid[:20]!r} is not a number")
        return int(sid)

    def _info(self, body: bytes) -> dict[str, Any]:
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise self._broken(f"INFO is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise self._broken("INFO is not a JSON object")
        return data

    def _broken(self, what: str) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"NATS server sent {what}; the peer is not nats-server or the stream is corrupt"
        )
