"""One consuming connection to RabbitMQ's stream port: the codec of
:mod:`nsqworker.streams.wire` on an ``asyncio.Protocol``.

Chunks are parsed in ``data_received`` and handed to ``on_chunk`` at once, on the loop,
with no task or future per chunk or message (rstream read 256 bytes per await and built a
frame object, a context and a decoder call per message: most of its time). Requests
(subscribe, query offset, unsubscribe) wait for their answer by correlation id; a
ConsumerUpdate from the server is answered with what ``on_update`` returns; heartbeats
go out every negotiated interval, and a server silent for two of them, a Close, a
MetadataUpdate about one of its streams or bytes that are not the protocol end the link
(``on_lost`` is called once; the subscription resubscribes from its stored offsets).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nsqworker.errors import RemoteProtocolError
from nsqworker.streams import stats, wire
from nsqworker.streams.wire import BrokerRefused, Chunk

__all__ = ["StreamLink"]

log = logging.getLogger("nsqworker.streams")

REQUEST_TIMEOUT = 10.0
"""Seconds a request waits for its answer."""
HEARTBEAT = 60
"""Seconds between heartbeats we ask for (the server may ask for less)."""

OnChunk = Callable[[Chunk], None]
OnUpdate = Callable[[int, bool], Awaitable[tuple[int, int]]]
OnLost = Callable[[str], None]


class StreamLink(asyncio.Protocol):
    """A stream connection that consumes; build it with :meth:`connect`."""

    def __init__(self, on_chunk: OnChunk, on_update: OnUpdate, on_lost: OnLost) -> None:
        self.on_chunk = on_chunk
        self.on_update = on_update
        self.on_lost = on_lost
        self.address = ""
        self.streams: set[str] = set()
        self._reader = wire.FrameReader()
        self._transport: asyncio.Transport | None = None
        self._waiting: dict[int, tuple[asyncio.Future[bytes], int]] = {}
        self._next = 0
        self._tune: asyncio.Future[tuple[int, int]] | None = None
        self._closed = False
        self._lost_called = False
        self._heard = time.monotonic()
        self._heartbeat = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- opening ---------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        vhost: str,
        username: str,
        password: str,
        ssl_context: ssl.SSLContext | None,
        name: str,
        frame_max: int,
        on_chunk: OnChunk,
        on_update: OnUpdate,
        on_lost: OnLost,
    ) -> StreamLink:
        """Connect, authenticate (SASL PLAIN), tune and open ``vhost``.

        Raises:
            OSError, TimeoutError: the server cannot be reached.
            BrokerRefused: the login or the vhost was refused (``code`` 8 or 12, ...).
        """
        loop = asyncio.get_running_loop()
        link = cls(on_chunk, on_update, on_lost)
        link.address = f"{host}:{port}"
        await asyncio.wait_for(
            loop.create_connection(
                lambda: link, host, port, ssl=ssl_context,
                server_hostname=host if ssl_context is not None else None,
            ),
            REQUEST_TIMEOUT,
        )  # fmt: skip
        try:
            await link.handshake(vhost, username, password, name, frame_max)
        except BaseException:
            link.abort()
            raise
        return link

    async def handshake(
        self, vhost: str, username: str, password: str, name: str, frame_max: int
    ) -> None:
        """Open the stream protocol session: peer properties, SASL PLAIN, tune, open
        ``vhost`` (what :meth:`connect` does once the socket is up)."""
        properties = {"product": "nsqworker", "connection_name": name}
        await self._request(
            lambda c: stats.encode_peer_properties(c, properties), "peer properties"
        )
        answer = await self._request(stats.encode_sasl_handshake, "SASL handshake")
        mechanisms = wire.parse_sasl_mechanisms(answer)
        if "PLAIN" not in mechanisms:
            raise BrokerRefused(7, f"SASL mechanisms {mechanisms} (PLAIN needed)")
        self._tune = asyncio.get_running_loop().create_future()
        await self._request(
            lambda c: stats.encode_sasl_authenticate(c, username, password), "login"
        )
        server_max, server_heartbeat = await asyncio.wait_for(self._tune, REQUEST_TIMEOUT)
        agreed_max = min(frame_max, server_max) if server_max else frame_max
        self._heartbeat = min(HEARTBEAT, server_heartbeat) if server_heartbeat else HEARTBEAT
        self._write(stats.encode_tune(agreed_max, self._heartbeat))
        await self._request(lambda c: stats.encode_open(c, vhost), f"vhost {vhost!r}")
        self._schedule_heartbeat()

    # --- requests --------------------------------------------------------------

    async def brokers(self, streams: list[str]) -> dict[str, tuple[str, int]]:
        """Where to read each of ``streams``: a replica, else its leader, as RabbitMQ
        advertises them (rstream and the Java client choose so too).

        Raises:
            BrokerRefused: a stream is missing or not available now.
        """
        answer = await self._request(lambda c: wire.metadata(c, streams), "metadata", check=False)
        out: dict[str, tuple[str, int]] = {}
        for stream, (code, places) in wire.parse_metadata(answer).items():
            if code != wire.OK or not places:
                raise BrokerRefused(code if code != wire.OK else 6, f"metadata of {stream!r}")
            out[stream] = places[0] if len(places) == 1 else random.choice(places[:-1])
        return out

    async def _request(self, build: Callable[[int], bytes], what: str, check: bool = True) -> bytes:
        if self._closed:
            raise ConnectionError(f"stream connection to {self.address} is closed")
        self._next = correlation = (self._next + 1) & 0xFFFFFFFF
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        frame = build(correlation)
        self._waiting[correlation] = (future, wire.frame_key(frame))
        self._write(frame)
        try:
            answer = await asyncio.wait_for(future, REQUEST_TIMEOUT)
        finally:
            self._waiting.pop(correlation, None)
        _, _, code = wire.parse_response(answer)
        if check and code != wire.OK:
            raise BrokerRefused(code, what)
        return answer

    async def subscribe(
        self,
        subscription_id: int,
        stream: str,
        offset_type: int,
        offset: int,
        credit: int,
        properties: dict[str, str],
    ) -> None:
        """Subscribe to ``stream`` (RabbitMQ then sends up to ``credit`` chunks).

        Raises:
            BrokerRefused: refused (the stream is missing or not available, ...).
        """
        frame = lambda c: wire.subscribe(  # noqa: E731
            c, subscription_id, stream, offset_type, offset, credit, properties
        )
        await self._request(frame, f"subscribe to {stream!r}")
        self.streams.add(stream)

    async def unsubscribe(self, subscription_id: int) -> None:
        """End a subscription."""
        await self._request(lambda c: stats.encode_unsubscribe(c, subscription_id), "unsubscribe")

    async def query_offset(self, reference: str, stream: str) -> int:
        """The offset stored for ``reference`` on ``stream``.

        Raises:
            BrokerRefused: ``code`` 19 (no offset stored), 6 (not available), ...
        """
        answer = await self._request(
            lambda c: stats.encode_query_offset(c, reference, stream), f"offset of {stream!r}"
        )
        return wire.parse_offset(answer)

    def credit(self, subscription_id: int, count: int = 1) -> None:
        """Let the broker send ``count`` more chunks."""
        self._write(stats.encode_credit(subscription_id, count))

    def store_offset(self, reference: str, stream: str, offset: int) -> None:
        """Store ``offset`` for ``reference`` (RabbitMQ does not answer).

        Raises:
            ConnectionError: the link is closed.
        """
        if self._closed:
            raise ConnectionError(f"stream connection to {self.address} is closed")
        self._write(wire.store_offset(reference, stream, offset))

    @property
    def closed(self) -> bool:
        """True once the connection is gone (or going)."""
        return self._closed

    async def close(self) -> None:
        """Say Close, wait briefly for the answer, and drop the connection."""
        if self._closed:
            return
        try:
            await asyncio.wait_for(self._request(stats.encode_close, "close"), 2.0)
        except Exception:
            log.debug("closing a stream connection cleanly failed", exc_info=True)
        self.abort()

    def abort(self) -> None:
        """Drop the connection now."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._transport is not None:
            self._transport.abort()

    # --- the protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._heard = time.monotonic()
        try:
            for frame in self._reader.feed(data):
                if frame[0] == 0 and frame[1] == wire.DELIVER:
                    self.on_chunk(wire.parse_chunk(frame, lazy=True))
                else:
                    self._control(frame)
        except RemoteProtocolError as exc:
            log.error("RabbitMQ at %s sent what is not the stream protocol: %s", self.address, exc)
            self._lose(f"protocol error: {exc}")
            self.abort()

    def _control(self, frame: bytes) -> None:
        if len(frame) < 4:
            raise RemoteProtocolError(f"stream frame of {len(frame)} bytes, too short")
        key = wire.frame_key(frame)
        if key == wire.CREDIT | wire.RESPONSE:  # only sent when a credit was refused
            log.warning("RabbitMQ at %s refused a credit (frame %s)", self.address, frame.hex())
        elif key & wire.RESPONSE:
            _, correlation, _ = wire.parse_response(frame)
            waiting = self._waiting.get(correlation)
            if waiting is not None and not waiting[0].done():
                waiting[0].set_result(frame)
        elif key == wire.HEARTBEAT:
            pass
        elif key == wire.TUNE:
            if self._tune is not None and not self._tune.done():
                self._tune.set_result(wire.parse_tune(frame))
        elif key == wire.CONSUMER_UPDATE:
            self._spawn(self._answer_update(*wire.parse_consumer_update(frame)))
        elif key == wire.METADATA_UPDATE:
            stream = wire.parse_metadata_update(frame)
            if stream in self.streams:
                self._lose(f"stream {stream!r} changed (deleted, or its leader moved)")
                self.abort()
        elif key == wire.CLOSE:
            correlation = int.from_bytes(frame[4:8], "big") if len(frame) >= 8 else 0
            self._write(wire.close_ok(correlation))
            self._lose("RabbitMQ closed the connection")
            self.abort()
        else:
            log.debug("RabbitMQ at %s sent frame key %d; ignored", self.address, key)

    async def _answer_update(self, correlation: int, subscription_id: int, active: bool) -> None:
        try:
            offset_type, offset = await self.on_update(subscription_id, active)
        except Exception as exc:
            log.error("%s: answering a consumer update failed: %s", self.address, exc)
            self._lose(f"consumer update failed: {exc}")
            self.abort()
            return
        if not self._closed:
            self._write(wire.consumer_update_answer(correlation, offset_type, offset))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError(f"stream connection to {self.address} lost"))
        self._lose(f"connection lost ({exc})" if exc else "connection closed")

    def _lose(self, why: str) -> None:
        if not self._lost_called:
            self._lost_called = True
            self.on_lost(why)

    # --- helpers ---------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _schedule_heartbeat(self) -> None:
        if self._heartbeat and not self._closed:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._heartbeat, self._beat)

    def _beat(self) -> None:
        if time.monotonic() - self._heard > 2 * self._heartbeat:
            self._lose(f"RabbitMQ silent for {2 * self._heartbeat} s")
            self.abort()
            return
        self._write(wire.heartbeat())
        self._schedule_heartbeat()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
