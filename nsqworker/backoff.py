"""Consumer backoff as one small state machine, pure and the same on every transport.

Failures pause a subscription's whole flow, then one message at a time probes it; once
failures stop, the flow opens again. Nothing here sleeps, reads a clock or arms a
timer: the caller passes ``now`` (the clock of ``Message.received_at``) and keeps one
timer armed for :attr:`Backoff.deadline`, whatever clock its loop's timers run on.

The phases and what the transport is asked for in each (:attr:`Backoff.flow`):

======== ===================================================== ===================
phase    meaning                                               flow
======== ===================================================== ===================
OPEN     no backoff (level 0)                                  the whole window
PAUSED   a failure was counted; wait until ``deadline``        nothing
PROBING  one message at a time; the next outcome of a message  one (a probe)
         received in this window decides
STOPPED  draining or closed, for good                          nothing
======== ===================================================== ===================

Events, and the moves each may cause (:data:`TRANSITIONS` is this table as data; every
move is checked against it):

============================ ======== ====================== ======================== =======
event                        OPEN     PAUSED                 PROBING                  STOPPED
============================ ======== ====================== ======================== =======
failure of this window       PAUSED   (none: paused)         PAUSED, level + 1        -
failure from an earlier one  -        - (ignored)            - (ignored)              -
success of this window       -        (none: paused)         PROBING, level - 1, or   -
                                                             OPEN at level 0
success from an earlier one  -        - (ignored)            - (ignored)              -
timer, due                   -        PROBING                OPEN if no probe runs
                                                             (quiet: nothing to try);
                                                             else the deadline moves
timer, early (any clock)     -        - (deadline kept)      - (deadline kept)        -
stall (overdue, see below)   -        OPEN, logged           OPEN, logged             -
stop (drain)                 STOPPED  STOPPED                STOPPED                  -
connection lost or gained    -        -                      -                        -
flow change (window size)    -        -                      -                        -
============================ ======== ====================== ======================== =======

A connection coming or going moves nothing here: the transport re-plans its own flow
(on NSQ the probe moves to another nsqd). "Of this window" means the message was
received at or after the phase began, so an outcome that was already on its way when
the pause started can neither extend nor end it.

Liveness, the invariant that matters most: once failures stop, the flow is OPEN again
within the pause (at most ``max_duration``) plus one probe: a successful probe lowers the
level and probes again at once; a probe window in which nothing arrives (an empty
topic) opens the flow after ``quiet`` seconds. The property tests
(``tests/unit/test_backoff_machine.py``) hold the machine to it over random
interleavings, early timers included. :meth:`Backoff.stalled` is the safety net for a
driver that lost its timer: a phase that outlived its deadline by ``margin``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from nsqworker.transport import Flow, Timer

__all__ = [
    "PROBE_QUIET",
    "STALL_MARGIN",
    "TRANSITIONS",
    "Alarm",
    "Backoff",
    "Event",
    "Phase",
    "check_move",
]

Random = Callable[[], float]

#: Seconds a probe window may stay without any message before the flow opens anyway.
PROBE_QUIET = 2.0
#: Seconds past its deadline after which a phase counts as stalled (its timer was lost).
STALL_MARGIN = 10.0


class Phase(Enum):
    """Where a subscription is in its backoff cycle."""

    OPEN = "open"
    PAUSED = "paused"
    PROBING = "probing"
    STOPPED = "stopped"


class Event(Enum):
    """What can happen to the machine."""

    FAILURE = "failure"
    SUCCESS = "success"
    TIMER = "timer"
    STALL = "stall"
    STOP = "stop"


_O, _PA, _PR, _S = Phase.OPEN, Phase.PAUSED, Phase.PROBING, Phase.STOPPED

#: (phase, event) -> the phases that event may move the machine to (staying put is
#: always allowed: a late or early event changes nothing).
TRANSITIONS: dict[tuple[Phase, Event], frozenset[Phase]] = {
    (_O, Event.FAILURE): frozenset({_PA}),
    (_PR, Event.FAILURE): frozenset({_PA}),
    (_PR, Event.SUCCESS): frozenset({_O}),
    (_PA, Event.TIMER): frozenset({_PR}),
    (_PR, Event.TIMER): frozenset({_O}),
    (_PA, Event.STALL): frozenset({_O}),
    (_PR, Event.STALL): frozenset({_O}),
    (_O, Event.STOP): frozenset({_S}),
    (_PA, Event.STOP): frozenset({_S}),
    (_PR, Event.STOP): frozenset({_S}),
}

_FLOWS = {_O: Flow.OPEN, _PA: Flow.PAUSED, _PR: Flow.PROBE, _S: Flow.PAUSED}


@dataclass
class Backoff:
    """One subscription's consumer backoff.

    A counted failure raises the level and pauses for
    ``min(multiplier x 2^level, max_duration)`` less up to ``jitter`` of it; then one
    message at a time probes. ``multiplier == 0`` (or ``max_duration == 0``) turns
    backoff off: the machine stays OPEN. Each event method returns True when the phase
    changed (the caller then hands :attr:`flow` to the transport); after any call the
    caller keeps one timer armed for :attr:`deadline` (None: no timer).
    """

    multiplier: float
    max_duration: float
    jitter: float = 0.1
    quiet: float = PROBE_QUIET
    margin: float = STALL_MARGIN
    rand: Random = random.random
    phase: Phase = Phase.OPEN
    level: int = 0
    since: float = 0.0
    """When the current phase (or probe window) began."""
    deadline: float | None = None
    """When the timer must fire: the pause's end, or a probe window's quiet limit."""
    stalls: int = 0
    max_level: int = field(init=False)

    def __post_init__(self) -> None:
        if self.multiplier <= 0 or self.max_duration <= 0:
            self.max_level = 0
        else:
            ratio = self.max_duration / self.multiplier
            self.max_level = max(1, math.ceil(math.log2(ratio))) if ratio > 1 else 1

    @property
    def enabled(self) -> bool:
        """False when the multiplier or the cap is 0."""
        return self.max_level > 0

    @property
    def flow(self) -> Flow:
        """What the transport should do now."""
        return _FLOWS[self.phase]

    def duration(self, level: int) -> float:
        """The pause for ``level``, before jitter."""
        return min(self.multiplier * 2.0 ** min(level, 62), self.max_duration)

    def in_window(self, received_at: float) -> bool:
        """Whether a message received at ``received_at`` belongs to the current window
        (its outcome may move the machine)."""
        if self.phase is Phase.OPEN:
            return True
        return self.phase is Phase.PROBING and received_at >= self.since

    # --- events ------------------------------------------------------------------

    def failure(self, received_at: float, now: float) -> bool:
        """A message failed (and asks for backoff); True if the phase changed."""
        if not self.enabled or not self.in_window(received_at):
            return False
        self.level = min(self.level + 1, self.max_level)
        pause = self.duration(self.level) * (1.0 - self.jitter * self.rand())
        return self._move(Event.FAILURE, Phase.PAUSED, now, now + pause)

    def success(self, received_at: float, now: float) -> bool:
        """A message succeeded; True if the phase changed."""
        if self.phase is not Phase.PROBING or received_at < self.since:
            return False
        self.level -= 1
        if self.level <= 0:
            self.level = 0
            return self._move(Event.SUCCESS, Phase.OPEN, now, None)
        self.since, self.deadline = now, now + self.quiet  # probe again at once
        return False

    def timer(self, now: float, probe_running: bool = False) -> bool:
        """The timer for :attr:`deadline` fired; True if the phase changed.

        A timer that fires before the deadline on ``now``'s clock (loops and clocks
        differ: uvloop fires early against ``time.monotonic``) changes nothing and keeps
        the deadline, so the caller arms it again. ``probe_running``: a message of the
        current probe window is still being handled (its outcome will decide)."""
        if self.deadline is None or now < self.deadline:
            return False
        if self.phase is Phase.PAUSED:
            return self._move(Event.TIMER, Phase.PROBING, now, now + self.quiet)
        if self.phase is Phase.PROBING:
            if probe_running:
                self.deadline = now + self.quiet
                return False
            self.level = 0
            return self._move(Event.TIMER, Phase.OPEN, now, None)
        return False

    def stalled(self, now: float, probe_running: bool = False) -> bool:
        """Whether the phase outlived its deadline by :attr:`margin` (a lost timer)
        while no probe runs; if so the flow is opened (the caller logs it once)."""
        if self.phase not in (Phase.PAUSED, Phase.PROBING) or probe_running:
            return False
        due = self.deadline if self.deadline is not None else self.since
        if now < due + self.margin:
            return False
        self.stalls += 1
        self.level = 0
        return self._move(Event.STALL, Phase.OPEN, now, None)

    def stop(self, now: float) -> bool:
        """A drain began: nothing more flows, for good."""
        if self.phase is Phase.STOPPED:
            return False
        return self._move(Event.STOP, Phase.STOPPED, now, None)

    def _move(self, event: Event, to: Phase, now: float, deadline: float | None) -> bool:
        check_move(self.phase, event, to)
        changed = to is not self.phase
        self.phase, self.since, self.deadline = to, now, deadline
        return changed


def check_move(phase: Phase, event: Event, to: Phase) -> None:
    """Raise AssertionError unless ``event`` may move ``phase`` to ``to`` (staying put
    is always allowed): :data:`TRANSITIONS` enforced."""
    if to is not phase and to not in TRANSITIONS.get((phase, event), frozenset()):
        raise AssertionError(f"backoff: {event.value} may not move {phase} to {to}")


class Alarm:
    """Keeps exactly one timer armed for a deadline on ``clock``.

    ``call_later`` is the loop's (its timers may run on another clock than ``clock``, and
    uvloop's fire up to a millisecond early against ``time.monotonic``); ``fire`` runs when
    the timer does. The deadline is forgotten before ``fire`` runs, so a ``fire`` that
    finds the deadline not reached yet just calls :meth:`set` again: no timer is lost.
    """

    __slots__ = ("_call_later", "_clock", "_fire", "_handle", "due")

    #: Added to each delay, so a timer early by less than this still finds its deadline.
    SLACK = 0.002

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], Timer],
        clock: Callable[[], float],
        fire: Callable[[], None],
    ) -> None:
        self._call_later = call_later
        self._clock = clock
        self._fire = fire
        self._handle: Timer | None = None
        self.due: float | None = None

    @property
    def armed(self) -> bool:
        """Whether a timer is pending."""
        return self._handle is not None

    def set(self, due: float | None) -> None:
        """Arm for ``due`` (on ``clock``), or disarm with None; a no-op if already so."""
        if due == self.due and (due is None or self._handle is not None):
            return
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self.due = due
        if due is not None:
            delay = max(due - self._clock(), 0.0) + self.SLACK
            self._handle = self._call_later(delay, self._fired)

    def _fired(self) -> None:
        self._handle = None
        self.due = None
        self._fire()
