"""The connections of one subscription: one link per nsqd address, one session per
connection, kept up with reconnect backoff and discovered through nsqlookupd.

With adaptive output buffering (``output_buffer_size`` unset) a link reads its nsqd on
an unbuffered connection and, under load, on a second, buffered one (the bulk lane,
see :mod:`nsqworker.nsq.lanes`); one of the two holds the link's RDY at a time.

:class:`Subscriptions` is the base of :class:`~nsqworker.nsq.consumer.Consumer`: it
opens, subscribes, retires and forgets connections; the consumer decides RDY and runs
messages. The attributes it declares are the consumer's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError, ConnectionClosed, NSQDError
from nsqworker.nsq.backoff import reconnect_delay
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.handshake import connect_adapting
from nsqworker.nsq.lanes import NEVER, LaneMeter
from nsqworker.nsq.lookupd import LookupdPoller
from nsqworker.nsq.rdy import Slot

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["REASONS", "ConnectionStats", "ConsumerStats", "Subscriptions", "error_reason"]

log = logging.getLogger("nsqworker.nsq.consumer")

BULK_RETRY = 30.0
"""Seconds before a bulk lane that failed to open is tried again."""


@dataclass
class ConnectionStats:
    """Counters of one nsqd address, over all its reconnects."""

    address: str
    connected: bool
    rdy: int
    in_flight: int
    received: int
    finished: int
    requeued: int
    given_up: int
    connects: int
    lane: str = "single"
    """Where this nsqd's RDY is: "single" (one connection, output_buffer_size set),
    "fast" (unbuffered) or "bulk" (the buffered connection opened under load)."""


@dataclass
class ConsumerStats:
    """A snapshot of one consumer."""

    topic: str
    channel: str
    max_in_flight: int
    in_flight: int
    running: int
    received: int
    finished: int
    requeued: int
    given_up: int
    backoff_level: int
    backoff_phase: str
    rdy: int
    connected: int
    connections: list[ConnectionStats] = field(default_factory=list)


class _Link:
    """One nsqd address the consumer wants: counters and the live session, if any."""

    __slots__ = (
        "address",
        "bulk",
        "bulk_retry_at",
        "bulk_task",
        "connects",
        "direct",
        "finished",
        "given_up",
        "listed",
        "meter",
        "received",
        "requeued",
        "session",
        "task",
    )

    def __init__(self, address: str, direct: bool) -> None:
        self.address = address
        self.direct = direct
        self.listed = False
        self.session: _Session | None = None
        self.task: asyncio.Task[None] | None = None
        # The buffered lane, when open (adaptive buffering only), and its meter.
        self.bulk: _Session | None = None
        self.bulk_task: asyncio.Task[None] | None = None
        self.bulk_retry_at = 0.0
        self.meter: LaneMeter | None = None
        self.received = self.finished = self.requeued = self.given_up = self.connects = 0

    @property
    def wanted(self) -> bool:
        return self.direct or self.listed

    def stats(self) -> ConnectionStats:
        """This address's counters; RDY and in flight summed over its lanes."""
        lanes = [s for s in (self.session, self.bulk) if s is not None]
        return ConnectionStats(
            self.address,
            self.session is not None and self.session.open,
            sum(s.slot.rdy for s in lanes),
            sum(s.slot.in_flight for s in lanes),
            self.received,
            self.finished,
            self.requeued,
            self.given_up,
            self.connects,
            self.lane,
        )

    @property
    def lane(self) -> str:
        """See :attr:`ConnectionStats.lane`."""
        if self.meter is None:
            return "single"
        return "bulk" if self.bulk is not None and not self.bulk.slot.standby else "fast"


class _Session:
    """One connection's life: the Connection, its RDY slot, its negotiated limits."""

    __slots__ = (
        "address",
        "check_at",
        "closing",
        "conn",
        "link",
        "max_msg_timeout",
        "open",
        "slot",
        "touch_interval",
    )

    def __init__(self, link: _Link) -> None:
        self.link = link
        self.address = link.address
        self.conn: Connection
        self.open = False
        self.slot = Slot(key=self)
        self.touch_interval = 30.0
        self.max_msg_timeout = 900.0
        # When the link's LaneMeter wants a look (the lane in use only), else NEVER.
        self.check_at = NEVER
        self.closing = False  # retired: closing once its messages are answered

    def __str__(self) -> str:
        return self.address


