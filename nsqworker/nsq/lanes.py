"""Adaptive output buffering, pure: when a subscription moves an nsqd's RDY between its
unbuffered connection (the fast lane) and a buffered one (the bulk lane).

nsqd writes to a consumer either at once (IDENTIFY ``output_buffer_size=-1``: three
``write`` calls per message) or through a buffer it flushes when full, when the
client's in-flight count reaches its RDY, or on a timer that cannot go below nsqd's
``--min-output-buffer-timeout`` (25 ms by default). Writing at once gives the lowest
latency at any rate; buffering costs nsqd a fraction of the CPU under a backlog (on
two shared cores, ``nsqworker run`` drained about 3x faster) but makes a trickle wait
for the timer. nsqd fixes the choice per connection, in IDENTIFY.

So with ``output_buffer_size`` unset, a consumer reads each nsqd on a fast lane and,
once the bytes arriving there would fill :data:`BULK_BUFFER` within
:data:`BUFFER_DELAY` (so buffering would delay a message by less than that), opens a
second, buffered connection to the same nsqd and gives it the RDY; when the rate falls
below a quarter of that, RDY goes back. A :class:`LaneMeter` watches the lane in use
and says when to move; the RDY planner (:mod:`nsqworker.nsq.rdy`) does the handover.
"""

from __future__ import annotations

__all__ = [
    "BUFFER_DELAY",
    "BULK_BUFFER",
    "BULK_TIMEOUT",
    "DOWN_RATE",
    "MIN_RDY",
    "UP_RATE",
    "LaneMeter",
]

BULK_BUFFER = 16384
"""output_buffer_size of the bulk lane (nsqd's own default)."""
BULK_TIMEOUT = 0.025
"""output_buffer_timeout of the bulk lane (nsqd's lowest by default): how long the last
messages of a backlog wait before nsqd flushes them."""
BUFFER_DELAY = 0.005
"""The bulk lane is used only at rates where its buffer fills this fast."""
UP_RATE = BULK_BUFFER / BUFFER_DELAY
"""Bytes/s on the fast lane above which buffering costs at most BUFFER_DELAY."""
DOWN_RATE = UP_RATE / 4
"""Bytes/s on the bulk lane below which RDY goes back to the fast lane (hysteresis)."""
MIN_RDY = 16
"""Below this RDY nsqd flushes at every few messages anyway (in flight reaches RDY)."""
FAST_WINDOW = 0.01
"""Seconds of each rate measure on the fast lane..."""
UP_STREAK = 2
"""...and how many in a row must be above UP_RATE (a lone burst is not a load)."""
BULK_WINDOW = 0.1
"""Seconds of each rate measure on the bulk lane (several of nsqd's flush timers)."""

NEVER = float("inf")


class LaneMeter:
    """The byte rate on the lane in use, measured over windows.

    The owner calls :meth:`observe` when ``now >= check_at`` with the total bytes
    received on the lane in use; the answer is ``True`` (move to the bulk lane),
    ``False`` (move to the fast lane) or ``None`` (stay). After a move the owner calls
    :meth:`moved` with the new lane's byte count.
    """

    __slots__ = ("bulk", "check_at", "start", "start_bytes", "streak")

    def __init__(self, now: float, total_bytes: int) -> None:
        self.bulk = False
        self.streak = 0
        self.start = now
        self.start_bytes = total_bytes
        self.check_at = now + FAST_WINDOW

    def observe(self, now: float, total_bytes: int, rdy: int) -> bool | None:
        """What to do after the window ending ``now``; see the class docstring."""
        elapsed = now - self.start
        if elapsed <= 0:
            return None
        rate = (total_bytes - self.start_bytes) / elapsed
        self.start, self.start_bytes = now, total_bytes
        if self.bulk:
            self.check_at = now + BULK_WINDOW
            return False if rate < DOWN_RATE else None
        self.check_at = now + FAST_WINDOW
        if rate < UP_RATE or rdy < MIN_RDY:
            self.streak = 0
            return None
        self.streak += 1
        return True if self.streak >= UP_STREAK else None

    def moved(self, now: float, bulk: bool, total_bytes: int) -> None:
        """The lane in use changed to ``bulk`` (or back); measure it from ``now``."""
        self.bulk = bulk
        self.streak = 0
        self.start, self.start_bytes = now, total_bytes
        self.check_at = now + (BULK_WINDOW if bulk else FAST_WINDOW)
