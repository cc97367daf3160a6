"""Publish to nsqd: PUB, MPUB and DPUB, each acknowledged, with failover.

:class:`Producer` keeps one connection per nsqd address. Publishes are pipelined: any
number of concurrent calls share a connection, and the connection matches nsqd's
answers to them in order, so no lock is held across a round trip. Each call goes to
the next healthy connection in turn (round-robin); dead ones are redialled in the
background with exponential backoff and jitter.

Delivery is at least once. A publish whose connection dies before nsqd answered is
sent once more, on another nsqd when one is up; nsqd may have stored the first copy,
so a consumer can see the message twice. An error nsqd gives about the message itself
(``E_BAD_MESSAGE``, ``E_BAD_TOPIC``...) would be the same everywhere: it is raised as
:class:`~nsqworker.errors.PublishError` and not retried. nsqd closes the connection
after such an error; the producer redials it, so the next publish works.

nsqd's size limits are not told in IDENTIFY: given, or learned from a first "too big"
answer, they make an oversized body raise ``MessageTooLarge`` before anything is sent.
Publish calls go through the telemetry seam of :mod:`nsqworker.producing`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self, cast

from nsqworker.errors import (
    ConfigurationError,
    ConnectionClosed,
    LocalProtocolError,
    NoConnection,
    NSQDError,
    PublishError,
    RemoteProtocolError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.backoff import reconnect_delay
from nsqworker.nsq.capabilities import CAPABILITIES
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.handshake import connect_adapting
from nsqworker.nsq.publishing import (
    NO_HOOK,
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
from nsqworker.producing import instrumentation_for

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["Body", "Instrumentation", "Producer", "PublishCall"]

log = logging.getLogger(__name__)

RECONNECT_DELAY: Final = 0.1
MAX_RECONNECT_DELAY: Final = 30.0
_STABLE_AFTER: Final = 1.0  # a connection that lived this long resets the backoff
_JUST_BYTES: Final = {bytes}


# --- the async producer -------------------------------------------------------------


class _Node:
    """One nsqd address: its live connection (if any) and the task that keeps it up."""

    __slots__ = ("address", "conn", "last_error", "task")

    def __init__(self, address: str) -> None:
        self.address = address
        self.conn: Connection | None = None
        self.last_error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> bool:
        # A connection is only ever connected while not closed.
        return self.conn is not None and self.conn.connected


class Producer:
    """Publishes to one or more nsqd over TCP; every call returns once nsqd said OK.

    ``async with Producer(["127.0.0.1:4150"]) as p: await p.publish("clicks", b"...")``.
    Addresses default to ``settings.nsqd_tcp_addresses``. ``timeout`` (seconds) bounds
    each call, including waiting for a connection and one retry. Calls may also be
    made without ``connect()``: the first one starts the connections.

    Publishing is at least once: a message whose connection died before nsqd's answer
    is sent once more (on another nsqd when there is one) and may arrive twice. A
    publish that fails never breaks the producer for the next one.
    """

    def __new__(cls, nsqd_tcp_addresses: list[str] | str | None = None, **options: Any) -> Any:
        """No nsqd address and settings of another transport: its producer (NatsProducer)."""
        if cls is Producer and nsqd_tcp_addresses is None:
            from nsqworker.settings import Settings as _Settings
            from nsqworker.transport import other_producer

            settings = options.get("settings") or _Settings()
            if (other := other_producer(settings, options.get("timeout", 5.0))) is not None:
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
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        if nsqd_tcp_addresses is None and settings is None:
            from nsqworker.settings import Settings as _Settings

            settings = _Settings()  # from the environment and .env
        self.addresses = nsqd_addresses(nsqd_tcp_addresses, settings)
        if connection_config is None:
            connection_config = (
                ConnectionConfig() if settings is None else ConnectionConfig.from_settings(settings)
            )
        self._config = connection_config
        self.timeout = timeout
        self.max_message_size = max_message_size
        """nsqd's ``--max-msg-size`` when known (given or learned), else None."""
        self.max_body_size = max_body_size
        """nsqd's ``--max-body-size`` when known (given or learned), else None."""
        self._reconnect_base = float(getattr(settings, "reconnect_delay", RECONNECT_DELAY))
        self._reconnect_cap = float(getattr(settings, "max_reconnect_delay", MAX_RECONNECT_DELAY))
        if envelope is None:
            envelope = bool(getattr(settings, "tracing_envelope", False))
        self.envelope = envelope
        self._hook: Instrumentation | None = None
        self._quiet: Callable[[], bool] | None = None
        self._count: Callable[[str, int, int, BaseException | None], None] | None = None
        self._instrument = instrumentation_for(CAPABILITIES, envelope)
        self._nodes = [_Node(a) for a in self.addresses]
        self._next = 0
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop  # set by start(), before any publish
        self._changed: asyncio.Event | None = None
        self._inflight = 0
        # Created by close() when calls are in flight; the last one to end resolves it.
        self._idle: asyncio.Future[None] | None = None
        self._pub_lines: dict[str, bytes] = {}

    @property
    def _instrument(self) -> Instrumentation | None:
        """The telemetry hook (see the module docstring); None when there is none."""
        return self._hook

    @_instrument.setter
    def _instrument(self, hook: Instrumentation | None) -> None:
        quiet, count = getattr(hook, "quiet", None), getattr(hook, "count", None)
        both = callable(quiet) and callable(count)
        self._hook = hook
        self._quiet = quiet if both else None
        self._count = count if both else None

    def __repr__(self) -> str:
        up = sum(n.healthy for n in self._nodes)
        return f"<Producer {','.join(self.addresses)} connected={up}/{len(self._nodes)}>"

    async def __aenter__(self) -> Self:
        try:
            await self.connect()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connected(self) -> list[str]:
        """Addresses of the nsqd with a live connection right now."""
        return [n.address for n in self._nodes if n.healthy]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Begin connecting, a keeper task per address (the first publish calls it)."""
        if self._closed:
            raise ConnectionClosed("the producer is closed")
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        for node in self._nodes:
            node.task = asyncio.create_task(self._keep(node), name=f"nsq-producer {node.address}")

    async def connect(self, timeout: float | None = None) -> None:
        """Start connecting to every nsqd; return once one is connected.

        Raises:
            NoConnection: none connected within ``timeout`` (default: the producer's);
                the producer keeps redialling in the background until closed.
        """
        self.start()
        timeout = timeout or self.timeout
        await self._pick(asyncio.get_running_loop().time() + timeout, None, timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` for publishes in flight, then close every connection."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        if self._inflight:
            self._idle = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._idle, timeout)
            except TimeoutError:
                pass
        tasks = [n.task for n in self._nodes if n.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        conns = [n.conn for n in self._nodes if n.conn is not None]
        await asyncio.gather(*(c.close(timeout) for c in conns), return_exceptions=True)
        self._notify()

    def _notify(self) -> None:
        """Wake every call waiting for a connection to come up."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    async def _keep(self, node: _Node) -> None:
        """Keep ``node`` connected: dial, wait for the close, redial with backoff."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while not self._closed:
            if attempt:
                await asyncio.sleep(
                    reconnect_delay(attempt, self._reconnect_base, self._reconnect_cap)
                )
            conn = await self._dial(node, attempt)
            if conn is None:
                attempt += 1
                continue
            node.conn = conn
            self._notify()
            since = loop.time()
            await conn.wait_closed()
            if node.conn is conn:
                node.conn = None
            if not self._closed:
                log.warning(
                    "producer lost nsqd at %s (%s); redialling", node.address, node.last_error
                )
            attempt = 0 if loop.time() - since >= _STABLE_AFTER else attempt + 1

    async def _dial(self, node: _Node, attempt: int) -> Connection | None:
        """A connected Connection to ``node``, or None (the error kept in ``last_error``)."""
        conn: Connection | None = None
        try:
            on_close = self._on_close(node)
            conn = await connect_adapting(
                node.address, self._config, lambda c: Connection(node.address, c, on_close=on_close)
            )
        except BaseException as exc:
            if conn is not None:
                conn.abort()
            if not isinstance(exc, Exception):
                raise
            node.last_error = exc
            log.log(
                logging.WARNING if attempt == 0 else logging.DEBUG,
                "producer cannot reach nsqd at %s (attempt %d): %s",
                node.address,
                attempt + 1,
                exc,
            )
            return None
        if attempt:
            log.info("producer reconnected to nsqd at %s", node.address)
        return conn

    def _on_close(self, node: _Node) -> Callable[[Connection, ConnectionClosed], None]:
        def on_close(conn: Connection, exc: ConnectionClosed) -> None:
            if node.conn is conn:
                node.conn = None
                node.last_error = exc

        return on_close

    def _choose(self, avoid: _Node | None) -> _Node | None:
        """The next node with a live connection (round-robin), preferring one not
        ``avoid``; None while none is up."""
        nodes = self._nodes
        if len(nodes) == 1:
            conn = nodes[0].conn  # healthy, inlined: this runs once per publish
            return nodes[0] if conn is not None and conn.connected else None
        healthy = [n for n in nodes if n.healthy]
        if not healthy:
            return None
        choices = [n for n in healthy if n is not avoid] or healthy
        self._next += 1
        return choices[self._next % len(choices)]

    async def _pick(self, deadline: float, avoid: _Node | None, timeout: float) -> _Node:
        """:meth:`_choose`, waiting up to ``deadline`` for a connection to come up."""
        loop = asyncio.get_running_loop()
        while True:
            node = self._choose(avoid)
            if node is not None:
                return node
            remaining = deadline - loop.time()
            changed = self._changed
            if self._closed or remaining <= 0 or changed is None:
                raise self._no_connection(timeout)
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                raise self._no_connection(timeout) from None

    def _no_connection(self, timeout: float) -> NoConnection:
        if self._closed:
            return NoConnection("the producer is closed")
        tried = "; ".join(
            f"{n.address}: {n.last_error or 'not connected yet'}" for n in self._nodes
        )
        return NoConnection(f"no nsqd reachable within {timeout:g} s (tried {tried})")

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
        # producer, no PublishCall is built without a hook, and the first attempt is
        # awaited here rather than in _request (one coroutine less per message).
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
        self._inflight += 1
        call = None
        scope = NO_HOOK
        count = None
        hook = self._hook
        if hook is not None:
            if self._quiet is not None and self._quiet():
                count = self._count
            else:
                call = PublishCall(topic, [body], "PUB", None, self.envelope)
                scope = hook(call)
        try:
            with scope:
                if call is not None:
                    body = call.bodies[0]  # the hook may have wrapped it
                command = self._pub(line, topic, body)
                node = self._choose(None)
                if node is None or (conn := node.conn) is None or conn.write_paused:
                    address = await self._request(command, "PUB", timeout)
                else:
                    deadline = self._loop.time() + timeout
                    answer: bytes | None
                    try:
                        answer = await conn.submit(command, timeout)
                    except Exception as exc:
                        self._check_retry(exc, node, "PUB", last=False)
                        answer = None
                    if answer is None:  # retried after the except block: not chained to it
                        address = await self._request(command, "PUB", timeout, deadline, node)
                    else:
                        address = self._acknowledged(node, "PUB", answer)
                if call is not None:
                    call.nsqd_address, call.published = address, 1
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

    def _pub(self, line: bytes, topic: str, body: bytes) -> bytes:
        """The PUB command of ``body`` (``line`` is ``topic``'s), checked like protocol.pub."""
        limit = self.max_message_size
        if type(body) is bytes and body and (limit is None or len(body) <= limit):
            return line + SIZE.pack(len(body)) + body
        return protocol.pub(topic, body, limit)  # raises what is wrong with the body

    async def publish_json(
        self, topic: str, obj: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish ``obj`` serialised as compact UTF-8 JSON; see :meth:`publish`."""
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        await self.publish(topic, body, delay=delay, timeout=timeout)

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
        self._inflight += 1
        try:
            if self._instrument is None:
                await self._send(call, timeout or self.timeout)
            else:
                with self._instrument(call):
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
        failed: _Node | None = None,
    ) -> str:
        """Send one command until nsqd says OK; retried once if the connection died.

        ``deadline`` (loop time) bounds the whole call; by default ``timeout`` from now.
        ``failed``: the caller's first attempt failed there (and may be retried), so
        this is the last attempt, on another nsqd when one is up. Returns the address
        of the nsqd that acknowledged the command.
        """
        loop = self._loop
        if deadline is None:
            deadline = loop.time() + timeout
        avoid = failed
        while True:
            node = self._choose(avoid) or await self._pick(deadline, avoid, timeout)
            conn = node.conn
            assert conn is not None  # chosen connected, nothing awaited since
            try:
                if conn.write_paused:
                    await conn.drain()
                answer = await conn.submit(command, max(deadline - loop.time(), 0.001))
            except Exception as exc:
                self._check_retry(exc, node, operation, last=avoid is not None)
                avoid = node
                continue
            return self._acknowledged(node, operation, answer)

    def _check_retry(self, exc: Exception, node: _Node, operation: str, last: bool) -> None:
        """Raise what the failure ``exc`` of an attempt on ``node`` means, unless the
        command may be sent once more: not ``last``, and the connection died or nsqd
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
    def _acknowledged(node: _Node, operation: str, answer: bytes) -> str:
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
