"""Publish to nsqd: PUB, MPUB and DPUB, each acknowledged, with failover.

:class:`Producer` keeps one connection per nsqd address. Publishes are pipelined: any
number of concurrent calls share a connection, and the connection matches nsqd's
answers to them in order, so no lock is held across a round trip. ``publish()`` calls
made while others are in flight are sent together at the end of the loop turn, as one
MPUB per topic, each call keeping its own outcome (:mod:`nsqworker.nsq.coalescing`).
Each command goes to the next healthy connection in turn (round-robin); dead ones are
redialled in the background with exponential backoff and jitter.

Delivery is at least once. A publish whose connection dies before nsqd answered is
sent again, on another nsqd when one is up; nsqd may have stored the earlier copy, so a
consumer can see the message twice. The second attempt is pipelined like the first (a
lost nsqd's publishes move to another at full speed); a third, after a second lost
connection, goes alone, waiting for its answer before the next third attempt is sent.
That is for a message that makes nsqd close the connection: nsqd resets a connection it
closes with commands unread, and a write that meets the reset ends our side before the
error frame is read, so its error can be lost with the connection, twice. Sent alone,
it fails alone, instead of taking the publishes pipelined behind it down each time.
An error nsqd gives about the message itself
(``E_BAD_MESSAGE``, ``E_BAD_TOPIC``...) would be the same everywhere: it is raised as
:class:`~nsqworker.errors.PublishError` and not retried. nsqd closes the connection
after such an error; the producer redials it, so the next publish works.

nsqd's size limits are not told in IDENTIFY: given, or learned from a first "too big"
answer, they make an oversized body raise ``MessageTooLarge`` before anything is sent.
Publish calls go through the telemetry seam of :mod:`nsqworker.producing`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from nsqworker.errors import (
    ConnectionClosed,
    LocalProtocolError,
    NSQDError,
    PublishError,
    RemoteProtocolError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.capabilities import CAPABILITIES
from nsqworker.nsq.coalescing import Coalescer, Resend
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.pool import Node, NodePool
from nsqworker.nsq.publishing import (
    RETRYABLE,
    SIZE,
    TOPIC_CACHE_SIZE,
    Body,
    Instrumentation,
    PublishCall,
    delay_to_ms,
    nsqd_addresses,
    parse_size_limit,
    split_batches,
    to_bytes,
)
from nsqworker.producing import ProducerBase

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings
    from nsqworker.transport import Capabilities

__all__ = ["Body", "Instrumentation", "Producer", "PublishCall"]

log = logging.getLogger(__name__)

PIPELINED_ATTEMPTS: Final = 2
"""Attempts of a publish sent with others in flight; one more goes alone."""
RECONNECT_DELAY: Final = 0.1
MAX_RECONNECT_DELAY: Final = 30.0
_JUST_BYTES: Final = {bytes}


class Producer(ProducerBase):
    """Publishes to one or more nsqd over TCP; every call returns once nsqd said OK.

    ``async with Producer(["127.0.0.1:4150"]) as p: await p.publish("clicks", b"...")``.
    Addresses default to ``settings.nsqd_tcp_addresses``. ``timeout`` (seconds) bounds
    each call, including waiting for a connection and its retries. Calls may also be
    made without ``connect()``: the first one starts the connections.

    Publishing is at least once: a message whose connection died before nsqd's answer
    is sent again, up to twice (on another nsqd when there is one), and may arrive more
    than once. A publish that fails never breaks the producer for the next one.
    """

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __new__(cls, nsqd_tcp_addresses: list[str] | str | None = None, **options: Any) -> Any:
        """Deprecated: settings of another transport give that transport's producer;
        :func:`nsqworker.producer_for` is the way to ask for it."""
        if cls is Producer and nsqd_tcp_addresses is None:
            from nsqworker.producing import deprecated_other_producer

            other = deprecated_other_producer(options.get("settings"), options.get("timeout", 5.0))
            if other is not None:
                return other
        return super().__new__(cls)

    def __init__(
        self,
        nsqd_tcp_addresses: list[str] | str | None = None,
        *,
        settings: Settings | None = None,
        connection_config: ConnectionConfig | None = None,
        timeout: float = 5.0,
        envelope: bool | None = None,
        max_message_size: int | None = None,
        max_body_size: int | None = None,
    ) -> None:
        if nsqd_tcp_addresses is None and settings is None:
            from nsqworker.settings.nsq import NsqSettings as _Settings

            settings = _Settings()  # from the environment and .env
        self.addresses = nsqd_addresses(nsqd_tcp_addresses, settings)
        if connection_config is None:
            connection_config = (
                ConnectionConfig() if settings is None else ConnectionConfig.from_settings(settings)
            )
        self.max_message_size = max_message_size
        """nsqd's ``--max-msg-size`` when known (given or learned), else None."""
        self.max_body_size = max_body_size
        """nsqd's ``--max-body-size`` when known (given or learned), else None."""
        self._pool = NodePool(
            self.addresses,
            connection_config,
            float(getattr(settings, "reconnect_delay", RECONNECT_DELAY)),
            float(getattr(settings, "max_reconnect_delay", MAX_RECONNECT_DELAY)),
        )
        if envelope is None:
            envelope = bool(getattr(settings, "tracing_envelope", False))
        self.envelope = envelope
        self._hook: Instrumentation | None = None
        self._quiet: Callable[[], bool] | None = None
        self._count: Callable[[str, int, int, BaseException | None], None] | None = None
        super().__init__(timeout, envelope=envelope)  # the telemetry hook
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop  # set by start(), before any publish
        self._batches: Coalescer  # likewise
        self._inflight = 0
        # Created by close() when calls are in flight; the last one to end resolves it.
        self._idle: asyncio.Future[None] | None = None
        self._pub_lines: dict[str, bytes] = {}
        self._last_attempts = asyncio.Lock()  # see the module's docstring

    @property  # type: ignore[override]
    def instrumentation(self) -> Instrumentation | None:
        """The telemetry hook (see :mod:`nsqworker.producing`); None for none."""
        return self._hook

    @instrumentation.setter
    def instrumentation(self, hook: Instrumentation | None) -> None:
        quiet, count = getattr(hook, "quiet", None), getattr(hook, "count", None)
        both = callable(quiet) and callable(count)
        self._hook = hook
        self._quiet = quiet if both else None
        self._count = count if both else None

    def __repr__(self) -> str:
        up = len(self._pool.connected)
        return f"<Producer {','.join(self.addresses)} connected={up}/{len(self.addresses)}>"

    @property
    def connected(self) -> list[str]:
        """Addresses of the nsqd with a live connection right now."""
        return self._pool.connected

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Begin connecting, a keeper task per address (the first publish calls it)."""
        if self._closed:
            raise ConnectionClosed("the producer is closed")
        if self._started:
            return
        self._started = True
        self._loop = loop = asyncio.get_running_loop()
        self._batches = Coalescer(
            loop,
            self._pool.choose,
            self._check_retry,
            lambda: self.max_body_size or protocol.DEFAULT_MAX_BODY_SIZE,
        )
        self._pool.start()

    async def connect(self, timeout: float | None = None) -> None:
        """Start connecting to every nsqd; return once one is connected.

        Raises:
            NoConnection: none connected within ``timeout`` (default: the producer's);
                the producer keeps redialling in the background until closed.
        """
        self.start()
        timeout = timeout or self.timeout
        await self._pool.pick(asyncio.get_running_loop().time() + timeout, None, timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for publishes in flight, then close every connection."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        self._pool.begin_close()
        self._batches.send_all()
        if self._inflight:
            self._idle = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._idle, timeout)
            except TimeoutError:
                pass
        await self._pool.close(timeout)

    # -- publishing --------------------------------------------------------------------

    async def publish(
        self, topic: str, body: Body, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message (PUB), or hold it back ``delay`` seconds first (DPUB).

        Raises:
            TypeError: ``body`` is neither bytes nor str.
            InvalidName, MessageTooLarge, LocalProtocolError: refused before sending.
            PublishError: nsqd refused it (``.code`` says why).
            NoConnection: no nsqd reachable within the timeout.
            TimeoutError: no answer within the timeout (it may still have been stored).
        """
        # The producer's hot path, hence its shape: the topic is checked once per
        # producer, the first attempt is awaited here rather than in _request (one
        # coroutine less per message), and without a span to record (no SDK) nothing
        # but the hook's count is called (no context manager, no PublishCall). A call
        # made while others are in flight joins the turn's batch (nsqworker.nsq.coalescing).
        line = self._pub_lines.get(topic) if type(topic) is str else None
        if line is None:
            line = self._check_topic(topic)
        if delay is not None:
            delay_ms = delay_to_ms(delay)
            await self._run(
                PublishCall(topic, [to_bytes(body)], "DPUB", delay_ms, self.envelope), timeout
            )
            return
        if type(body) is not bytes:
            body = to_bytes(body)
        if not self._started or self._closed:
            self.start()
        timeout = timeout or self.timeout
        hook = self._hook
        quiet = self._quiet
        if hook is not None and (quiet is None or not quiet()):
            await self._run(PublishCall(topic, [body], "PUB", None, self.envelope), timeout)
            return
        count = self._count
        self._inflight += 1
        try:
            limit = self.max_message_size
            if not body or (limit is not None and len(body) > limit):
                protocol.pub(topic, body, limit)  # raises what is wrong
            node = self._pool.choose(None)
            if node is None or (conn := node.conn) is None or conn.write_paused:
                await self._request(line + SIZE.pack(len(body)) + body, "PUB", timeout)
            elif self._inflight > 1:
                again: Resend | None = None
                try:
                    await self._batches.add(topic, line, body, timeout)
                except Resend as resend:
                    again = resend
                if again is not None:  # sent alone after the except block: not chained to it
                    command = line + SIZE.pack(len(body)) + body
                    await self._request(command, "PUB", timeout, again.deadline, again.avoid)
            else:
                command = line + SIZE.pack(len(body)) + body
                deadline = self._loop.time() + timeout
                answer: bytes | None
                try:
                    answer = await conn.submit(command, timeout)
                except Exception as exc:
                    self._check_retry(exc, node, "PUB", last=False)
                    answer = None
                if answer is None:  # retried after the except block: not chained to it
                    await self._request(command, "PUB", timeout, deadline, node)
                elif answer != protocol.OK:
                    self._acknowledged(node, "PUB", answer)  # raises
        except BaseException as exc:
            if count is not None:
                count(topic, 0, 1, exc)
            raise
        else:
            if count is not None:
                count(topic, 1, 0, None)
        finally:
            self._inflight -= 1
            if self._idle is not None and not self._inflight:
                self._wake_close()

    def _check_topic(self, topic: str) -> bytes:
        """Validate ``topic`` (raising InvalidName) and remember its PUB line."""
        protocol.check_topic(topic)
        lines = self._pub_lines
        if len(lines) >= TOPIC_CACHE_SIZE:
            lines.clear()
        line = lines[topic] = b"PUB " + topic.encode() + b"\n"
        return line

    async def publish_many(
        self, topic: str, bodies: Iterable[Body], timeout: float | None = None
    ) -> None:
        """Publish several messages with MPUB; one MPUB is atomic on its nsqd.

        A batch larger than nsqd's ``--max-body-size`` (5 MiB unless known otherwise)
        is split into several MPUBs sent in order, possibly to different nsqd. **A
        split batch is not atomic**: if a later part fails, earlier parts stay
        published (the error's notes say how many). ``timeout`` bounds each MPUB.
        """
        if type(topic) is not str or topic not in self._pub_lines:
            self._check_topic(topic)
        given = list(bodies)
        if {*map(type, given)} == _JUST_BYTES:
            items = cast("list[bytes]", given)
        else:
            items = [to_bytes(b) for b in given]
        if not items:
            raise LocalProtocolError("publish_many needs at least one message")
        await self._run(PublishCall(topic, items, "MPUB", None, self.envelope), timeout)

    async def _run(self, call: PublishCall, timeout: float | None) -> None:
        """Send ``call`` inside the telemetry hook (if any), counting it as in flight."""
        if not self._started or self._closed:
            self.start()
        self._batches.send_topic(call.topic)  # order: what was published before goes first
        self._inflight += 1
        try:
            hook = self._hook
            if hook is None:
                await self._send(call, timeout or self.timeout)
            else:
                with hook(call):
                    await self._send(call, timeout or self.timeout)
        finally:
            self._inflight -= 1
            if self._idle is not None and not self._inflight:
                self._wake_close()

    def _wake_close(self) -> None:
        """Tell close() that nothing is in flight any more."""
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def _send(self, call: PublishCall, timeout: float) -> None:
        """Encode every command first (so local errors send nothing), then send them."""
        topic, max_size = call.topic, self.max_message_size
        if call.operation == "PUB":
            commands = [(protocol.pub(topic, call.bodies[0], max_size), 1)]
        elif call.operation == "DPUB":
            assert call.delay_ms is not None
            commands = [(protocol.dpub(topic, call.delay_ms, call.bodies[0], max_size), 1)]
        else:
            limit = self.max_body_size or protocol.DEFAULT_MAX_BODY_SIZE
            bodies = call.bodies
            line = b"M" + (self._pub_lines.get(topic) or self._check_topic(topic))
            if 4 + 4 * len(bodies) + sum(map(len, bodies)) <= limit:  # the usual case
                batches = [bodies]
            else:
                batches = split_batches(bodies, limit)
            commands = [
                (protocol.mpub_line(line, batch, max_size, self.max_body_size), len(batch))
                for batch in batches
            ]
        for command, count in commands:
            try:
                call.nsqd_address = await self._request(command, call.operation, timeout)
            except Exception as exc:
                if call.published:
                    exc.add_note(
                        f"{call.published} of {len(call.bodies)} messages were published "
                        "by earlier MPUBs of this split batch"
                    )
                raise
            call.published += count

    async def _request(
        self,
        command: bytes,
        operation: str,
        timeout: float,
        deadline: float | None = None,
        failed: Node | None = None,
    ) -> str:
        """Send one command until nsqd says OK; retried once if the connection died.

        ``deadline`` (loop time) bounds the whole call; by default ``timeout`` from now.
        ``failed``: the caller's first attempt failed there (and may be retried); the
        next goes to another nsqd when one is up. Returns the address of the nsqd that
        acknowledged the command.
        """
        loop = self._loop
        if deadline is None:
            deadline = loop.time() + timeout
        avoid = failed
        for _ in range(int(failed is not None), PIPELINED_ATTEMPTS):
            node = self._pool.choose(avoid) or await self._pool.pick(deadline, avoid, timeout)
            try:
                return await self._attempt(node, command, operation, deadline)
            except Exception as exc:
                self._check_retry(exc, node, operation, last=False)
            avoid = node
        assert avoid is not None
        # The last attempt: one at a time (the module's docstring says why). The wait for
        # the lock is bounded by the others' deadlines (about the same as this one).
        await self._last_attempts.acquire()
        try:
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"{operation} was not retried within {timeout:g} s after its connection "
                    f"to nsqd {avoid.address} was lost; it may or may not have been stored"
                )
            node = self._pool.choose(avoid) or await self._pool.pick(deadline, avoid, timeout)
            try:
                return await self._attempt(node, command, operation, deadline)
            except Exception as exc:
                self._check_retry(exc, node, operation, last=True)
                raise  # _check_retry raises when last; this line is for the type checker
        finally:
            self._last_attempts.release()

    async def _attempt(self, node: Node, command: bytes, operation: str, deadline: float) -> str:
        """Send ``command`` on ``node``'s connection; the address once nsqd said OK."""
        conn = node.conn
        assert conn is not None  # chosen connected, nothing awaited since
        if conn.write_paused:
            await conn.drain()
        answer = await conn.submit(command, max(deadline - self._loop.time(), 0.001))
        return self._acknowledged(node, operation, answer)

    def _check_retry(self, exc: Exception, node: Node, operation: str, last: bool) -> None:
        """Raise what the failure ``exc`` of an attempt on ``node`` means, unless the
        command may be sent again: not ``last``, and the connection died or nsqd
        failed to store it."""
        if isinstance(exc, NSQDError):
            if exc.code in RETRYABLE and not last:
                return
            raise self._publish_error(exc) from exc
        if isinstance(exc, TimeoutError):
            raise TimeoutError(
                f"nsqd {node.address} did not acknowledge {operation} in time; "
                "the message may or may not have been stored"
            ) from None
        if isinstance(exc, ConnectionClosed | OSError):
            node.last_error = exc
            if not last:
                return
        raise exc

    @staticmethod
    def _acknowledged(node: Node, operation: str, answer: bytes) -> str:
        """``node``'s address if ``answer`` is nsqd's OK."""
        if answer != protocol.OK:
            raise RemoteProtocolError(f"nsqd {node.address} answered {operation} with {answer!r}")
        return node.address

    def _publish_error(self, exc: NSQDError) -> PublishError:
        """nsqd's refusal as PublishError; learn its size limit from "too big"."""
        message = exc.message
        learned = parse_size_limit(message)
        if learned is not None:
            kind, limit = learned
            if kind == "message":
                self.max_message_size = min(limit, self.max_message_size or limit)
                flag = "--max-msg-size"
            else:
                self.max_body_size = min(limit, self.max_body_size or limit)
                flag = "--max-body-size"
            message += (
                f" (nsqd {flag} is {limit} bytes; larger ones now raise MessageTooLarge "
                "before sending)"
            )
        return PublishError(exc.code, message)
