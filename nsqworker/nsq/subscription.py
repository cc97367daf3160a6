"""One topic/channel over many nsqd, as a transport subscription: RDY and settling.

:class:`NsqSubscription` is NSQ's :class:`~nsqworker.transport.Subscription`. Its
:class:`~nsqworker.nsq.connections.Connections` keep a connection to every nsqd that
has the topic (given directly or found through nsqlookupd); the subscription spreads
the receiver's window over them as RDY (see :mod:`nsqworker.nsq.rdy`), hands each
message frame to the receiver as a :class:`~nsqworker.message.Message`, and turns the
receiver's settles into FIN, REQ and TOUCH. It knows nothing of tasks: attempts,
delays, dead letters, backoff and drain are the receiver's (:mod:`nsqworker.dispatch`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from nsqworker.errors import ConfigurationError
from nsqworker.message import Message, Undecodable
from nsqworker.nsq import protocol
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.connections import Connections
from nsqworker.nsq.lanes import BULK_BUFFER, BULK_TIMEOUT
from nsqworker.nsq.links import ConnectionStats, Session
from nsqworker.nsq.rdy import Mode, plan, released
from nsqworker.subscription_kit import SubscriptionKit
from nsqworker.transport import Flow, Receiver, SubscriptionStats

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings

__all__ = ["ConnectionStats", "NsqSubscription"]

log = logging.getLogger("nsqworker.nsq.consumer")

TICK = 0.05
"""Seconds between looks at rotation turns, held windows and lanes."""
_MODES = {Flow.OPEN: Mode.NORMAL, Flow.PROBE: Mode.PROBING, Flow.PAUSED: Mode.PAUSED}
_monotonic = time.monotonic


class NsqSubscription(SubscriptionKit):
    """``topic``/``channel`` on every nsqd that has it; see the module docstring."""

    def __init__(
        self,
        topic: str,
        channel: str,
        settings: Settings,
        *,
        name: str,
        max_in_flight: int,
        connection_config: ConnectionConfig | None = None,
    ) -> None:
        topic, channel = protocol.check_topic(topic), protocol.check_channel(channel)
        if not settings.nsqd_tcp_addresses and not settings.lookupd_http_addresses:
            raise ConfigurationError(
                "no nsqd to consume from: set nsqd_tcp_addresses (NSQWORKER_NSQD_TCP_ADDRESSES)"
                " or lookupd_http_addresses (NSQWORKER_LOOKUPD_HTTP_ADDRESSES)"
            )
        config = connection_config or ConnectionConfig.from_settings(settings)
        bulk_config = None
        if config.output_buffer_size is None and settings.output_buffer_size is None:
            # Adaptive: unbuffered, with a buffered lane under load (nsq/lanes.py).
            explicit = "output_buffer_timeout" in config.explicit
            timeout = config.output_buffer_timeout if explicit else BULK_TIMEOUT
            bulk_config = dataclasses.replace(
                config, output_buffer_size=BULK_BUFFER, output_buffer_timeout=timeout
            )
            config = dataclasses.replace(config, output_buffer_size=-1)
        # One clock for arrivals, turns and touches: monotonic, like asyncio's default.
        self.connections = Connections(
            name, topic, channel, settings, config, bulk_config,
            clock=_monotonic, on_message=self.on_message, replan=self._replan,
        )  # fmt: skip
        super().__init__(
            topic, channel, name=name, window=max_in_flight, errors=self.connections.errors
        )
        self._mode = Mode.NORMAL
        self._unsatisfied = False
        self._plain = True
        self._plan_scheduled = False

    # --- lifecycle -------------------------------------------------------------

    async def start(self, receiver: Receiver) -> None:
        """Connect to the direct nsqd and poll lookupd once, handing messages to
        ``receiver``; returns after those first attempts (failed ones keep retrying)."""
        if not self._starting(receiver):
            return
        self._spawn(self._tick())
        await self.connections.start()

    async def stop(self) -> None:
        """RDY 0 everywhere; no more discovery or reconnects."""
        self._stopping = True
        self._mode = Mode.PAUSED
        self.connections.stop_intake()
        self._replan()

    async def close(self) -> None:
        """CLS and close every connection."""
        self._cancel_tasks()
        await self.connections.close()

    @property
    def subscribed(self) -> bool:
        """True while at least one nsqd connection is subscribed."""
        return any(s.open for s in self.connections.sessions)

    @property
    def ready(self) -> bool:
        """See :attr:`Connections.ready`."""
        return self.connections.ready

    # --- RDY -------------------------------------------------------------------

    def set_flow(self, flow: Flow, window: int) -> None:
        """The receiver's flow: RDY spread over ``window``, a probe, or paused."""
        self._flow = flow
        mode = Mode.PAUSED if self.connections.stopping else _MODES[flow]
        if mode is self._mode and window == self.window:
            return
        self._mode, self.window = mode, window
        if self._receiver is not None:
            self._replan()

    def _replan(self) -> None:
        self._plan_scheduled = False
        now = _monotonic()
        sessions = [s for s in self.connections.sessions if s.open]
        slots = [s.slot for s in sessions]
        mode = self._mode
        for slot, count in plan(slots, self.window, now, mode):
            session: Session = slot.key  # type: ignore[assignment]
            session.conn.rdy(count)
        wanted = self.window if mode is Mode.NORMAL else 1
        total = sum(s.rdy for s in slots)
        lanes = sum(1 for s in slots if not s.standby)
        self._unsatisfied = (
            bool(lanes) and total < min(wanted, lanes * 2500) and mode is not Mode.PAUSED
        )
        # An ack needs no more than FIN and the slot's count unless a plan waits for
        # capacity or a connection is being retired (see _released).
        self._plain = not self._unsatisfied and not any(s.retiring for s in slots)

    def _schedule_plan(self) -> None:
        if not self._plan_scheduled and self._loop is not None:
            self._plan_scheduled = True
            self._loop.call_soon(self._replan)

    async def _tick(self) -> None:
        """Rotation turns, held windows and lanes, every TICK seconds."""
        connections = self.connections
        while True:
            await asyncio.sleep(TICK)
            now = _monotonic()
            turns = self.window if self._mode is not Mode.PROBING else 1
            if self._unsatisfied or len(connections.sessions) > turns:
                self._replan()
            for session in list(connections.sessions):
                if now >= session.check_at:  # a lane with no message in its window
                    connections.check_lane(session, now)

    # --- messages (hot path) ---------------------------------------------------

    def on_message(
        self, session: Session, timestamp: int, attempts: int, message_id: bytes, body: bytes
    ) -> None:
        """A message frame from ``session``'s nsqd, in its connection's read: to the receiver."""
        now = _monotonic()
        if message_id.isalnum():  # nsqd's ids are 16 hex digits (the check: ~35 ns)
            msg = Message(
                message_id, body, timestamp, attempts, self.topic, self.channel,
                session.address, self._receiver, session, now,
            )  # fmt: skip
        else:  # a hostile nsqd: "../../etc/passwd" is 16 bytes too; never a handler's
            msg = Undecodable(
                message_id, body, timestamp, attempts, self.topic, self.channel,
                session.address, self._receiver, session, now,
                reason=f"nsqd sent a message id that is not 16 ASCII letters and digits: "
                f"{message_id!r}",
            )  # fmt: skip
        slot = session.slot
        slot.in_flight += 1
        slot.last_message = now
        session.link.received += 1
        if now >= session.check_at:
            self.connections.check_lane(session, now)
        if self._deliver(msg):  # type: ignore[misc]
            # Finished inline: what finish() does, with session and slot in hand.
            if session.open:
                session.conn.fin(message_id)
            slot.in_flight -= 1
            if not self._plain:
                self._released(session)

    def finish(self, msg: Message) -> None:
        """FIN."""
        session: Session = msg.receipt
        if session.open:
            session.conn.fin(msg.id_bytes)
        slot = session.slot
        slot.in_flight -= 1
        if not self._plain:
            self._released(session)

    def retry(self, msg: Message, delay: float) -> None:
        """REQ after ``delay`` seconds (nsqd caps it at its --max-req-timeout)."""
        session: Session = msg.receipt
        if session.open:
            ms = min(max(int(delay * 1000), 0), protocol.DEFAULT_MAX_REQ_TIMEOUT_MS)
            session.conn.req(msg.id_bytes, ms)
        session.slot.in_flight -= 1
        self._released(session)

    def reject(self, msg: Message) -> None:
        """FIN: the dead letter is written, nsqd must not deliver it again."""
        self.finish(msg)

    def keep_alive(self, msg: Message) -> None:
        """TOUCH."""
        session: Session = msg.receipt
        if session.open:
            session.conn.touch(msg.id_bytes)

    def keep_alive_interval(self, msg: Message) -> float | None:
        """Half the negotiated msg_timeout; None once the connection is gone."""
        session: Session = msg.receipt
        return session.touch_interval if session.open else None

    def max_hold(self, msg: Message) -> float | None:
        """nsqd's --max-msg-timeout, from the IDENTIFY answer of the message's connection."""
        session: Session | None = msg.receipt
        return None if session is None else float(session.max_msg_timeout)

    def _released(self, session: Session) -> None:
        slot = session.slot
        if self._unsatisfied:
            released(slot, _monotonic())
            self._schedule_plan()
        if slot.retiring and slot.in_flight == 0:
            self.connections.retired_idle(session)

    # --- stats -----------------------------------------------------------------

    def stats(self) -> SubscriptionStats:
        """RDY, connections and errors; per-nsqd detail as ``ConnectionStats``."""
        conns = [link.stats() for link in self.connections.links.values()]
        return SubscriptionStats(
            connected=sum(c.connected for c in conns),
            window=sum(c.rdy for c in conns),
            in_flight=sum(c.in_flight for c in conns),
            buffered=sum(c.lane == "bulk" for c in conns),
            errors=self._error_counts(),
            connections=conns,
        )