class Subscriptions:
    """Connection management for one topic/channel; see the module docstring."""

    name: str
    topic: str
    channel: str
    _settings: Settings
    _config: ConnectionConfig
    _bulk_config: ConnectionConfig | None
    """The bulk lane's config when output buffering is adaptive, else None."""
    _time: Callable[[], float]
    _links: dict[str, _Link]
    _sessions: list[_Session]
    _stopping: bool
    _started: bool
    _poller: LookupdPoller | None
    _closing: set[asyncio.Future[None]]
    _first_attempts: list[asyncio.Future[Any]] | None
    _retired: ConnectionStats
    connection_errors: dict[str, int]
    """Connection failures and non-fatal nsqd errors by reason (see :data:`REASONS`)."""

    if TYPE_CHECKING:

        def _on_message(
            self, session: _Session, timestamp: int, attempts: int, message_id: bytes, body: bytes
        ) -> None: ...
        def _replan(self) -> None: ...

    @property
    def ready(self) -> bool:
        """True when consuming works as far as anyone can tell: at least one connection is
        subscribed, or no nsqd is known to have the topic (lookupd answered that none
        has it yet). False before :meth:`start` and while nsqd have it and none is
        subscribed."""
        if not self._started:
            return False  # no link made yet: "no nsqd has the topic" is not known
        if any(s.open for s in self._sessions):
            return True
        if any(link.wanted for link in self._links.values()):
            return False
        return self._poller is None or self._poller.answered > 0

    def _maintain(self, link: _Link) -> asyncio.Future[Any]:
        """Start (or find) the task keeping ``link`` connected; a future for its first try."""
        first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if link.task is None or link.task.done():
            link.task = asyncio.create_task(self._connect_loop(link, first))
        else:
            first.set_result(None)
        if self._first_attempts is not None:
            self._first_attempts.append(first)
        return first

    async def _connect_loop(self, link: _Link, first: asyncio.Future[Any]) -> None:
        settings = self._settings
        failures = 0
        try:
            while self._wants(link):
                if failures:
                    delay = reconnect_delay(
                        failures, settings.reconnect_delay, settings.max_reconnect_delay
                    )
                    await asyncio.sleep(delay)
                    if not self._wants(link):
                        break
                try:
                    session = await self._open(link)
                except ConfigurationError as exc:
                    self._count_error("refused_setting")
                    log.error("%s: not consuming from %s: %s", self.name, link.address, exc)
                    if not first.done():
                        first.set_exception(exc)
                    return
                if not first.done():
                    first.set_result(None)
                if session is None:
                    failures += 1
                    continue
                failures = 0
                await session.conn.wait_closed()
                self._on_session_closed(session)
                failures = 1
        finally:
            if not first.done():
                first.set_result(None)

    def _wants(self, link: _Link) -> bool:
        return link.wanted and not self._stopping

    async def _open(self, link: _Link, bulk: bool = False) -> _Session | None:
        session = _Session(link)
        config = self._bulk_config if bulk else self._config
        assert config is not None
        if not link.direct:  # security: found through lookupd (options.for_discovered)
            config = config.for_discovered()

        def make(config: ConnectionConfig) -> Connection:
            session.conn = Connection(
                link.address,
                config,
                on_message=partial(self._on_message, session),
                on_error=self._on_nsqd_error,
                on_close=partial(self._on_conn_lost, session),
            )
            return session.conn

        try:
            http = self._poller.http_addresses.get(link.address) if self._poller else None
            conn = await connect_adapting(link.address, config, make, http)
            info = conn.server
            await conn.subscribe(self.topic, self.channel)
        except ConfigurationError:
            raise  # a setting this nsqd refuses: retrying cannot help
        except BaseException as exc:  # every other failure means "try again later"
            if hasattr(session, "conn"):
                session.conn.abort()
            if not isinstance(exc, Exception):
                raise  # cancelled
            self._count_error(error_reason(exc))
            if bulk:
                log.info("%s: no buffered connection to %s: %s", self.name, link.address, exc)
                return None
            log.warning("%s: cannot subscribe on %s: %s", self.name, link.address, exc)
            if self._poller is not None:
                self._poller.poll_soon()
            return None
        session.open = True
        session.slot.max_rdy = info.max_rdy_count
        session.touch_interval = max(info.msg_timeout / 2.0, 0.5)
        session.max_msg_timeout = info.max_msg_timeout
        self._sessions.append(session)
        if bulk:
            session.slot.standby = True
            link.bulk = session
            log.debug("%s: buffered connection to %s open", self.name, link.address)
            return session
        link.session = session
        link.connects += 1
        if link.bulk is not None:  # left from before (listed again while retiring)
            link.bulk.slot.standby = True
        if self._bulk_config is not None:
            link.meter = LaneMeter(self._time(), conn.bytes_received)
            session.check_at = link.meter.check_at
        log.info("%s: subscribed on %s", self.name, link.address)
        self._replan()
        return session

    def _on_conn_lost(self, session: _Session, conn: Connection, reason: Exception) -> None:
        # Runs inside connection_lost, before anything else can try to write to it.
        session.open = False
        if not self._stopping and not session.slot.retiring and not conn._closing:
            self._count_error(error_reason(reason))

    def _count_error(self, reason: str) -> None:
        self.connection_errors[reason] = self.connection_errors.get(reason, 0) + 1

    def _on_session_closed(self, session: _Session) -> None:
        session.open = False
        link = session.link
        if link.session is session:
            link.session = None
        if session in self._sessions:
            self._sessions.remove(session)
        if link.bulk is not None and not session.slot.retiring:
            link.bulk.conn.abort()  # the pair is one nsqd: reconnect it as one
        if self._stopping:
            return
        if link.wanted and not session.slot.retiring:
            log.warning("%s: connection to %s lost; reconnecting", self.name, link.address)
            if self._poller is not None:
                self._poller.poll_soon()
        self._replan()

    def _on_producers(self, addresses: set[str]) -> None:
        if self._stopping:
            return
        for address in addresses:
            link = self._links.get(address)
            if link is None:
                link = self._links[address] = _Link(address, direct=False)
            if not link.listed:
                link.listed = True
                if self._started and (link.task is None or link.task.done()):
                    self._maintain(link)
        for address, link in list(self._links.items()):
            if link.listed and address not in addresses and not link.direct:
                link.listed = False
                self._retire(link)

    def _retire(self, link: _Link) -> None:
        """Drop an nsqd that vanished from lookupd, once its messages are done."""
        log.info("%s: %s left lookupd; closing it when idle", self.name, link.address)
        sessions = [s for s in (link.session, link.bulk) if s is not None]
        if not sessions:
            for task in (link.task, link.bulk_task):
                if task is not None:
                    task.cancel()
            self._forget(link)
            return
        for session in sessions:
            session.slot.retiring = True
        self._replan()
        for session in sessions:
            if session.slot.in_flight == 0:
                self._retired_idle(session)

    def _retired_idle(self, session: _Session) -> None:
        """A retiring connection has nothing in flight: close it once nothing can still
        be on the wire either (its lowered RDY settled, see nsq/rdy.py)."""
        slot = session.slot
        if session.closing or not slot.retiring or slot.in_flight:
            return
        wait = slot.held_until - self._time()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self._retired_idle, session)
            return
        self._close_retired(session)

    def _close_retired(self, session: _Session) -> None:
        link = session.link
        if link.wanted:  # listed again meanwhile
            session.slot.retiring = False
            self._replan()
            return
        session.closing = True
        if all(s is None or s.closing or not s.open for s in (link.session, link.bulk)):
            self._forget(link)  # the last lane of a retired nsqd: its stats go too
        closing = asyncio.ensure_future(session.conn.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    def _forget(self, link: _Link) -> None:
        if self._links.get(link.address) is link:
            del self._links[link.address]
            r = self._retired
            r.received += link.received
            r.finished += link.finished
            r.requeued += link.requeued
            r.given_up += link.given_up
            r.connects += link.connects

    # --- lanes (adaptive output buffering) --------------------------------------

    def _check_lane(self, session: _Session, now: float) -> None:
        """The link's meter window on the lane in use ended: move RDY if it says so."""
        link = session.link
        meter = link.meter
        if meter is None or session.slot.standby:
            session.check_at = NEVER
            return
        move = meter.observe(now, session.conn.bytes_received, session.slot.rdy)
        session.check_at = meter.check_at
        if move is None or self._stopping or session.slot.retiring:
            return
        bulk = link.bulk
        if not move:
            self._use_lane(link, bulk=False)
        elif bulk is not None and bulk.open:
            self._use_lane(link, bulk=True)
        elif (link.bulk_task is None or link.bulk_task.done()) and now >= link.bulk_retry_at:
            link.bulk_task = asyncio.create_task(self._bulk_lane(link))

    def _use_lane(self, link: _Link, bulk: bool) -> None:
        """Give the link's RDY to its bulk lane (or back to the fast one)."""
        fast, other = link.session, link.bulk
        if fast is None or link.meter is None:
            return
        if other is None or not other.open:
            bulk = False
        active = other if bulk and other is not None else fast
        for session in (fast, other):
            if session is not None and session is not active:
                session.slot.standby = True
                session.check_at = NEVER
        active.slot.standby = False
        link.meter.moved(self._time(), bulk, active.conn.bytes_received)
        active.check_at = link.meter.check_at
        log.debug("%s: %s lane of %s", self.name, "bulk" if bulk else "fast", link.address)
        self._replan()

    async def _bulk_lane(self, link: _Link) -> None:
        """Open the link's buffered connection, hand it the RDY, and tidy up once it is
        closed (by nsqd, with its fast lane, or at stop)."""
        try:
            session = await self._open(link, bulk=True)
        except ConfigurationError as exc:  # an explicit setting it refuses: never retried
            log.warning("%s: reading %s unbuffered only: %s", self.name, link.address, exc)
            link.bulk_retry_at = float("inf")
            return
        if session is None:
            link.bulk_retry_at = self._time() + BULK_RETRY
            return
        fast = link.session
        if self._stopping or fast is None or not fast.open or fast.slot.retiring:
            session.conn.abort()
        else:
            self._use_lane(link, bulk=True)
        await session.conn.wait_closed()
        session.open = False
        if session in self._sessions:
            self._sessions.remove(session)
        if link.bulk is session:
            link.bulk = None
        if fast is not None and fast.open and link.session is fast:
            self._use_lane(link, bulk=False)

    def _on_nsqd_error(self, conn: Connection, error: NSQDError) -> None:
        # E_FIN_FAILED and friends: nsqd already gave the message to someone else (it
        # timed out) or the id is unknown. Not fatal; the redelivery is handled anew.
        self._count_error(error.code.lower().removeprefix("e_"))
        log.warning("%s: nsqd %s: %s", self.name, conn.address, error)


#: ``error_reason`` results, the ``reason`` label of nsqworker_connection_errors_total.
REASONS = {
    "refused": "the TCP connection was refused or failed (nsqd down?)",
    "timeout": "nsqd accepted TCP but did not finish IDENTIFY within dial_timeout",
    "heartbeat": "nothing, not even a heartbeat, arrived for 2 heartbeat intervals",
    "closed": "nsqd closed the connection or it was reset",
    "garbage": "nsqd sent bytes that are not NSQ frames",
    "nsqd_error": "nsqd answered with a fatal error (E_BAD_TOPIC, E_IDENTIFY_FAILED...)",
    "refused_setting": "nsqd refused a setting the operator chose (not retried)",
    "fin_failed": "a FIN for a message nsqd had already timed out (E_FIN_FAILED)",
    "req_failed": "a REQ nsqd could not apply (E_REQ_FAILED)",
    "touch_failed": "a TOUCH nsqd could not apply (E_TOUCH_FAILED)",
}


def error_reason(exc: BaseException) -> str:
    """A short label for why a connection failed or was lost (see :data:`REASONS`)."""
    if isinstance(exc, NSQDError):
        return "nsqd_error"
    if isinstance(exc, ConnectionClosed) and exc.error is not None:
        return "nsqd_error"
    text = str(exc)
    for words, reason in _REASON_WORDS:
        if words in text:
            return reason
    return "closed" if isinstance(exc, ConnectionClosed) else "refused"


_REASON_WORDS = (
    ("heartbeat", "heartbeat"),
    ("did not connect and negotiate", "timeout"),
    ("garbage", "garbage"),
    ("cannot connect", "refused"),
)
