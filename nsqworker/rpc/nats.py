"""RPC on NATS: ``@rpc`` endpoints answer NATS requests, and the caller that sends them.

NATS has request/reply built in: a request carries a reply subject that NATS routes
back to the caller, so there is no RPC frame, no reply address and no reply policy. The
body is the value itself, in the encoding its ``Content-Type`` header names
(``application/json``, the default when there is none; ``application/msgpack``;
``application/octet-stream`` for binary), and the response is in the same encoding with
the same header. Errors are the ``{"error": {"type", "message"}}`` value of NSQ (JSON
for a binary request), plus the headers NATS services use, ``Nats-Service-Error`` and
``Nats-Service-Error-Code`` (400 a request that does not decode, 415 an encoding the
endpoint lacks, 500 the function raised, 503 it asked to be retried). Any NATS client
is a caller: ``nats req pricing '{"sku": 7}'``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from nsqworker.errors import LocalProtocolError, RpcDecodeError, RpcError, RpcTimeout, RpcUserError
from nsqworker.hooks import call
from nsqworker.logging import get_logger
from nsqworker.message import Message
from nsqworker.outcomes import TIME_LIMIT, Reject, Retry
from nsqworker.rpc import codec

if TYPE_CHECKING:
    from nsqworker.rpc.endpoint import _Endpoint
    from nsqworker.settings import Settings

__all__ = ["CONTENT_TYPES", "NatsCaller", "encoding_of", "serve_nats"]

log = get_logger("nsqworker.rpc")

CONTENT_TYPES: Final = {
    codec.JSON: "application/json",
    codec.MSGPACK: "application/msgpack",
    codec.BINARY: "application/octet-stream",
}
_BY_TYPE: Final = {mime: code for code, mime in CONTENT_TYPES.items()}


def encoding_of(headers: Mapping[str, str] | None) -> int | None:
    """The encoding a request's ``Content-Type`` names (JSON without one); None: one
    this side does not know."""
    mime = (headers or {}).get("Content-Type")
    if mime is None:
        return codec.JSON
    return _BY_TYPE.get(mime.partition(";")[0].strip().lower())


# --- the endpoint's side --------------------------------------------------------------


async def serve_nats(endpoint: _Endpoint, details: bool, msg: Message) -> None:
    """Answer one NATS request with ``endpoint``'s function (see the module)."""
    from nsqworker.rpc.endpoint import error_value

    respond = getattr(msg, "respond", None)
    if respond is None:
        raise Reject("not a NATS request: no reply subject to answer on")
    encoding = encoding_of(msg.headers)
    reply_encoding = codec.JSON if encoding in (None, codec.BINARY) else encoding

    async def error(exc: BaseException, code: int, shown: bool = False) -> None:
        value = error_value(exc, shown or details, msg.id)
        headers = {
            "Content-Type": CONTENT_TYPES[reply_encoding],
            "Nats-Service-Error": value["error"]["message"].replace("\r", " ").replace("\n", " "),
            "Nats-Service-Error-Code": str(code),
        }
        await respond(msg.receipt, codec.encode_value(reply_encoding, value), headers)

    if encoding is None or encoding not in endpoint.encodings:
        mime = (msg.headers or {}).get("Content-Type", "")
        await error(RpcUserError(f"unsupported encoding {mime!r}; send application/json"), 415)
        return
    try:
        if len(msg.body) > endpoint.max_request_size:
            raise RpcDecodeError(
                f"RPC body of {len(msg.body)} bytes is over the endpoint's "
                f"max_request_size of {endpoint.max_request_size}"
            )
        value = codec.decode_value(encoding, msg.body, endpoint.max_depth)
    except RpcDecodeError as exc:
        await error(exc, 400)
        raise Reject(str(exc)) from None
    try:
        result = await call(endpoint.func, value)
    except asyncio.CancelledError as exc:
        if exc.args != (TIME_LIMIT,):  # a stop: the caller's timeout is its retry
            raise
        await error(RpcUserError("the endpoint ran past its time limit"), 500)
        return
    except Retry as exc:  # core NATS never delivers a request again: the caller retries
        await error(RpcUserError(f"the endpoint asks to retry later: {exc.reason or exc}"), 503)
        return
    except Reject as exc:
        await error(exc, 400)
        raise
    except Exception as exc:
        log.warning(
            "answered with an error", topic=endpoint.topic, id=msg.id, error=type(exc).__name__,
            message=str(exc), exc_info=exc,
        )  # fmt: skip
        await error(exc, 500)
        return
    try:
        body = codec.encode_value(encoding, result)
    except LocalProtocolError as exc:
        await error(exc, 500, shown=True)
        return
    await respond(msg.receipt, body, {"Content-Type": CONTENT_TYPES[encoding]})


# --- the caller's side ------------------------------------------------------------------


class NatsCaller:
    """What :class:`~nsqworker.rpc.RpcClient` uses on ``transport="nats"``: NATS
    requests on one connection of ``settings`` (``nats_servers``, credentials, TLS)."""

    def __init__(self, settings: Settings) -> None:
        from nsqworker.nats.client import NatsConnection

        self.connection = NatsConnection(settings, name=f"nsqworker-rpc {settings.client_id}")

    async def start(self) -> None:
        """Connect (NoConnection when no server answers, ConfigurationError if refused)."""
        await self.connection.get()

    async def close(self) -> None:
        """Close the connection."""
        await self.connection.close()

    async def call(self, topic: str, value: Any, timeout: float, encoding: int) -> Any:
        """One request: the response's value; RpcError, RpcTimeout as on NSQ."""
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        from nsqworker.nats.jetstream import check_subject
        from nsqworker.rpc.client import is_error_value

        body = codec.encode_value(encoding, value)
        client = await self.connection.get()
        headers = {"Content-Type": CONTENT_TYPES[encoding]}
        try:
            reply = await client.request(
                check_subject(topic), body, timeout=timeout, headers=headers
            )
        except NoRespondersError:
            raise RpcError("NoResponders", f"no endpoint serves {topic!r} on NATS", topic) from None
        except (NatsTimeout, TimeoutError):
            raise RpcTimeout(f"no response from {topic!r} within {timeout:g}s") from None
        answer = encoding_of(reply.headers)
        if answer is None:
            raise RpcDecodeError(f"response from {topic!r} in an unknown encoding")
        result = codec.decode_value(answer, reply.data)
        if answer != codec.BINARY and is_error_value(result):
            error = result["error"]
            raise RpcError(error["type"], str(error.get("message", "")), topic)
        return result
