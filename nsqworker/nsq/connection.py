"""One TCP connection to nsqd: after the handshake, frames in and commands out.

:class:`Connection` is an :class:`asyncio.Protocol` (streams cost too much per
message). After the dial, it carries out the steps of a
:class:`~nsqworker.nsq.handshake.Negotiation`, feeding it nsqd's frames one at a time;
after it, ``data_received`` decodes every frame of a chunk, hands messages to
``on_message`` inline, matches answers to requests in order, and flushes what the
callbacks wrote once per chunk. It knows nothing about tasks, RDY policy or backoff.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from nsqworker.errors import (
    NON_FATAL_CODES,
    ConfigurationError,
    ConnectionClosed,
    NSQDError,
    NSQWorkerError,
    PublishError,
    RemoteProtocolError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.handshake import (
    ASSUMED_HEARTBEAT,
    Compress,
    Negotiation,
    Send,
    StartTLS,
    connect_error,
)
from nsqworker.nsq.options import ConnectionConfig, ServerInfo
from nsqworker.nsq.protocol import ErrorFrame, Frame, Response
from nsqworker.nsq.requests import Requests
from nsqworker.nsq.tls import import_snappy, start_tls

__all__ = ["Connection", "ConnectionConfig", "ServerInfo"]

log = logging.getLogger(__name__)

#: ``on_message(timestamp, attempts, id, body)``, called inline for every message.
OnMessage = Callable[[int, int, bytes, bytes], None]
OnError = Callable[["Connection", NSQDError], None]
OnClose = Callable[["Connection", ConnectionClosed], None]

_PUBLISH_PREFIXES = (b"PUB ", b"MPUB", b"DPUB")
_NOP = protocol.nop()
_OK_FRAME = protocol.encode_frame(Response(protocol.OK))
_OK_SIZE = len(_OK_FRAME)


FIN_DELAY = 0.002
"""Seconds the FINs of a small read burst may wait for later bursts' (see
``Connection._flush_fins``): with nsqd writing unbuffered, a read often holds one
message; sharing writes lifted a drain by about a quarter (docs/consumer.md)."""
WRITE_NOW = 4096
"""A command this large (an MPUB) is written at once: it is a write of its own anyway,
and waiting for the loop's next turn to join it with others would only add latency."""
WRITE_EVERY = 64
"""Requests written at once when this many wait: nsqd starts on a burst while it is made."""
FIN_BATCH_SHARE = 4
"""FINs are written at once when they are at least 1/FIN_BATCH_SHARE of RDY."""


def _ignore(*_: Any) -> None:
    pass


