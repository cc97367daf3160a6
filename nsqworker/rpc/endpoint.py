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
the response cannot be published            REQ with backoff, like any failure
==========================================  ==========================================
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, ClassVar, Final, TypeVar, cast

from nsqworker.errors import LocalProtocolError, RpcDecodeError
from nsqworker.logging import get_logger
from nsqworker.message import Message
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.lookupd import format_address
from nsqworker.nsq.producer import Producer
from nsqworker.rpc import codec
from nsqworker.rpc.codec import Request
from nsqworker.task import (
    DeadLetterHook,
    Registry,
    Reject,
    Retry,
    TaskDefinitionError,
    default_registry,
)

__all__ = ["ReplyPool", "error_value", "rpc"]

log = get_logger("nsqworker.rpc")

F = TypeVar("F", bound=Callable[..., Any])

#: Seconds a reply producer may sit unused before it is closed.
REPLY_IDLE_TIMEOUT: Final = 60.0


def error_value(exc: BaseException) -> dict[str, dict[str, str]]:
    """The error response's value for ``exc``: ``{"error": {"type", "message"}}``."""
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


# --- producers to the reply nsqd ------------------------------------------------------


class ReplyPool:
    """One :class:`Producer` per reply nsqd, made on first use, closed when idle.

    One pool per event loop (:meth:`for_loop`). A sweeper task closes, every
    ``idle_timeout`` seconds, the producers unused since its last round; when the loop
    shuts down (``asyncio.run`` cancels its tasks) the sweeper closes every producer
    left.
    """

    def __init__(self, idle_timeout: float = REPLY_IDLE_TIMEOUT) -> None:
        self.idle_timeout = idle_timeout
        self._producers: dict[tuple[str, int], Producer] = {}
        self._used: set[tuple[str, int]] = set()  # since the last sweep
        self._sweeper: asyncio.Task[None] | None = None

    _pools: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReplyPool]] = (
        weakref.WeakKeyDictionary()
    )

    @classmethod
    def for_loop(cls) -> ReplyPool:
        """The pool of the running event loop."""
        loop = asyncio.get_running_loop()
        pool = cls._pools.get(loop)
        if pool is None:
            pool = cls._pools[loop] = cls()
        return pool

    def __len__(self) -> int:
        return len(self._producers)

    def send(
        self, host: str, port: int, topic: str, body: bytes, config: ConnectionConfig | None = None
    ) -> Awaitable[None]:
        """Publish ``body`` to ``topic`` on the nsqd at ``host:port``; await the result.

        ``config`` (TLS, AUTH, timeouts) is used when a producer must be made; the
        endpoint passes the one of the connection the request came on."""
        key = (host, port)
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = Producer(
                format_address(host, port), connection_config=config, envelope=False
            )
            if self._sweeper is None or self._sweeper.done():
                self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        self._used.add(key)
        return producer.publish(topic, body)

    async def close(self) -> None:
        """Close every producer now."""
        producers = list(self._producers.values())
        self._producers.clear()
        self._used.clear()
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)

    async def _sweep(self) -> None:
        try:
            while self._producers:
                await asyncio.sleep(self.idle_timeout)
                for key in [k for k in self._producers if k not in self._used]:
                    await self._producers.pop(key).close()
                self._used.clear()
        except asyncio.CancelledError:  # the loop is shutting down: leave nothing open
            await self.close()
            raise


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
        on_dead_letter, dead_letter_topic: as for ``@task``.

    Raises:
        TaskDefinitionError, LocalProtocolError: at import, naming what to change.
    """
    accepted = codec.supported_encodings() if encodings is None else codec.encoding_codes(encodings)
    accepted |= {codec.JSON}
    target = default_registry if registry is None else registry

    def decorate(func: F) -> F:
        _check_function(topic, func)
        endpoint = _Endpoint(func, topic, frozenset(accepted))
        registered = target.task(
            topic,
            channel=channel,
            max_in_flight=max_in_flight,
            max_attempts=max_attempts,
            name=name,
            envelope=False,  # request bodies are the RPC frame, never a trace envelope
            on_dead_letter=on_dead_letter,
            dead_letter_topic=dead_letter_topic,
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
    wrapper coroutine: one coroutine less per request)."""
    handler: Any = functools.partial(_Endpoint.handle, endpoint)
    func = endpoint.func
    handler.__module__ = getattr(func, "__module__", __name__)
    handler.__name__ = getattr(func, "__name__", "handler")
    handler.__qualname__ = getattr(func, "__qualname__", handler.__name__)
    handler.__doc__ = getattr(func, "__doc__", None)
    # What the Worker checks against its transport's capabilities before it starts.
    handler.needs = {"reply_address": "a request names the broker its reply goes to"}
    handler.kind = "an @rpc endpoint"
    return cast("Callable[[Message], Any]", handler)


class _Endpoint:
    """The handler of one ``@rpc`` task."""

    def __init__(self, func: Callable[[Any], Any], topic: str, encodings: frozenset[int]) -> None:
        self.func = func
        self.topic = topic
        self.encodings = encodings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replies = ReplyPool()
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
            getattr(func, "__call__", None)  # noqa: B004 - async callable objects count too
        )

    def _pool(self) -> ReplyPool:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._replies = loop, ReplyPool.for_loop()
        return self._replies

    async def handle(self, msg: Message) -> None:
        """Decode, call, reply; see the module's table for every outcome."""
        try:
            request = codec.decode_request(msg.body)
        except RpcDecodeError as exc:
            raise Reject(str(exc)) from None
        pool = self._pool()
        if request.encoding not in self.encodings:
            reply = codec.unsupported_reply(request.id)
            await pool.send(request.host, request.port, request.topic, reply, _config(msg))
            return
        try:
            value = codec.decode_value(request.encoding, request.body)
        except RpcDecodeError as exc:
            await self._reply_error(pool, request, exc, msg)
            raise Reject(str(exc)) from None
        try:
            if self.is_async:
                result = await self.func(value)
            else:
                result = await asyncio.to_thread(self.func, value)
        except Retry:
            raise
        except Reject as exc:
            await self._reply_error(pool, request, exc, msg)
            raise
        except Exception as exc:
            log.warning(
                "answered with an error", topic=self.topic, id=msg.id, error=type(exc).__name__,
                message=str(exc), exc_info=exc,
            )  # fmt: skip
            await self._reply_error(pool, request, exc, msg)
            return
        try:
            body = codec.encode_value(request.encoding, result)
        except LocalProtocolError as exc:
            await self._reply_error(pool, request, exc, msg)
            return
        reply = codec.encode_response(request.id, request.encoding, body)
        await pool.send(request.host, request.port, request.topic, reply, _config(msg))

    @staticmethod
    async def _reply_error(
        pool: ReplyPool, request: Request, exc: BaseException, msg: Message
    ) -> None:
        encoding = codec.JSON if request.encoding == codec.BINARY else request.encoding
        body = codec.encode_value(encoding, error_value(exc))
        reply = codec.encode_response(request.id, encoding, body)
        await pool.send(request.host, request.port, request.topic, reply, _config(msg))


def _config(msg: Message) -> ConnectionConfig | None:
    """The options (TLS, AUTH...) of the connection ``msg`` came on: replies use them.

    The consumer's session holds the Connection (tests/integration/test_rpc.py checks
    this path through nsqd's view of the reply connection)."""
    return getattr(getattr(msg.receipt, "conn", None), "config", None)
