"""RPC endpoints: ``@rpc("pricing")`` turns a function of the request into a task.

The endpoint is an ordinary task (so the supervisor, settings, telemetry, backoff and
drain all apply) whose handler decodes the request, calls the function with the
request's value and publishes the response to the request's reply nsqd and topic::

    from nsqworker.rpc import rpc

    @rpc("pricing")
    async def quote(request: dict) -> dict:
        return {"sku": request["sku"], "price": 42}

What happens to each message:

==========================================  ==========================================
the request                                 the endpoint
==========================================  ==========================================
answered (the function returned)            response in the request's encoding, FIN
the function raised                         ``{"error": {"type", "message"}}`` in the
                                            request's encoding (JSON for binary), FIN
the function raised ``Retry``               REQ; the caller may time out meanwhile
the function raised ``Reject``              error response, then dead-lettered
cannot be decoded (frame or body)           dead-lettered (a body error is answered
                                            first, as an error response)
in an encoding the endpoint lacks           the 18-byte encoding-255 reply, FIN
the worker drains before it is answered     REQ 0: another worker answers it
names a reply nsqd or topic not trusted     dead-lettered, never dialled (replies.py)
on NATS, a reply subject not allowed        dead-lettered, not answered (replies.py)
the response cannot be published in 2 s     dead-lettered, no backoff (replies.py)
==========================================  ==========================================
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from nsqworker.errors import (
    LocalProtocolError,
    NoConnection,
    PublishError,
    RpcDecodeError,
    RpcUserError,
)
from nsqworker.hooks import call, is_async_callable
from nsqworker.logging import get_logger
from nsqworker.message import Message
from nsqworker.outcomes import TIME_LIMIT
from nsqworker.rpc import codec
from nsqworker.rpc.codec import Request
from nsqworker.rpc.replies import ReplyOptions, ReplyPolicy, ReplyPool, normalize_address
from nsqworker.task import (
    DeadLetterHook,
    Registry,
    Reject,
    Retry,
    TaskDefinitionError,
    default_registry,
)

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["ReplyPool", "error_value", "rpc"]

log = get_logger("nsqworker.rpc")

F = TypeVar("F", bound=Callable[..., Any])


#: Bytes of a request's body an endpoint accepts by default (nsqd's default
#: --max-msg-size); decoded msgpack is bounded by codec.MSGPACK_MEMORY_FACTOR.
MAX_REQUEST_SIZE: Final = 1024 * 1024
#: The error type a caller sees for an exception whose text is not sent.
GENERIC_ERROR: Final = "EndpointError"
# Errors whose text is meant for the caller: about its own request, or chosen by the
# endpoint's author. Not LocalProtocolError: the function's own publishing raises it
# (InvalidName, MessageTooLarge), with topics and sizes the caller has no business
# reading; a result that cannot be encoded is shown by serve() itself.
_CALLER_ERRORS: Final = (RpcUserError, RpcDecodeError, Reject)


def error_value(exc: BaseException, details: bool = True, error_id: str = "") -> dict[str, Any]:
    """The error response's value for ``exc``: ``{"error": {"type", "message"}}``.

    Without ``details`` an exception other than RpcUserError, Reject or a decode error
    is answered as ``EndpointError`` naming ``error_id`` (the request's message id, in
    the endpoint's log line), not with its own text."""
    if details or isinstance(exc, _CALLER_ERRORS):
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    message = f"the endpoint failed (error id {error_id}); its log has the details"
    return {"error": {"type": GENERIC_ERROR, "message": message}}


# --- the decorator --------------------------------------------------------------------


def rpc(
    topic: str,
    *,
    channel: str = "rpc",
    max_in_flight: int | None = None,
    max_attempts: int | None = None,
    encodings: Iterable[int | str] | None = None,
    name: str | None = None,
    registry: Registry | None = None,
    on_dead_letter: DeadLetterHook | None = None,
    dead_letter_topic: str | None = None,
    max_request_size: int = MAX_REQUEST_SIZE,
    max_depth: int | None = codec.MAX_DEPTH,
    timeout: float | None = None,
) -> Callable[[F], F]:
    """Serve RPC requests published to ``topic`` with the decorated function.

    The function takes the request's value (a dict, list... for JSON and msgpack;
    bytes for binary) and returns the response's value. ``async def`` runs on the
    worker's loop; a plain function runs in a thread.

    Args:
        topic: the endpoint's topic; callers ``call(topic, value)``.
        channel: the channel the endpoint's workers share (default ``"rpc"``).
        max_in_flight: requests handled at once (default ``Settings.max_in_flight``).
        max_attempts: deliveries of a request before it is dead-lettered.
        encodings: the encodings accepted, by name or code (default: every one this
            process supports; JSON is always added). Others get the 255 reply.
        name: the task's name (default ``module.qualname``).
        registry: where to register the task (default: the one ``@task`` uses).
        timeout: seconds the function may run (default: the ``task_timeout`` setting);
            past it the caller gets an error reply at once and the request is done.
        on_dead_letter, dead_letter_topic: as for ``@task``.
        max_request_size: bytes of a request's body accepted; larger ones are answered
            with an error and dead-lettered (default 1 MiB).
        max_depth: how deep lists and maps may nest in a request (default 64; None:
            no limit); deeper ones are answered with an error and dead-lettered.

    Raises:
        TaskDefinitionError, LocalProtocolError: at import, naming what to change.
    """
    accepted = codec.supported_encodings() if encodings is None else codec.encoding_codes(encodings)
    accepted |= {codec.JSON}
    target = default_registry if registry is None else registry

    def decorate(func: F) -> F:
        _check_function(topic, func)
        endpoint = _Endpoint(func, topic, frozenset(accepted), max_request_size, max_depth)
        registered = target.task(
            topic,
            channel=channel,
            max_in_flight=max_in_flight,
            max_attempts=max_attempts,
            name=name,
            envelope=False,  # request bodies are the RPC frame, never a trace envelope
            on_dead_letter=on_dead_letter,
            dead_letter_topic=dead_letter_topic,
            timeout=timeout,
        )(_bind(endpoint))
        func.spec = registered.spec  # type: ignore[attr-defined]
        func.endpoint = endpoint  # type: ignore[attr-defined]
        return func

    return decorate


def _check_function(topic: str, func: object) -> None:
    where = f"@rpc({topic!r})"
    if not callable(func):
        raise TaskDefinitionError(f"{where} decorates a function of the request, got {func!r}")
    name = getattr(func, "__name__", "handler")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise TaskDefinitionError(f"{where}: {name} uses yield; return the response instead")
    try:
        inspect.signature(func).bind(None)
    except TypeError:
        raise TaskDefinitionError(
            f"{where}: {name} must take exactly one positional parameter, the request: "
            f"def {name}(request)"
        ) from None
    except ValueError:  # no signature to check (some builtins): trust it
        pass


def _bind(endpoint: _Endpoint) -> Callable[[Message], Any]:
    """``endpoint.handle`` named like the user's function, for @task (a partial, not a
    wrapper coroutine: one coroutine less per request). The Worker calls its
    ``bind_settings(settings)`` for the handler it runs: the same, with the reply
    policy of the worker's settings."""

    def named(handler: Any) -> Callable[[Message], Any]:
        func = endpoint.func
        handler.__module__ = getattr(func, "__module__", __name__)
        handler.__name__ = getattr(func, "__name__", "handler")
        handler.__qualname__ = getattr(func, "__qualname__", handler.__name__)
        handler.__doc__ = getattr(func, "__doc__", None)
        return cast("Callable[[Message], Any]", handler)

    def bind_settings(settings: Settings) -> Callable[[Message], Any]:
        policy = ReplyPolicy.for_settings(settings)
        if settings.transport == "nats":  # no frame: the reply subject is the address
            return named(functools.partial(_Endpoint.serve_nats, endpoint, policy))
        return named(functools.partial(_Endpoint.serve, endpoint, policy))

    handler: Any = named(functools.partial(_Endpoint.handle, endpoint))
    handler.bind_settings = bind_settings
    # What the Worker checks against its transport's capabilities before it starts.
    handler.needs = {
        "rpc": "a request says where its reply goes: an nsqd and topic, or a NATS reply subject"
    }
    handler.serves_requests = True  # on NATS: core request/reply, not a stream
    handler.kind = "an @rpc endpoint"
    return cast("Callable[[Message], Any]", handler)


class _Endpoint:
    """The handler of one ``@rpc`` task."""

    def __init__(
        self,
        func: Callable[[Any], Any],
        topic: str,
        encodings: frozenset[int],
        max_request_size: int = MAX_REQUEST_SIZE,
        max_depth: int | None = codec.MAX_DEPTH,
    ) -> None:
        self.func = func
        self.topic = topic
        self.encodings = encodings
        self.max_request_size = max_request_size
        self.max_depth = max_depth
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies = ReplyPool()
        self._policy: ReplyPolicy | None = None  # outside a Worker: from the environment
        self.is_async = is_async_callable(func)

    def _pool(self) -> ReplyPool:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._replies = loop, ReplyPool.for_loop()
        return self._replies

    def _default_policy(self) -> ReplyPolicy:
        if self._policy is None:
            from nsqworker.settings import Settings

            self._policy = ReplyPolicy(Settings.load())
        return self._policy

    async def handle(self, msg: Message) -> None:
        """:meth:`serve` outside a Worker: the reply policy of the environment's settings."""
        await self.serve(self._default_policy(), msg)

    async def serve(self, policy: ReplyPolicy, msg: Message) -> None:
        """Decode, call, reply; see the module's table for every outcome."""
        try:
            request = codec.decode_request(msg.body)
        except RpcDecodeError as exc:
            raise Reject(str(exc)) from None
        # Before anything runs: an address or topic the worker does not trust is
        # never dialled, and the function is not called for a reply that cannot go.
        config = await policy.check(request.host, request.port, request.topic, msg.nsqd_address)
        reply = _Reply(self._pool(), policy, request, config, msg.id)
        if request.encoding not in self.encodings:
            await reply.send(codec.unsupported_reply(request.id))
            return
        try:
            if len(request.body) > self.max_request_size:
                raise RpcDecodeError(
                    f"RPC body of {len(request.body)} bytes is over the endpoint's "
                    f"max_request_size of {self.max_request_size}"
                )
            value = codec.decode_value(request.encoding, request.body, self.max_depth)
        except RpcDecodeError as exc:
            await reply.error(exc)
            raise Reject(str(exc)) from None
        try:
            result = await call(self.func, value)  # async on the loop, else in a thread
        except asyncio.CancelledError as exc:
            if exc.args != (TIME_LIMIT,):  # a stop: REQ 0, another worker answers
                raise
            # The task's time limit: the caller hears so now, and the request is done.
            await reply.error(RpcUserError("the endpoint ran past its time limit"))
            return
        except Retry:
            raise
        except Reject as exc:
            await reply.error(exc)
            raise
        except Exception as exc:
            log.warning(
                "answered with an error", topic=self.topic, id=msg.id, error=type(exc).__name__,
                message=str(exc), exc_info=exc,
            )  # fmt: skip
            await reply.error(exc)
            return
        try:
            body = codec.encode_value(request.encoding, result)
        except LocalProtocolError as exc:  # the result's type, named: the caller may say
            await reply.error(exc, shown=True)
            return
        await reply.send(codec.encode_response(request.id, request.encoding, body))

    async def serve_nats(self, policy: ReplyPolicy, msg: Message) -> None:
        """Answer one NATS request (RPC on NATS: docs/rpc.md): no frame, the encoding in
        ``Content-Type``, the reply on the request's reply subject, errors with the NATS
        service error headers (400 decode or Reject, 415 encoding, 500 raised or time
        limit, 503 Retry: a core NATS request is never delivered again)."""
        respond = getattr(msg, "respond", None)
        if respond is None:
            raise Reject("not a NATS request: no reply subject to answer on")
        # Before anything runs: a reply subject that is not an inbox (a $JS.API subject,
        # a stream's subject) is dead-lettered unanswered, and the function not called.
        policy.check_subject(msg.receipt)
        details = policy.error_details
        encoding = codec.encoding_of_content_type(msg.headers)
        reply_encoding = codec.JSON if encoding in (None, codec.BINARY) else encoding

        async def error(exc: BaseException, code: int, shown: bool = False) -> None:
            value = error_value(exc, shown or details, msg.id)
            headers = {
                "Content-Type": codec.CONTENT_TYPES[reply_encoding],
                "Nats-Service-Error": value["error"]["message"]
                .replace("\r", " ")
                .replace("\n", " "),
                "Nats-Service-Error-Code": str(code),
            }
            await respond(msg.receipt, codec.encode_value(reply_encoding, value), headers)

        if encoding is None or encoding not in self.encodings:
            mime = (msg.headers or {}).get("Content-Type", "")
            await error(RpcUserError(f"unsupported encoding {mime!r}; send application/json"), 415)
            return
        try:
            if len(msg.body) > self.max_request_size:
                raise RpcDecodeError(
                    f"RPC body of {len(msg.body)} bytes is over the endpoint's "
                    f"max_request_size of {self.max_request_size}"
                )
            value = codec.decode_value(encoding, msg.body, self.max_depth)
        except RpcDecodeError as exc:
            await error(exc, 400)
            raise Reject(str(exc)) from None
        try:
            result = await call(self.func, value)
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
                "answered with an error", topic=self.topic, id=msg.id, error=type(exc).__name__,
                message=str(exc), exc_info=exc,
            )  # fmt: skip
            await error(exc, 500)
            return
        try:
            body = codec.encode_value(encoding, result)
        except LocalProtocolError as exc:
            await error(exc, 500, shown=True)
            return
        await respond(msg.receipt, body, {"Content-Type": codec.CONTENT_TYPES[encoding]})