class Connection(asyncio.Protocol):
    """One connection to one nsqd.

    ``on_message(timestamp, attempts, id, body)`` runs inline in the read loop for every message;
    ``on_error(conn, error)`` gets the non-fatal ``E_FIN_FAILED``, ``E_REQ_FAILED``
    and ``E_TOUCH_FAILED``; ``on_close(conn, reason)`` runs once when a connection
    that had connected is lost or closed. ``send`` and its helpers raise
    :class:`ConnectionClosed` unless connected. Create it inside the running loop.
    """

    def __init__(
        self,
        address: str,
        config: ConnectionConfig | None = None,
        *,
        on_message: OnMessage | None = None,
        on_error: OnError | None = None,
        on_close: OnClose | None = None,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigurationError(f"nsqd address must be host:port, got {address!r}")
        self.address = address
        self.host = host.strip("[]")
        self.port = int(port)
        self.config = config if config is not None else ConnectionConfig()
        self.server = ServerInfo()
        self.subscribed = False
        self.topic: str | None = None
        self.channel: str | None = None
        self.rdy_count = 0
        self.messages_received = 0
        self.bytes_received = 0
        self.last_message_at = 0.0
        self._on_message: OnMessage = on_message or _ignore
        self._on_error: OnError = on_error or _ignore
        self._on_close: OnClose = on_close or _ignore
        self._loop = asyncio.get_running_loop()
        self._decoder = protocol.Decoder(self.config.max_frame_size)
        self._transport: asyncio.Transport | None = None
        self.requests = Requests(self._loop)
        """The requests waiting for nsqd's answer, and when they time out."""
        self._wbuf: list[bytes] = []
        # FIN ids are joined into the write buffer in one go, at the next flush or
        # before the next other command, so the order on the wire is kept.
        self._fins: list[bytes] = []
        self._flush_scheduled = False
        self._in_read = False
        self._compress: Callable[[bytes], bytes] | None = None
        self._decompress: Callable[[bytes], bytes] | None = None
        self._handshaking = True
        self._waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        self._started = False
        self._established = False
        # True from the end of connect() until the connection is lost: commands may go out.
        self._open = False
        self._closing = False
        self._eof_written = False
        self._lost = False
        self._close_reason: ConnectionClosed | None = None
        self._fatal: NSQDError | None = None
        self._last_read = 0.0
        self._liveness: asyncio.TimerHandle | None = None
        self._closed: asyncio.Future[None] = self._loop.create_future()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "connected" if self.connected else "new"
        return f"<Connection {self.address} {state}>"

    async def connect(self) -> ServerInfo:
        """Dial, then negotiate (magic, IDENTIFY, TLS and compression as agreed, AUTH if
        nsqd requires it); return what nsqd answered.

        Raises :class:`NSQDError` / :class:`AuthError` as nsqd answered, and
        :class:`ConnectionClosed` for network failures and timeouts (the dial, then
        the negotiation, are each bounded by ``dial_timeout``).
        """
        if self._started:
            raise NSQWorkerError(f"connect() was already called on {self!r}")
        self._started = True
        cfg = self.config
        try:
            snappy = import_snappy() if cfg.compression == "snappy" else None
            async with asyncio.timeout(cfg.dial_timeout):
                await self._loop.create_connection(lambda: self, self.host, self.port)
            if self._closing:
                raise ConnectionClosed(f"closed while connecting to nsqd at {self.address}")
            async with asyncio.timeout(cfg.dial_timeout):
                self.server = await self._negotiate(
                    Negotiation(self.address, self.host, cfg, snappy)
                )
        except BaseException as exc:
            error = connect_error(self.address, cfg.dial_timeout, exc)
            if self._transport is not None:
                self._transport.abort()
            reason = error if isinstance(error, ConnectionClosed) else None
            self._finish(
                reason or ConnectionClosed(f"connecting to {self.address} failed: {error!r}")
            )
            if error is exc:
                raise
            raise error from exc
        self.handshake_done()
        return self.server

    def handshake_done(self) -> None:
        """Open for commands and frames: after the handshake (a benchmark: connection_made)."""
        self._handshaking = False
        self._established = self._open = True
        cfg = self.config
        heartbeat = ASSUMED_HEARTBEAT if cfg.heartbeat_interval is None else cfg.heartbeat_interval
        if heartbeat > 0:
            self._liveness = self._loop.call_later(heartbeat, self._check_liveness)
        if len(self._decoder):  # frames that came with the last answer of the handshake
            self._in_read = True
            try:
                self.messages_received += self._decode(b"")
            finally:
                self._in_read = False
            self._flush()

    async def _negotiate(self, negotiation: Negotiation) -> ServerInfo:
        """Carry out ``negotiation``'s steps, feeding it each frame nsqd sends."""
        steps = negotiation.start()
        while True:
            for step in steps:
                if isinstance(step, Send):
                    self._wbuf.append(step.data)
                    self._flush()
                elif isinstance(step, StartTLS):
                    if len(self._decoder):
                        raise ConnectionClosed(f"nsqd at {self.address} sent data before TLS")
                    assert self._transport is not None
                    self._transport = await start_tls(
                        self, self._transport, step.context, step.server_hostname,
                        self.config.dial_timeout, self.address,
                    )  # fmt: skip
                elif isinstance(step, Compress):
                    # What came with the last plain answer is already compressed.
                    leftover = self._decoder.take_buffer()
                    self._compress, self._decompress = step.compress, step.decompress
                    if leftover:
                        self._decoder.receive(step.decompress(leftover))
                else:
                    return step.server
            steps = negotiation.receive(await self._next_frame())

    async def _next_frame(self) -> Frame:
        while True:
            try:
                frame = self._decoder.next_frame()
            except RemoteProtocolError as exc:
                raise ConnectionClosed(f"nsqd at {self.address} sent garbage: {exc}") from exc
            if frame is not None:
                return frame
            if self._lost:
                raise self._closed_error()
            self._waiter = self._loop.create_future()
            await self._waiter

    @property
    def connected(self) -> bool:
        """True between a successful :meth:`connect` and the close (or a fatal error)."""
        return self._open and not self._closing and self._fatal is None

    @property
    def closing(self) -> bool:
        """True once we began to close it (:meth:`close` or :meth:`abort`), not when lost."""
        return self._closing

    @property
    def closed(self) -> bool:
        """True once the connection was lost, or :meth:`close` / :meth:`abort` began."""
        return self._lost or self._closing

    # --- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, hence no isinstance.
        self._transport = cast(asyncio.Transport, transport)
        self._last_read = self._loop.time()

    def data_received(self, data: bytes) -> None:
        now = self._last_read = self._loop.time()
        if self._decompress is not None:
            try:
                data = self._decompress(data)
            except Exception as exc:
                self.fail(f"nsqd at {self.address} sent garbage: cannot decompress ({exc})")
                return
        self.bytes_received += len(data)
        if self._handshaking:
            self._decoder.receive(data)
            self._wake(self._waiter)
            return
        if (
            data.startswith(_OK_FRAME)  # a read of nothing but OKs: a publisher's usual one
            and data.count(_OK_FRAME) * _OK_SIZE == len(data)
            and not len(self._decoder)
            and self.requests.answer_oks(len(data) // _OK_SIZE, protocol.OK)
        ):
            if self._wbuf:
                self._flush()
            elif self._fins:
                self._flush_fins()
            return
        self._in_read = True
        try:
            count = self._decode(data)
        except RemoteProtocolError as exc:
            self.fail(f"nsqd at {self.address} sent garbage: {exc}")
            return
        finally:
            self._in_read = False
        if count:
            self.messages_received += count
            self.last_message_at = now
        if self._wbuf:
            self._flush()
        elif self._fins:
            self._flush_fins()

    def _flush_fins(self) -> None:
        """FINs of a read burst: written now when they are many (or RDY is small), else
        at most FIN_DELAY later, so that bursts of one message each (nsqd writing
        unbuffered) share a write here and a read in nsqd."""
        if len(self._fins) * FIN_BATCH_SHARE >= self.rdy_count or not FIN_DELAY:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_later(FIN_DELAY, self._flush)

    def _decode(self, data: bytes) -> int:
        """Decode and hand on every frame; a failing callback is logged, not fatal."""
        count = 0
        while True:
            try:
                return count + self._decoder.feed_into(data, self._on_message, self._on_frame)
            except RemoteProtocolError:
                raise
            except Exception:
                log.exception("error handling a frame from nsqd at %s", self.address)
                data = b""  # the decoder kept what it did not hand on yet

    def _on_frame(self, frame: Frame) -> None:
        if type(frame) is Response:
            if frame.data == protocol.HEARTBEAT:
                self.send(_NOP)
            elif (request := self.requests.next()) is not None:
                future = request[0]
                if not future.done():  # a cancelled or timed-out request owns its answer
                    future.set_result(frame.data)
            else:
                log.warning("nsqd at %s sent an unexpected %r", self.address, frame.data)
        else:
            assert isinstance(frame, ErrorFrame)
            self._on_error_frame(frame)

    def _on_error_frame(self, frame: ErrorFrame) -> None:
        error = NSQDError.from_frame(frame.data)
        if error.code in NON_FATAL_CODES:
            self._on_error(self, error)
            return
        if (request := self.requests.next()) is not None:
            future, is_publish, _, _ = request
            if is_publish and type(error) is NSQDError:
                error = PublishError(error.code, error.message)
            if not future.done():
                future.set_exception(error)
        else:
            log.warning("nsqd at %s sent fatal %s", self.address, error)
        # nsqd closes the connection after a fatal error; say why when it does.
        if self._fatal is None:
            self._fatal = error

    def connection_lost(self, exc: Exception | None) -> None:
        where, reason = f"nsqd at {self.address}", self._close_reason
        if reason is None and self._fatal is not None:
            reason = ConnectionClosed(f"{where} closed the connection after an error", self._fatal)
        elif reason is None:
            lost = f"connection to {where} lost: {exc}" if exc is not None else None
            reason = ConnectionClosed(lost or f"{where} closed the connection")
        self._finish(reason)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake(self._drain_waiter)

    # --- writes and requests ---------------------------------------------------

    def send(self, command: bytes) -> None:
        """Queue a command that gets no answer (RDY, FIN, REQ, TOUCH, NOP).

        Commands written in one read burst, or in one loop iteration, go out in one
        write.
        """
        if not self._open:
            raise self._closed_error()
        if self._fins:
            self._take_fins()
        self._wbuf.append(command)
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _take_fins(self) -> None:
        fins = self._fins
        self._wbuf.append(b"FIN " + b"\nFIN ".join(fins) + b"\n")
        fins.clear()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._fins:
            self._take_fins()
        buf = self._wbuf
        if self._eof_written:  # answers to messages sent after CLOSE_WAIT: nsqd times them out
            buf.clear()
        if not buf or self._transport is None:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        if self._compress is not None:
            data = self._compress(data)
        self._transport.write(data)

    def rdy(self, count: int) -> None:
        """``RDY count``: let nsqd keep up to ``count`` messages in flight here."""
        self.send(protocol.rdy(count, self.server.max_rdy_count))
        self.rdy_count = count

    def fin(self, message_id: bytes) -> None:
        """``FIN id``."""
        # send() inlined: this runs once per message. Ids come from nsqd, no check.
        if not self._open:
            raise self._closed_error()
        self._fins.append(message_id)
        if not self._in_read and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def req(self, message_id: bytes, delay_ms: int) -> None:
        """``REQ id delay_ms``."""
        self.send(protocol.req(message_id, delay_ms))

    def touch(self, message_id: bytes) -> None:
        """``TOUCH id``."""
        self.send(b"TOUCH " + message_id + b"\n")

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._lost:
            raise self._closed_error()
        if self._write_paused:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)
            if self._lost:
                raise self._closed_error()

    @property
    def write_paused(self) -> bool:
        """True while the transport's buffer is above its high-water mark (drain waits)."""
        return self._write_paused

    async def request(self, command: bytes, timeout: float | None = None) -> bytes:
        """Send a command nsqd answers (PUB, MPUB, DPUB, SUB, CLS) and return the answer.

        Raises :class:`NSQDError` (:class:`PublishError` for a refused publish),
        :class:`ConnectionClosed`, or :class:`TimeoutError` after ``timeout`` seconds.
        """
        return await self.submit(command, timeout)

    def submit(self, command: bytes, timeout: float | None = None) -> asyncio.Future[bytes]:
        """Send a command nsqd answers; return the future of the answer: :meth:`request`
        without the coroutine (the future fails as it would raise). Cancelling it does not
        unsend the command.

        Raises:
            ConnectionClosed: not connected.
        """
        if not self._open or self._fatal is not None:
            raise self._closed_error()
        loop = self._loop
        future: asyncio.Future[bytes] = loop.create_future()
        is_publish = command[:4] in _PUBLISH_PREFIXES
        # send() inlined: this runs once per publish.
        if self._fins:
            self._take_fins()
        self._wbuf.append(command)
        if not self._in_read:
            if len(command) >= WRITE_NOW or len(self._wbuf) >= WRITE_EVERY:
                self._flush()  # with whatever was queued before it, in order
            elif not self._flush_scheduled:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        if timeout is None:
            self.requests.pending.append((future, is_publish, None, 0.0))
            return future
        deadline = loop.time() + timeout
        request = (future, is_publish, timeout, deadline)
        requests = self.requests
        requests.pending.append(request)
        queued = requests.deadlines.queue
        if queued and deadline >= queued[-1][3]:
            queued.append(request)  # Deadlines.add's usual case: its sweep is armed
        else:
            requests.deadlines.add(request)
        return future

    async def subscribe(self, topic: str, channel: str) -> None:
        """``SUB topic channel``; messages flow once RDY is raised."""
        await self.request(protocol.sub(topic, channel))
        self.subscribed = True
        self.topic, self.channel = topic, channel

    # --- liveness and close --------------------------------------------------

    def _check_liveness(self) -> None:
        interval = self.config.heartbeat_interval or ASSUMED_HEARTBEAT
        idle = self._loop.time() - self._last_read
        if idle >= 2 * interval:
            self.fail(f"no data or heartbeat from nsqd at {self.address} for {idle:.1f} s")
        else:
            self._liveness = self._loop.call_later(
                max(interval, 2 * interval - idle), self._check_liveness
            )

    def fail(self, reason: str) -> None:
        """Drop the connection as broken (``reason`` logged): what nsqd's garbage does."""
        log.warning("%s; closing", reason)
        if self._close_reason is None:
            self._close_reason = ConnectionClosed(reason)
        if self._transport is not None:
            self._transport.abort()

    async def close(self, timeout: float = 5.0) -> None:
        """Close cleanly: CLS and wait for CLOSE_WAIT if subscribed, send what is left
        and wait for nsqd to close (else close the socket). Safe to call in any state and
        more than once; bounded by ``timeout``."""
        if self._closing or self._lost:
            await self._wait_closed(timeout)
            return
        self._closing = True
        deadline = self._loop.time() + timeout
        half_close = False
        if self._established and self.subscribed:
            try:
                half_close = await self.request(protocol.cls(), timeout) == protocol.CLOSE_WAIT
            except (NSQWorkerError, TimeoutError) as exc:
                log.debug("CLS to nsqd at %s: %s", self.address, exc)
        if self._close_reason is None:
            self._close_reason = ConnectionClosed(f"connection to nsqd at {self.address} closed")
        if self._transport is not None:
            self._flush()
            if half_close and self._transport.can_write_eof():
                # Answers to messages that came with CLOSE_WAIT reach nsqd after it; our end
                # of the stream follows them, and nsqd closes once it has read them all.
                self._eof_written = True
                self._transport.write_eof()
            elif self._established:
                self._transport.close()
            else:
                self._transport.abort()
        elif not self._started:
            self._finish(self._close_reason)
        await self._wait_closed(max(0.0, deadline - self._loop.time()))

    async def _wait_closed(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self._closed), timeout)
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()

    def abort(self) -> None:
        """Close the socket now, without CLS."""
        self._closing = True
        if self._close_reason is None:
            self._close_reason = ConnectionClosed(f"connection to nsqd at {self.address} aborted")
        if self._transport is not None:
            self._transport.abort()
        elif not self._started:
            self._finish(self._close_reason)

    async def wait_closed(self) -> None:
        """Return once the connection is closed."""
        await asyncio.shield(self._closed)

    def _closed_error(self) -> ConnectionClosed:
        reason = self._close_reason
        if reason is None and self._fatal is not None:
            return ConnectionClosed(f"nsqd at {self.address} closes it after an error", self._fatal)
        if reason is None:
            return ConnectionClosed(f"not connected to nsqd at {self.address}")
        return ConnectionClosed(reason.reason, reason.error)

    def _finish(self, reason: ConnectionClosed) -> None:
        """Everything a lost connection needs, once: fail requests, wake waiters,
        tell the owner."""
        if self._lost:
            return
        self._lost = True
        self._open = False
        if self._close_reason is None:
            self._close_reason = reason
        self._transport = None
        if self._liveness is not None:
            self._liveness.cancel()
        self.requests.fail_all(reason)
        self._wake(self._waiter)
        self._wake(self._drain_waiter)
        if self._established:
            try:
                self._on_close(self, reason)
            except Exception:
                log.exception("on_close callback failed for %s", self.address)
        if not self._closed.done():
            self._closed.set_result(None)

    @staticmethod
    def _wake(waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
