"""The NSQ source's consumer on the driver: messages held in flight until Spark commits.

NSQ has no offsets, so the source's offsets count the messages this consumer received
(``{"session": <this process>, "n": <count>}``). It subscribes to the topic's channel on
each nsqd with ``RDY`` = the messages it may hold, keeps each message it receives,
TOUCHes the held ones every half message timeout, and FINs those below a batch's end
only when Spark commits that batch. A query that stops REQs what it holds; a driver that
dies leaves its messages in flight, and nsqd delivers them again once its message
timeout (``msg_timeout``) passes: at least once, duplicates only from the batch the
crash interrupted.

It connects as the worker does, with the worker's code:
:class:`~nsqworker.nsq.connection.Connection` (TLS, compression, AUTH) on an event loop
in a thread of its own, to the nsqd of
``nsqd_tcp_addresses`` and those nsqlookupd lists for the topic
(:func:`~nsqworker.nsq.transport.find_topic_nsqd`: answers validated and capped,
``lookupd_allowed_nsqd``), the latter with the worker's trust rule (the AUTH secret
only over TLS unless ``lookupd_auth_without_tls``). An nsqd that nsqlookupd listed and
that cannot be read is logged and left out; one of the settings' that cannot be read
fails the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsqworker.errors import ConnectionClosed, NoConnection, NSQWorkerError
from nsqworker.logging import get_logger
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.loop_thread import LoopThread
from nsqworker.nsq.transport import TopicNsqd, find_topic_nsqd

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["HeldConsumer", "HeldMessage"]

log = get_logger("nsqworker.spark.streaming")


@dataclass(frozen=True)
class HeldMessage:
    """A message received and not yet FINed: ``n`` counts from 0 in this process."""

    n: int
    id: str
    body: bytes
    timestamp_ns: int
    attempts: int
    address: str


class HeldConsumer:
    """Subscribes to ``topic``/``channel`` on ``addresses``, holding up to ``hold``
    messages per connection until :meth:`finish` is called for them."""

    def __init__(self, settings: Settings, addresses: list[str] | None, topic: str,
                 channel: str, hold: int) -> None:  # fmt: skip
        self.settings, self.topic, self.channel, self.hold = settings, topic, channel, hold
        self.held: dict[int, HeldMessage] = {}
        self.received = 0
        self.error: Exception | None = None
        self._cond = threading.Condition()
        self._connections: dict[str, Connection] = {}
        self._closed = False
        self._toucher: asyncio.Task[None] | None = None
        self.msg_timeout = 60.0
        """nsqd's message timeout (seconds), from its IDENTIFY answer."""
        self._thread = LoopThread("HeldConsumer", "HeldConsumer", "the NSQ source's consumer",
                                  self.close)  # fmt: skip
        try:
            self._thread.call(self._start(addresses))
        except BaseException:
            self.close()
            raise

    async def _start(self, addresses: list[str] | None) -> None:
        """Connect and subscribe to each nsqd: ``addresses`` (trusted as far as they are
        in ``nsqd_tcp_addresses``), else those the worker would find for the topic."""
        settings = self.settings
        if addresses is None:
            found = await find_topic_nsqd(settings, self.topic)
        else:
            found = [TopicNsqd(a, None, a in settings.nsqd_tcp_addresses) for a in addresses]
        base = ConnectionConfig.from_settings(settings)
        base = dataclasses.replace(base, user_agent="nsqworker-spark")
        problems = []
        for nsqd in found:
            conn = Connection(
                nsqd.address, nsqd.config(base), on_message=self._keeper(nsqd.address),
                on_close=self._lost,
            )  # fmt: skip
            try:
                await conn.connect()
                await conn.subscribe(self.topic, self.channel)
            except (NSQWorkerError, OSError) as exc:
                conn.abort()
                if nsqd.direct:
                    raise NoConnection(f"nsqd at {nsqd.address}: {exc}") from exc
                log.warning("nsqd listed by nsqlookupd not read", nsqd=nsqd.address, error=str(exc))
                problems.append(f"{nsqd.address}: {exc}")
                continue
            self._connections[nsqd.address] = conn
            self.msg_timeout = min(self.msg_timeout, conn.server.msg_timeout)
            conn.rdy(min(self.hold, conn.server.max_rdy_count))
        if not self._connections:
            shown = f" ({'; '.join(problems)})" if problems else ""
            raise NoConnection(
                f"no nsqd to read topic {self.topic!r} from{shown}: set nsqd_tcp_addresses, "
                "or lookupd_http_addresses where the topic is registered"
            )
        self._toucher = asyncio.create_task(self._touch_loop())

    def _keeper(self, address: str) -> Callable[[int, int, bytes, bytes], None]:
        def keep(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
            with self._cond:
                n = self.received
                self.received += 1
                self.held[n] = HeldMessage(n, message_id.decode(), body, timestamp, attempts,
                                           address)  # fmt: skip
                self._cond.notify_all()

        return keep

    def _lost(self, conn: Connection, reason: ConnectionClosed) -> None:
        """A connection ended: the source reports it at the next ``latestOffset``."""
        if not self._closed and self._connections.get(conn.address) is conn:
            with self._cond:  # (one left out at start is no loss)
                self.error = reason

    def messages(self, start: int, end: int) -> list[HeldMessage]:
        """The held messages numbered ``[start, end)``."""
        with self._cond:
            return [self.held[n] for n in range(start, end) if n in self.held]

    def finish(self, end: int) -> int:
        """FIN every held message numbered below ``end``; how many."""
        with self._cond:
            done = [m for n, m in self.held.items() if n < end]
            for m in done:
                del self.held[m.n]
        if done:
            self._thread.loop.call_soon_threadsafe(self._send, "fin", done)
        return len(done)

    def _send(self, command: str, messages: list[HeldMessage]) -> None:
        """``conn.fin`` / ``touch`` / ``req`` (REQ 0) each message on its connection."""
        for m in messages:
            conn = self._connections.get(m.address)
            if conn is None or not conn.connected:
                continue  # lost: the source reports it; nsqd delivers them again
            if command == "req":
                conn.req(m.id.encode(), 0)
            else:
                getattr(conn, command)(m.id.encode())

    async def _touch_loop(self) -> None:
        every = max(self.msg_timeout / 2, 0.5)
        while True:
            await asyncio.sleep(every)
            with self._cond:
                held = list(self.held.values())
            self._send("touch", held)

    def close(self) -> None:
        """REQ every message still held (nsqd delivers them again at once), then close
        the connections. A driver that dies instead leaves them to nsqd's message
        timeout."""
        self._thread.close(self._close(), timeout=5.0)

    async def _close(self) -> None:
        for conn in self._connections.values():  # no more, then what was already on the wire
            if conn.connected:
                conn.rdy(0)
        deadline, last = asyncio.get_running_loop().time() + 1.0, -1
        while asyncio.get_running_loop().time() < deadline and last != self.received:
            last = self.received
            await asyncio.sleep(0.1)
        with self._cond:
            held, self.held = list(self.held.values()), {}
        self._send("req", held)
        self._closed = True
        if self._toucher is not None:
            self._toucher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._toucher
        await asyncio.gather(*(c.close() for c in self._connections.values()),
                             return_exceptions=True)  # fmt: skip