class _Reply:
    """The reply to one request: where it goes, and what a failed delivery becomes."""

    __slots__ = ("config", "error_id", "policy", "pool", "request")

    def __init__(
        self,
        pool: ReplyPool,
        policy: ReplyPolicy,
        request: Request,
        config: ReplyOptions,
        error_id: str,
    ) -> None:
        self.pool, self.policy, self.request, self.config = pool, policy, request, config
        self.error_id = error_id

    async def error(self, exc: BaseException, shown: bool = False) -> None:
        request = self.request
        encoding = codec.JSON if request.encoding == codec.BINARY else request.encoding
        value = error_value(exc, shown or self.policy.error_details, self.error_id)
        body = codec.encode_value(encoding, value)
        await self.send(codec.encode_response(request.id, encoding, body))

    async def send(self, body: bytes) -> None:
        """Publish the reply; Reject (dead letter, no backoff) when it cannot be."""
        request = self.request
        try:
            await self.pool.send(request.host, request.port, request.topic, body, self.config)
        except (NoConnection, ConnectionError, TimeoutError) as exc:
            address = normalize_address(request.host, request.port)
            self.policy.failed(address)
            await self.pool.drop(request.host, request.port, self.config)
            raise Reject(f"reply nsqd {address} unreachable: {exc}; not answered") from None
        except (PublishError, LocalProtocolError) as exc:
            address = normalize_address(request.host, request.port)
            raise Reject(f"reply to {address} refused: {exc}; not answered") from None
