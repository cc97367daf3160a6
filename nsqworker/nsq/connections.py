"""The connections of one NSQ subscription: one link per nsqd address, one session per
connection, kept up with reconnect backoff and discovered through nsqlookupd.

With adaptive output buffering (``output_buffer_size`` unset) a link reads its nsqd on
an unbuffered connection and, under load, on a second, buffered one (the bulk lane,
see :mod:`nsqworker.nsq.lanes`); one of the two holds the link's RDY at a time.

:class:`Connections` opens, subscribes, retires and forgets connections; the
subscription that owns it (:mod:`nsqworker.nsq.subscription`) decides RDY and hands
messages on. They meet through two callbacks: ``on_message`` (per session) and
``replan`` (the set of connections or lanes changed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from nsqworker.errors import ConfigurationError, NSQDError
from nsqworker.nsq.connection import Connection, ConnectionConfig
from nsqworker.nsq.handshake import connect_adapting
from nsqworker.nsq.lanes import NEVER, LaneMeter
from nsqworker.nsq.links import ConnectionStats, Link, Session, error_reason
from nsqworker.nsq.lookupd import LookupdPoller
from nsqworker.reconnect import reconnect_delay
from nsqworker.subscription_kit import ErrorCounts

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings

__all__ = ["BULK_RETRY", "Connections"]

log = logging.getLogger("nsqworker.nsq.consumer")

BULK_RETRY = 30.0
"""Seconds before a bulk lane that failed to open is tried again."""


class Connections:
    """The connections of one subscription; see the module docstring."""

    def __init__(
        self,
        name: str,
        topic: str,
        channel: str,
        settings: Settings,
        config: ConnectionConfig,
        bulk_config: ConnectionConfig | None,
        *,
        clock: Callable[[], float],
        on_message: Callable[[Session, int, int, bytes, bytes], None],
        replan: Callable[[], None],
    ) -> None:
        self.name = name
        self.topic = topic
        self.channel = channel
        self._settings = settings
        self.config = config
        """How each connection is made (the bulk lane's aside)."""
        self._bulk_config = bulk_config
        """The bulk lane's config when output buffering is adaptive, else None."""
        self._time = clock
        self._on_message = on_message
        self._replan = replan
        self.links: dict[str, Link] = {}
        self.sessions: list[Session] = []
        self.stopping = False
        self.started = False
        self.poller: LookupdPoller | None = None
        self._background: list[asyncio.Task[Any]] = []
        self._closing: set[asyncio.Future[None]] = set()
        self._first_attempts: list[asyncio.Future[Any]] | None = []
        self.retired = ConnectionStats("retired", False, 0, 0, 0, 0)
        """Counters of nsqd that left lookupd and were closed."""
        self.errors = ErrorCounts()
        """Connection failures and non-fatal nsqd errors by reason (see :data:`REASONS`)."""
        self._found_elsewhere: set[str] = set()
        self._told: set[tuple[str, str]] = set()  # (address, what) logged once already

    # --- lifecycle -------------------------------------------------------------

    def found_through_lookupd(self, addresses: set[str]) -> None:
        """Treat these of the settings' ``nsqd_tcp_addresses`` as found through
        nsqlookupd by the caller (RpcClient's reply nsqd): they get the options for
        discovered nsqd (``ConnectionConfig.for_discovered``) and refusing our
        IDENTIFY is not fatal at start. Call before :meth:`start`."""
        self._found_elsewhere |= addresses

    async def start(self) -> None:
        """Connect to the direct nsqd and poll lookupd once; returns after those first
        attempts (failed ones keep retrying in the background). A direct nsqd that
        refuses a setting raises ConfigurationError; one lookupd lists does not."""
        self.started = True
        settings = self._settings
        for address in settings.nsqd_tcp_addresses:
            direct = address not in self._found_elsewhere
            link = self.links.setdefault(address, Link(address, direct=direct))
            link.direct = direct
            link.listed = link.listed or not direct
        for link in list(self.links.values()):
            self._maintain(link)
        if settings.lookupd_http_addresses:
            self.poller = LookupdPoller(
                settings.lookupd_http_addresses,
                self.topic,
                self._on_producers,
                interval=settings.lookupd_poll_interval,
                jitter=settings.lookupd_poll_jitter,
                allow=settings.lookupd_allowed_nsqd,  # only these nsqd of lookupd's answers
            )
            await self.poller.poll()
            self._background.append(asyncio.create_task(self.poller.run(poll_first=False)))
        first, self._first_attempts = self._first_attempts or [], None
        if first:
            await asyncio.wait(first, timeout=self.config.dial_timeout + 1.0)
        for attempt in first:  # a setting nsqd refuses is an error at start
            if attempt.done() and attempt.exception() is not None:
                raise attempt.exception()  # type: ignore[misc]

    def stop_intake(self) -> None:
        """Stop discovery and reconnects (the caller pauses RDY)."""
        self.stopping = True
        for task in self._background:
            task.cancel()
        for link in self.links.values():
            if link.task is not None and link.session is None:
                link.task.cancel()

    async def close(self) -> None:
        """CLS and close every connection, stop every keeper task and the poller."""
        self.stopping = True
        sessions = [s for s in self.sessions if s.open]
        await asyncio.gather(*(s.conn.close() for s in sessions), return_exceptions=True)
        for link in self.links.values():
            for keeper in (link.task, link.bulk_task):
                if keeper is not None:
                    keeper.cancel()
        if self.poller is not None:
            await self.poller.close()

    @property
    def ready(self) -> bool:
        """True when consuming works as far as anyone can tell: at least one connection is
        subscribed, or no nsqd is known to have the topic (lookupd answered that none
        has it yet). False before :meth:`start` and while nsqd have it and none is
        subscribed."""
        if not self.started:
            return False  # no link made yet: "no nsqd has the topic" is not known
        if any(s.open for s in self.sessions):
            return True
        if any(link.wanted for link in self.links.values()):
            return False
        return self.poller is None or self.poller.answered > 0

    def _maintain(self, link: Link) -> asyncio.Future[Any]:
        """Start (or find) the task keeping ``link`` connected; a future for its first try."""
        first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if link.task is None or link.task.done():
            link.task = asyncio.create_task(self._connect_loop(link, first))
        else:
            first.set_result(None)
        if self._first_attempts is not None:
            self._first_attempts.append(first)
        return first

    async def _connect_loop(self, link: Link, first: asyncio.Future[Any]) -> None:
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
                    self.errors.count("refused_setting")
                    if not link.direct:
                        # Security: anyone can get an nsqd listed by lookupd; its refusal
                        # must not stop the worker. Retried with backoff like a failure.
                        self._tell_once(link.address, "refused", logging.ERROR,
                                        "%s: not consuming from %s (found through lookupd) "
                                        "while it refuses our settings; retrying: %s",
                                        self.name, link.address, exc)  # fmt: skip
                        if not first.done():
                            first.set_result(None)
                        failures += 1
                        continue
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

    def _wants(self, link: Link) -> bool:
        return link.wanted and not self.stopping

    async def _open(self, link: Link, bulk: bool = False) -> Session | None:
        session = Session(link)
        config = self._bulk_config if bulk else self.config
        assert config is not None
        if not link.direct:  # security: found through lookupd (options.for_discovered)
            config = config.for_discovered()
            if config.auth_secret and not config.tls_v1 and config.lookupd_auth_without_tls:
                self._tell_once(link.address, "auth", logging.WARNING,
                                "%s: %s was found through lookupd and lookupd_auth_without_tls "
                                "is set: it gets the AUTH secret over plain TCP if it asks",
                                self.name, link.address)  # fmt: skip

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
            http = self.poller.http_addresses.get(link.address) if self.poller else None
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
            self.errors.count(error_reason(exc))
            if bulk:
                log.info("%s: no buffered connection to %s: %s", self.name, link.address, exc)
                return None
            log.warning("%s: cannot subscribe on %s: %s", self.name, link.address, exc)
            if self.poller is not None:
                self.poller.poll_soon()
            return None
        session.open = True
        session.slot.max_rdy = info.max_rdy_count
        session.touch_interval = max(info.msg_timeout / 2.0, 0.5)
        session.max_msg_timeout = info.max_msg_timeout
        self.sessions.append(session)
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

    def _on_conn_lost(self, session: Session, conn: Connection, reason: Exception) -> None:
        # Runs inside connection_lost, before anything else can try to write to it.
        session.open = False
        if not self.stopping and not session.slot.retiring and not conn.closing:
            self.errors.count(error_reason(reason))

    def _tell_once(self, address: str, what: str, level: int, text: str, *args: Any) -> None:
        """Log ``text`` the first time only for this nsqd and kind (then at debug)."""
        told = (address, what) in self._told
        if not told and len(self._told) < 4096:  # a lookupd listing ever new nsqd
            self._told.add((address, what))
        log.log(logging.DEBUG if told else level, text, *args)

    def _on_session_closed(self, session: Session) -> None:
        session.open = False
        link = session.link
        if link.session is session:
            link.session = None
        if session in self.sessions:
            self.sessions.remove(session)
        if link.bulk is not None and not session.slot.retiring:
            link.bulk.conn.abort()  # the pair is one nsqd: reconnect it as one
        if self.stopping:
            return
        if link.wanted and not session.slot.retiring:
            log.warning("%s: connection to %s lost; reconnecting", self.name, link.address)
            if self.poller is not None:
                self.poller.poll_soon()
        self._replan()

    def _on_producers(self, addresses: set[str]) -> None:
        if self.stopping:
            return
        for address in addresses:
            link = self.links.get(address)
            if link is None:
                link = self.links[address] = Link(address, direct=False)
            if not link.listed:
                link.listed = True
                if self.started and (link.task is None or link.task.done()):
                    self._maintain(link)
        for address, link in list(self.links.items()):
            if link.listed and address not in addresses and not link.direct:
                link.listed = False
                self._retire(link)

    def _retire(self, link: Link) -> None:
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
                self.retired_idle(session)

    def retired_idle(self, session: Session) -> None:
        """A retiring connection has nothing in flight: close it once nothing can still
        be on the wire either (its lowered RDY settled, see nsq/rdy.py)."""
        slot = session.slot
        if session.closing or not slot.retiring or slot.in_flight:
            return
        wait = slot.held_until - self._time()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self.retired_idle, session)
            return
        self._close_retired(session)

    def _close_retired(self, session: Session) -> None:
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

    def _forget(self, link: Link) -> None:
        if self.links.get(link.address) is link:
            del self.links[link.address]
            r = self.retired
            r.received += link.received
            r.connects += link.connects

    # --- lanes (adaptive output buffering) --------------------------------------

    def check_lane(self, session: Session, now: float) -> None:
        """The link's meter window on the lane in use ended: move RDY if it says so."""
        link = session.link
        meter = link.meter
        if meter is None or session.slot.standby:
            session.check_at = NEVER
            return
        move = meter.observe(now, session.conn.bytes_received, session.slot.rdy)
        session.check_at = meter.check_at
        if move is None or self.stopping or session.slot.retiring:
            return
        bulk = link.bulk
        if not move:
            self._use_lane(link, bulk=False)
        elif bulk is not None and bulk.open:
            self._use_lane(link, bulk=True)
        elif (link.bulk_task is None or link.bulk_task.done()) and now >= link.bulk_retry_at:
            link.bulk_task = asyncio.create_task(self._bulk_lane(link))

    def _use_lane(self, link: Link, bulk: bool) -> None:
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

    async def _bulk_lane(self, link: Link) -> None:
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
        if self.stopping or fast is None or not fast.open or fast.slot.retiring:
            session.conn.abort()
        else:
            self._use_lane(link, bulk=True)
        await session.conn.wait_closed()
        session.open = False
        if session in self.sessions:
            self.sessions.remove(session)
        if link.bulk is session:
            link.bulk = None
        if fast is not None and fast.open and link.session is fast:
            self._use_lane(link, bulk=False)

    def _on_nsqd_error(self, conn: Connection, error: NSQDError) -> None:
        # E_FIN_FAILED and friends: nsqd already gave the message to someone else (it
        # timed out) or the id is unknown. Not fatal; the redelivery is handled anew.
        self.errors.count(error.code.lower().removeprefix("e_"))
        log.warning("%s: nsqd %s: %s", self.name, conn.address, error)
