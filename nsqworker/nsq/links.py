"""The bookkeeping of one NSQ subscription's connections, as plain data.

A :class:`Link` is one nsqd address the subscription wants (counters, the live
session); a :class:`Session` is one connection's life (the Connection, its RDY slot,
its negotiated limits). :func:`error_reason` labels why a connection failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nsqworker.errors import ConnectionClosed, NSQDError
from nsqworker.nsq.connection import Connection
from nsqworker.nsq.lanes import NEVER, LaneMeter
from nsqworker.nsq.rdy import Slot

__all__ = ["REASONS", "ConnectionStats", "Link", "Session", "error_reason"]


@dataclass
class ConnectionStats:
    """Counters of one nsqd address, over all its reconnects."""

    address: str
    connected: bool
    rdy: int
    in_flight: int
    received: int
    connects: int
    lane: str = "single"
    """Where this nsqd's RDY is: "single" (one connection, output_buffer_size set),
    "fast" (unbuffered) or "bulk" (the buffered connection opened under load)."""


class Link:
    """One nsqd address the consumer wants: counters and the live session, if any."""

    __slots__ = (
        "address",
        "bulk",
        "bulk_retry_at",
        "bulk_task",
        "connects",
        "direct",
        "listed",
        "meter",
        "received",
        "session",
        "task",
    )

    def __init__(self, address: str, direct: bool) -> None:
        self.address = address
        self.direct = direct
        self.listed = False
        self.session: Session | None = None
        self.task: asyncio.Task[None] | None = None
        # The buffered lane, when open (adaptive buffering only), and its meter.
        self.bulk: Session | None = None
        self.bulk_task: asyncio.Task[None] | None = None
        self.bulk_retry_at = 0.0
        self.meter: LaneMeter | None = None
        self.received = self.connects = 0

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
            self.connects,
            self.lane,
        )

    @property
    def lane(self) -> str:
        """See :attr:`ConnectionStats.lane`."""
        if self.meter is None:
            return "single"
        return "bulk" if self.bulk is not None and not self.bulk.slot.standby else "fast"


class Session:
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

    def __init__(self, link: Link) -> None:
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
