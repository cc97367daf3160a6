"""The RPC-over-NSQ wire format without I/O: frames to bytes and back, values to bodies.

Byte layout (version 0, big-endian; docs/rpc.md has the full table)::

    request   vsn(1) | id(16) | encoding(1) | len(host)(1) | len(topic)(1) | port(4)
              | host | topic | body
    response  vsn(1) | id(16) | encoding(1) | body
    255 reply vsn(1) | id(16) | 0xff                  (the endpoint lacks the encoding)

The body has no length field: it is the rest of the NSQ message. So a request cut
inside its header, host or topic is an error, while one cut inside its body is only a
shorter body; the NSQ message framing is what keeps bodies whole.

Encoders check their arguments (:class:`~nsqworker.errors.LocalProtocolError`,
:class:`~nsqworker.errors.InvalidName`); decoders raise
:class:`~nsqworker.errors.RpcDecodeError` for every malformed input and nothing else.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from nsqworker.errors import LocalProtocolError, RpcDecodeError
from nsqworker.nsq.protocol import check_topic, is_valid_name

try:
    import msgpack  # type: ignore[import-untyped,import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - the `msgpack` extra is not installed
    msgpack = None

__all__ = [
    "BERT",
    "BINARY",
    "CONTENT_TYPES",
    "ID_LENGTH",
    "JSON",
    "MAX_DEPTH",
    "MSGPACK",
    "RESERVED",
    "UNSUPPORTED",
    "VERSION",
    "ReplyAddress",
    "Request",
    "Response",
    "decode_request",
    "decode_response",
    "decode_value",
    "encode_request",
    "encode_response",
    "encode_value",
    "encoding_code",
    "encoding_codes",
    "encoding_name",
    "encoding_of_content_type",
    "is_error_value",
    "supported_encodings",
    "unsupported_reply",
]

VERSION: Final = 0
ID_LENGTH: Final = 16

BINARY: Final = 0
JSON: Final = 1
BERT: Final = 2  # in the seed's table; nsqworker does not implement it
MSGPACK: Final = 3
RESERVED: Final = 254
UNSUPPORTED: Final = 255

_NAMES: Final = {BINARY: "binary", JSON: "json", BERT: "bert", MSGPACK: "msgpack"}
_CODES: Final = {name: code for code, name in _NAMES.items()}

_REQUEST_HEADER: Final = struct.Struct(">B16sBBBI")  # 24 bytes
_RESPONSE_HEADER: Final = struct.Struct(">B16sB")  # 18 bytes
_PORT: Final = struct.Struct(">I")
_MAX_PORT: Final = 65535
_MAX_FIELD: Final = 255  # host and topic lengths are one byte each
_VERSION_BYTE: Final = bytes([VERSION])
_UNSUPPORTED_BYTE: Final = bytes([UNSUPPORTED])
_ENCODING_BYTES: Final = tuple(bytes([n]) for n in range(256))
_json_encode: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# Reply topics seen valid: a client sends many requests with the same one.
_valid_topics: set[str] = set()
_MAX_VALID_TOPICS: Final = 4096


class Request(NamedTuple):
    """A decoded request: reply to ``host:port`` on ``topic`` with the same ``id``."""

    id: bytes
    encoding: int
    host: str
    port: int
    topic: str
    body: bytes


class Response(NamedTuple):
    """A decoded response; ``encoding`` 255 (:data:`UNSUPPORTED`) has an empty body."""

    id: bytes
    encoding: int
    body: bytes


# --- encodings ------------------------------------------------------------------------


def supported_encodings() -> frozenset[int]:
    """The encodings this process can encode and decode: binary, JSON, and msgpack when
    the ``msgpack`` package (the ``nsq-worker[msgpack]`` extra) is installed."""
    if msgpack is None:
        return frozenset({BINARY, JSON})
    return frozenset({BINARY, JSON, MSGPACK})


def encoding_code(encoding: int | str) -> int:
    """The wire code of ``encoding``: a name (``"json"``, ``"msgpack"``, ``"binary"``)
    or a code from 0 to 253. Raises :class:`LocalProtocolError` for anything else."""
    if isinstance(encoding, str):
        code = _CODES.get(encoding.lower())
        if code is None:
            raise LocalProtocolError(
                f"unknown RPC encoding {encoding!r}; use one of "
                + ", ".join(sorted(_NAMES[c] for c in supported_encodings()))
            )
        return code
    if isinstance(encoding, bool) or not isinstance(encoding, int) or not 0 <= encoding < RESERVED:
        raise LocalProtocolError(
            f"RPC encoding must be a name or a code from 0 to {RESERVED - 1}, got {encoding!r}"
        )
    return encoding


def encoding_name(code: int) -> str:
    """A readable name for an encoding code (``"json"``, ``"encoding 7"``)."""
    return _NAMES.get(code, "unsupported" if code == UNSUPPORTED else f"encoding {code}")


def encoding_codes(encodings: Iterable[int | str]) -> frozenset[int]:
    """Codes of ``encodings``; each must be one this process supports."""
    codes = frozenset(encoding_code(e) for e in encodings)
    missing = codes - supported_encodings()
    if missing:
        names = ", ".join(encoding_name(c) for c in sorted(missing))
        hint = " (pip install 'nsq-worker[msgpack]')" if MSGPACK in missing else ""
        raise LocalProtocolError(f"RPC encoding {names} is not available here{hint}")
    return codes


def encode_value(encoding: int, value: Any) -> bytes:
    """Serialize ``value`` as a body in ``encoding``.

    Binary takes bytes-like values as they are; JSON is compact UTF-8; msgpack uses
    the bin type for bytes. Raises :class:`LocalProtocolError` when the value cannot
    be written in that encoding or the encoding is not available.
    """
    if encoding == JSON:
        try:
            return _json_encode(value).encode()
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"cannot encode {_kind(value)} as JSON: {exc}") from exc
    if encoding == BINARY:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise LocalProtocolError(
                f"the binary RPC encoding carries bytes, got {_kind(value)}; "
                "encode it yourself or use encoding='json'"
            )
        return bytes(value)
    if encoding == MSGPACK and msgpack is not None:
        try:
            return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError) as exc:
            raise LocalProtocolError(f"cannot encode {_kind(value)} as msgpack: {exc}") from exc
    raise LocalProtocolError(f"RPC {encoding_name(encoding)} is not available here")


#: How deep a request's value may nest (lists and maps) by default: deeper is an error.
MAX_DEPTH: Final = 64


def decode_value(encoding: int, body: bytes, max_depth: int | None = MAX_DEPTH) -> Any:
    """Parse a body written in ``encoding``; :class:`RpcDecodeError` when it is not, or
    when it nests lists and maps deeper than ``max_depth`` (None: no limit)."""
    if encoding == JSON:
        try:
            value = json.loads(body)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise RpcDecodeError(f"RPC body is not JSON: {exc} ({body[:60]!r})") from exc
        except RecursionError:  # [[[[... deeper than the interpreter's stack
            raise RpcDecodeError(f"RPC body is JSON nested too deeply ({body[:60]!r})") from None
    elif encoding == BINARY:
        return body
    elif encoding == MSGPACK and msgpack is not None:
        budget = _Budget(MSGPACK_MEMORY_BASE + MSGPACK_MEMORY_FACTOR * len(body))
        try:
            value = msgpack.unpackb(
                body, raw=False, strict_map_key=False,
                object_hook=budget.take, list_hook=budget.take,
            )  # fmt: skip
        except _OverBudget:
            raise RpcDecodeError(
                f"RPC msgpack body of {len(body)} bytes decodes to more than "
                f"{budget.limit // 2**20} MiB of lists and maps; send it as JSON"
            ) from None
        except Exception as exc:  # msgpack raises several unrelated types
            raise RpcDecodeError(
                f"RPC body is not msgpack: {type(exc).__name__}: {exc} ({body[:60]!r})"
            ) from exc
    else:
        raise RpcDecodeError(f"RPC {encoding_name(encoding)} cannot be decoded here")
    if max_depth is not None and _deeper_than(value, max_depth):
        raise RpcDecodeError(f"RPC body nests lists and maps deeper than {max_depth} levels")
    return value


#: A msgpack body may decode to at most BASE + FACTOR x its size bytes of lists and maps
#: (their own memory, as sys.getsizeof counts it). One byte of msgpack is an empty map,
#: 64 bytes in Python; ordinary records take under 10 times their size.
MSGPACK_MEMORY_BASE: Final = 4 * 2**20
MSGPACK_MEMORY_FACTOR: Final = 12


class _OverBudget(Exception):
    pass


class _Budget:
    """msgpack's object_hook and list_hook: counts the memory of each container as it is
    made, and stops the decoding once it passes ``limit`` bytes."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = self.left = limit

    def take(self, value: Any) -> Any:
        self.left -= sys.getsizeof(value)
        if self.left < 0:
            raise _OverBudget
        return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` levels (no recursion)."""
    if not isinstance(value, list | dict):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, list | dict))
    return False


def _kind(value: object) -> str:
    return type(value).__name__


# --- requests -------------------------------------------------------------------------


class ReplyAddress:
    """Where responses go: an nsqd's ``host:port`` and a topic, checked once.

    A client sends every request with the same reply address, so the bytes after the
    encoding (lengths, port, host, topic) are built here once; :meth:`request` only
    joins them with the id, the encoding and the body.
    """

    __slots__ = ("_tail", "host", "port", "topic")

    def __init__(self, host: str, port: int, topic: str) -> None:
        if not isinstance(host, str) or not host:
            raise LocalProtocolError(f"RPC reply host must be a non-empty str, got {host!r}")
        try:
            host_bytes = host.encode("ascii")
        except UnicodeEncodeError:
            raise LocalProtocolError(
                f"RPC reply host {host!r} is not ASCII; give an IP address or an IDNA name"
            ) from None
        if len(host_bytes) > _MAX_FIELD:
            raise LocalProtocolError(
                f"RPC reply host is {len(host_bytes)} bytes, more than the {_MAX_FIELD} its "
                "one-byte length allows"
            )
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= _MAX_PORT:
            raise LocalProtocolError(f"RPC reply port must be 1 to {_MAX_PORT}, got {port!r}")
        check_topic(topic)  # names are at most 64 ASCII characters: fits one byte
        self.host = host
        self.port = port
        self.topic = topic
        topic_bytes = topic.encode("ascii")
        self._tail = (
            bytes([len(host_bytes), len(topic_bytes)]) + _PORT.pack(port) + host_bytes + topic_bytes
        )

    def __repr__(self) -> str:
        return f"<ReplyAddress {self.host}:{self.port} {self.topic}>"

    def request(self, id: bytes, encoding: int, body: bytes) -> bytes:
        """The bytes of a request with this reply address."""
        _check_id(id)
        if not 0 <= encoding < RESERVED:
            raise LocalProtocolError(
                f"RPC request encoding must be 0 to {RESERVED - 1}, got {encoding!r}"
            )
        return b"".join((_VERSION_BYTE, id, _ENCODING_BYTES[encoding], self._tail, body))


def encode_request(
    id: bytes, encoding: int, host: str, port: int, topic: str, body: bytes
) -> bytes:
    """The bytes of one request (see the module's layout)."""
    return ReplyAddress(host, port, topic).request(id, encoding, body)


def decode_request(data: bytes) -> Request:
    """Parse a request; :class:`RpcDecodeError` names what is wrong with it."""
    size = _REQUEST_HEADER.size
    if len(data) < size:
        _check_version(data, "request")
        raise RpcDecodeError(
            f"RPC request is {len(data)} bytes, shorter than its {size}-byte header"
        )
    _, id, encoding, host_len, topic_len, port = _REQUEST_HEADER.unpack_from(data)
    _check_version(data, "request")
    # An encoding this side does not know (the reserved 254 and 255 included) is not a
    # decode error: once the reply address reads, the endpoint answers it with the 255
    # reply and the caller falls back to JSON at once instead of timing out.
    end = size + host_len + topic_len
    if len(data) < end:
        raise RpcDecodeError(
            f"RPC request is {len(data)} bytes, too short for its {host_len}-byte host and "
            f"{topic_len}-byte topic (needs {end})"
        )
    if host_len == 0:
        raise RpcDecodeError("RPC request has an empty reply host")
    if not 0 < port <= _MAX_PORT:
        raise RpcDecodeError(f"RPC request has reply port {port}, not 1 to {_MAX_PORT}")
    try:
        host = data[size : size + host_len].decode("ascii")
        topic = data[size + host_len : end].decode("ascii")
    except UnicodeDecodeError as exc:
        raise RpcDecodeError(f"RPC request's reply host or topic is not ASCII: {exc}") from None
    if topic not in _valid_topics:
        if not is_valid_name(topic):
            raise RpcDecodeError(f"RPC request's reply topic {topic!r} is not a valid NSQ topic")
        if len(_valid_topics) >= _MAX_VALID_TOPICS:
            _valid_topics.clear()
        _valid_topics.add(topic)
    return Request(id, encoding, host, port, topic, bytes(data[end:]))


# --- responses ------------------------------------------------------------------------


def encode_response(id: bytes, encoding: int, body: bytes) -> bytes:
    """The bytes of one response; for encoding 255 use :func:`unsupported_reply`."""
    _check_id(id)
    if not 0 <= encoding < RESERVED:
        raise LocalProtocolError(
            f"RPC response encoding must be 0 to {RESERVED - 1}, got {encoding!r}"
        )
    return b"".join((_VERSION_BYTE, id, _ENCODING_BYTES[encoding], body))


def unsupported_reply(id: bytes) -> bytes:
    """The 18-byte answer to a request in an encoding the endpoint lacks."""
    _check_id(id)
    return _VERSION_BYTE + id + _UNSUPPORTED_BYTE


def decode_response(data: bytes) -> Response:
    """Parse a response; :class:`RpcDecodeError` names what is wrong with it."""
    size = _RESPONSE_HEADER.size
    if len(data) < size:
        _check_version(data, "response")
        raise RpcDecodeError(
            f"RPC response is {len(data)} bytes, shorter than its {size}-byte header"
        )
    _check_version(data, "response")
    _, id, encoding = _RESPONSE_HEADER.unpack_from(data)
    if encoding == UNSUPPORTED:
        if len(data) > size:
            raise RpcDecodeError(
                f"RPC 'unsupported encoding' reply carries {len(data) - size} body bytes; "
                "it must have none"
            )
    elif encoding == RESERVED:
        raise RpcDecodeError(f"RPC response uses the reserved encoding {encoding}")
    return Response(id, encoding, bytes(data[size:]))


# --- checks ---------------------------------------------------------------------------


def _check_version(data: bytes, what: str) -> None:
    if data and data[0] != VERSION:
        raise RpcDecodeError(
            f"RPC {what} has version {data[0]}; this side speaks version {VERSION}"
        )


def _check_id(id: bytes) -> None:
    if not isinstance(id, bytes) or len(id) != ID_LENGTH:
        raise LocalProtocolError(f"RPC id must be {ID_LENGTH} bytes, got {id!r}")


# --- RPC on NATS: the encoding in a header, no frame --------------------------------------

CONTENT_TYPES: Final = {
    JSON: "application/json",
    MSGPACK: "application/msgpack",
    BINARY: "application/octet-stream",
}
"""The ``Content-Type`` of each encoding, for RPC on NATS (docs/rpc.md)."""
_BY_CONTENT_TYPE: Final = {mime: code for code, mime in CONTENT_TYPES.items()}


def encoding_of_content_type(headers: Mapping[str, str] | None) -> int | None:
    """The encoding a NATS request's ``Content-Type`` names (JSON without one); None:
    one this side does not know."""
    mime = (headers or {}).get("Content-Type")
    if mime is None:
        return JSON
    return _BY_CONTENT_TYPE.get(mime.partition(";")[0].strip().lower())


def is_error_value(value: Any) -> bool:
    """Whether a decoded response is an endpoint's ``{"error": {"type", "message"}}``."""
    if type(value) is not dict or len(value) != 1:
        return False
    error = value.get("error")
    return type(error) is dict and isinstance(error.get("type"), str)
