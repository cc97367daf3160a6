"""Calling RPC endpoints: :class:`RpcClient` (asyncio) and :class:`SyncRpcClient` (threads).

A client owns one reply topic, ``rpc_<32 hex>#ephemeral``, on one nsqd (its *reply
nsqd*), consumed on the ephemeral channel ``reply#ephemeral``. Requests are published
through a :class:`~nsqworker.nsq.producer.Producer` to any of the client's nsqd and
carry the reply nsqd's ``host:port`` and the reply topic; the endpoint publishes the
response there. Calls are matched to responses by a 16-byte id: 8 random bytes per
client, then a counter.

nsqd keeps an ``#ephemeral`` topic in memory only and drops it when its last channel
goes, which happens when the client disconnects. On close the client also deletes the
topic through nsqd's HTTP API (``POST /topic/delete``) when it knows that address:
``nsqd_http_address=`` or, with lookupd, the ``http_port`` nsqlookupd reports. nsqd's
IDENTIFY answer does not tell its HTTP port, so it is never guessed.
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from nsqworker.consumer import Consumer
from nsqworker.errors import (
    ConfigurationError,
    ConnectionClosed,
    LocalProtocolError,
    NoConnection,
    RpcDecodeError,
    RpcError,
    RpcTimeout,
)
from nsqworker.message import FINISH, Message, Outcome
from nsqworker.nsq.lookupd import get_json, listed_nsqd, matches_address
from nsqworker.nsq.options import ConnectionConfig
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.subscription import NsqSubscription
from nsqworker.rpc import codec
from nsqworker.rpc.codec import Response, is_error_value

if TYPE_CHECKING:
    from nsqworker.rpc.nats import NatsCaller
    from nsqworker.settings import Settings

__all__ = ["RpcClient", "is_error_value"]

REPLY_CHANNEL: Final = "reply#ephemeral"
_COUNTER: Final = struct.Struct(">Q")


def _expire(future: asyncio.Future[Response]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigurationError(f"nsqd address {address!r} is not host:port")
    return host.strip("[]"), int(port)


class RpcClient:
    """Calls RPC endpoints over NSQ; ``async with RpcClient(["127.0.0.1:4150"]) as c``.

    Args:
        nsqd_tcp_addresses: nsqd to publish requests to; the first is the reply nsqd.
            Default: ``settings.nsqd_tcp_addresses``.
        lookupd_http_addresses: instead of nsqd addresses, find every nsqd through
            nsqlookupd's ``/nodes`` (the first listed becomes the reply nsqd). The
            answer is checked like the worker's discovery, ``lookupd_allowed_nsqd``
            applies, and those nsqd get the AUTH secret only over TLS unless
            ``lookupd_auth_without_tls``.
        settings: connection settings (TLS, AUTH, timeouts); default from the
            environment. With ``transport="nats"`` (and no nsqd or lookupd given)
            calls are NATS requests to ``nats_servers`` (docs/rpc.md, "RPC on NATS").
        reply_nsqd: the nsqd (TCP ``host:port``) to receive responses on, as
            endpoints will reach it; default the first of ``nsqd_tcp_addresses``.
        nsqd_http_address: the reply nsqd's HTTP ``host:port``, used to delete the
            reply topic on close.
        timeout: default seconds a call waits for its response.
        encoding: default encoding of requests (``"json"``, ``"msgpack"``,
            ``"binary"``).
        max_in_flight: responses nsqd may push at once (nsqd caps it at its
            ``--max-rdy-count``, 2500 by default).

    Counters: ``calls``, ``timeouts``, ``late_replies`` (responses that came after
    their call gave up, or that nobody asked for: dropped), ``fallbacks`` (calls
    resent as JSON after a 255 reply), ``bad_replies`` (undecodable, dropped).
    """

    def __init__(
        self,
        nsqd_tcp_addresses: list[str] | str | None = None,
        *,
        lookupd_http_addresses: list[str] | str | None = None,
        settings: Settings | None = None,
        reply_nsqd: str | None = None,
        nsqd_http_address: str | None = None,
        timeout: float = 5.0,
        encoding: int | str = "json",
        max_in_flight: int = 2500,
    ) -> None:
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        if settings is None:
            from nsqworker.settings import Settings as _Settings

            settings = _Settings()
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [a.strip() for a in nsqd_tcp_addresses.split(",") if a.strip()]
        if isinstance(lookupd_http_addresses, str):
            lookupd_http_addresses = [lookupd_http_addresses]
        self._nats: NatsCaller | None = None
        if settings.transport == "nats" and not nsqd_tcp_addresses and not lookupd_http_addresses:
            from nsqworker.rpc.nats import NatsCaller

            self._nats = NatsCaller(settings)
        elif not nsqd_tcp_addresses and not lookupd_http_addresses:
            nsqd_tcp_addresses = list(settings.nsqd_tcp_addresses)
            lookupd_http_addresses = list(settings.lookupd_http_addresses)
        if not nsqd_tcp_addresses and not lookupd_http_addresses and self._nats is None:
            raise ConfigurationError(
                "RpcClient needs nsqd addresses or lookupd addresses "
                "(or NSQWORKER_NSQD_TCP_ADDRESSES in the environment)"
            )
        self._settings = settings
        self._nsqd = list(nsqd_tcp_addresses or [])
        self._discovered: set[str] = set()  # nsqd lookupd named: no secret in plain TCP
        self._lookupd = list(lookupd_http_addresses or [])
        self.nsqd_http_address = nsqd_http_address
        self.timeout = timeout
        self.encoding = codec.encoding_code(encoding)
        self.max_in_flight = max_in_flight
        self.reply_topic = f"rpc_{uuid.uuid4().hex}#ephemeral"
        self.reply_nsqd = reply_nsqd or (self._nsqd[0] if self._nsqd else "")
        self._prefix = os.urandom(8)
        self._counter = 0
        self._pending: dict[bytes, asyncio.Future[Response]] = {}
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._reply: codec.ReplyAddress | None = None
        self._started = False
        self._starting: asyncio.Future[None] | None = None
        self._ready = False
        self._closed = False
        self.calls = 0
        self.timeouts = 0
        self.late_replies = 0
        self.fallbacks = 0
        self.bad_replies = 0

    def __repr__(self) -> str:
        return f"<RpcClient reply={self.reply_nsqd} {self.reply_topic} pending={self.pending}>"

    @property
    def pending(self) -> int:
        """Calls waiting for their response."""
        return len(self._pending)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to the reply topic and connect the producer; returns when both are
        up. Raises :class:`NoConnection` when the reply nsqd cannot be reached."""
        if self._closed:
            raise ConnectionClosed("this RpcClient was closed; make a new one")
        if self._starting is None:  # calls made before start() share the one start
            self._started = True
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        if self._nats is not None:
            await self._nats.start()
            self._ready = True
            return
        given = self.reply_nsqd  # the caller's choice, not lookupd's: a direct nsqd
        if not self._nsqd:
            await self._discover()
            self.reply_nsqd = given or self._nsqd[0]
        host, port = _split(self.reply_nsqd)
        self._reply = codec.ReplyAddress(host, port, self.reply_topic)
        settings = self._settings.model_copy(
            update={
                "transport": "nsq",
                "nsqd_tcp_addresses": [self.reply_nsqd],
                "lookupd_http_addresses": [],
            }
        )
        self._consumer = Consumer(
            self.reply_topic, REPLY_CHANNEL, self._on_reply, settings,
            max_in_flight=self.max_in_flight, name=f"rpc replies {self.reply_topic}",
        )  # fmt: skip
        config = ConnectionConfig.from_settings(self._settings)
        if self._discovered:  # security: lookupd is unauthenticated (docs/security.md)
            config = config.for_discovered()
            subscription = self._consumer.subscription
            assert isinstance(subscription, NsqSubscription)
            subscription.connections.found_through_lookupd(self._discovered - {given})
        self._producer = Producer(
            self._nsqd, settings=self._settings, connection_config=config, envelope=False
        )
        await self._consumer.start()
        if not self._consumer.subscribed:
            await self._consumer.stop(0)
            raise NoConnection(
                f"could not subscribe to the RPC reply topic on {self.reply_nsqd}; is nsqd up?"
            )
        await self._producer.connect(self.timeout)
        self._ready = True

    async def _discover(self) -> None:
        """Find the nsqd through nsqlookupd's /nodes, validated like the worker's
        discovery (size cap, entries checked, ``lookupd_allowed_nsqd``)."""
        import httpx  # here, not at import: it costs ~60 ms

        allow = list(getattr(self._settings, "lookupd_allowed_nsqd", []) or [])
        found: dict[str, str | None] = {}
        problems: list[str] = []
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as http:
            for lookupd in self._lookupd:
                url = lookupd if "://" in lookupd else f"http://{lookupd}"
                try:
                    payload = await get_json(http, f"{url.rstrip('/')}/nodes")
                    listed = listed_nsqd(payload)
                except (httpx.HTTPError, ValueError) as exc:
                    problems.append(f"{lookupd}: {type(exc).__name__}: {exc}")
                    continue
                refused = [a for a in listed if allow and not matches_address(a, allow)]
                if refused:
                    problems.append(
                        f"{lookupd} lists {', '.join(refused[:5])}, not matched by "
                        "lookupd_allowed_nsqd"
                    )
                if not listed:
                    problems.append(f"{lookupd} lists no usable nsqd: {payload!r:.200}")
                for address, web in listed.items():
                    if address not in refused:
                        found.setdefault(address, web)
        if not found:
            raise NoConnection(
                f"no nsqd found through nsqlookupd {', '.join(self._lookupd)}"
                + (f" ({'; '.join(problems)})" if problems else "")
            )
        self._nsqd = list(found)
        self._discovered = set(found)
        if self.nsqd_http_address is None and not self.reply_nsqd:
            self.nsqd_http_address = found[self._nsqd[0]]

    async def close(self, timeout: float = 5.0) -> None:
        """Fail pending calls with :class:`ConnectionClosed`, unsubscribe, close the
        producer and delete the reply topic. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionClosed("the RpcClient closed during the call"))
        if self._nats is not None:
            await self._nats.close()
        if self._consumer is not None:
            await self._consumer.stop(0)
        if self._producer is not None:
            await self._producer.close(timeout)
        if self._started and self.nsqd_http_address:
            await self._delete_topic(timeout)

    async def _delete_topic(self, timeout: float) -> None:
        import httpx  # here, not at import: it costs ~60 ms

        url = self.nsqd_http_address or ""
        url = url if "://" in url else f"http://{url}"
        try:
            async with httpx.AsyncClient(timeout=timeout) as http:
                answer = await http.post(f"{url}/topic/delete", params={"topic": self.reply_topic})
        except httpx.HTTPError:
            return  # ephemeral: nsqd drops it anyway once its channel is gone
        if answer.status_code not in (200, 404):  # 404: nsqd dropped it already
            answer.raise_for_status()

    # --- calls ----------------------------------------------------------------------

    async def call(
        self,
        topic: str,
        value: Any,
        *,
        timeout: float | None = None,
        encoding: int | str | None = None,
    ) -> Any:
        """Send ``value`` to the endpoint on ``topic`` and return its response's value.

        Args:
            topic: the endpoint's topic.
            value: the request (bytes for the binary encoding).
            timeout: seconds to wait for the response (default ``self.timeout``).
            encoding: of this request (default ``self.encoding``); an endpoint that
                lacks it answers 255 and the call is resent once as JSON.

        Raises:
            RpcError: the endpoint raised; ``type`` and ``message`` are its error's.
            RpcTimeout: no response within ``timeout`` seconds.
            LocalProtocolError: the value cannot be written in the encoding.
            ConnectionClosed: the client closed during the call.
        """
        code = self.encoding if encoding is None else codec.encoding_code(encoding)
        timeout = self.timeout if timeout is None else timeout
        if not self._ready:
            await self.start()
        if self._nats is not None:
            if self._closed:
                raise ConnectionClosed("the RpcClient is closed")
            self.calls += 1
            try:
                return await self._nats.call(topic, value, timeout, code)
            except RpcTimeout:
                self.timeouts += 1
                raise
        body = codec.encode_value(code, value)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.calls += 1
        response = await self._round_trip(topic, code, body, deadline, timeout)
        if response.encoding == codec.UNSUPPORTED:
            if code == codec.JSON:
                raise RpcError("UnsupportedEncoding", "the endpoint refused JSON", topic)
            try:
                body = codec.encode_value(codec.JSON, value)
            except LocalProtocolError as exc:
                raise RpcError(
                    "UnsupportedEncoding",
                    f"the endpoint lacks {codec.encoding_name(code)} and the value cannot be "
                    f"sent as JSON: {exc}",
                    topic,
                ) from None
            self.fallbacks += 1
            response = await self._round_trip(topic, codec.JSON, body, deadline, timeout)
            if response.encoding == codec.UNSUPPORTED:
                raise RpcError("UnsupportedEncoding", "the endpoint refused JSON", topic)
        result = codec.decode_value(response.encoding, response.body)
        if response.encoding != codec.BINARY and is_error_value(result):
            error = result["error"]
            raise RpcError(error["type"], str(error.get("message", "")), topic)
        return result

    async def _round_trip(
        self, topic: str, code: int, body: bytes, deadline: float, timeout: float
    ) -> Response:
        if self._closed:
            raise ConnectionClosed("the RpcClient is closed")
        assert self._reply is not None and self._producer is not None
        self._counter += 1
        id = self._prefix + _COUNTER.pack(self._counter)
        frame = self._reply.request(id, code, body)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Response] = loop.create_future()
        self._pending[id] = future
        # One timer per call, not asyncio.timeout(): this is the hot path.
        timer = loop.call_at(deadline, _expire, future)
        try:
            await self._producer.publish(topic, frame, timeout=max(deadline - loop.time(), 1e-3))
            return await future
        except TimeoutError:
            self.timeouts += 1
            raise RpcTimeout(f"no response from {topic!r} within {timeout:g}s") from None
        finally:
            timer.cancel()
            self._pending.pop(id, None)
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, also when publish() raised first

    def _on_reply(self, msg: Message) -> Outcome:
        """The reply consumer's callback: hand the response to its call; always FIN."""
        try:
            response = codec.decode_response(msg.body)
        except RpcDecodeError:
            self.bad_replies += 1
            return FINISH
        future = self._pending.pop(response.id, None)
        if future is None or future.done():
            self.late_replies += 1
        else:
            future.set_result(response)
        return FINISH
