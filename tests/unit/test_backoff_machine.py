"""Consumer backoff's state machine (nsqworker/backoff.py): its table, then properties
over random interleavings on a virtual clock whose timers fire early, as uvloop's do.

The simulated consumer below reacts as the Dispatcher does (an outcome or a timer moves
the machine, the flow follows the phase, one Alarm keeps the machine's deadline) over a
transport that honours the flow as nsqd honours RDY: a window counts every message still
in hand, so a probe waits for older messages to finish.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqworker.backoff import (
    PROBE_QUIET,
    TRANSITIONS,
    Alarm,
    Backoff,
    Event,
    Phase,
    check_move,
)
from nsqworker.transport import Flow


def machine(**kw: float) -> Backoff:
    return Backoff(multiplier=kw.pop("multiplier", 1.0), max_duration=16.0, jitter=0.0, **kw)


# --- the table ------------------------------------------------------------------------


def test_failure_pauses_for_multiplier_times_two_to_the_level() -> None:
    b = machine()
    assert b.failure(received_at=0.0, now=10.0)
    assert b.phase is Phase.PAUSED and b.level == 1 and b.flow is Flow.PAUSED
    assert b.deadline == 12.0


def test_outcomes_during_a_pause_do_not_count() -> None:
    b = machine()
    b.failure(0.0, 10.0)
    assert not b.failure(10.05, 10.1)
    assert not b.success(10.05, 10.1)
    assert b.level == 1 and b.deadline == 12.0


def test_after_the_pause_a_probe_decides() -> None:
    b = machine()
    b.failure(0.0, 10.0)
    assert not b.timer(11.0)
    assert b.timer(12.0) and b.phase is Phase.PROBING and b.flow is Flow.PROBE
    # A message received before the probe began does not decide.
    assert not b.success(received_at=9.0, now=12.1)
    assert not b.failure(received_at=9.0, now=12.1)
    assert b.success(received_at=12.05, now=12.1)
    assert b.phase is Phase.OPEN and b.level == 0 and b.deadline is None


def test_an_early_timer_keeps_the_deadline() -> None:
    b = machine()
    b.failure(0.0, 10.0)
    assert not b.timer(11.9987)  # 1.3 ms early, as uvloop was measured against monotonic
    assert b.phase is Phase.PAUSED and b.deadline == 12.0


def test_failed_probe_raises_the_level_and_the_cap_holds() -> None:
    b = machine()
    now = 0.0
    for _ in range(10):
        b.failure(now, now)
        assert b.deadline is not None
        now = b.deadline
        b.timer(now)
    assert b.level == b.max_level == 4
    assert b.duration(b.level) == 16.0


def test_success_at_a_high_level_keeps_probing_one_message_at_a_time() -> None:
    b = machine()
    b.failure(0.0, 0.0)
    b.timer(2.0)
    b.failure(2.0, 2.0)
    b.timer(6.0)
    assert b.level == 2
    assert not b.success(6.0, 6.1)
    assert b.level == 1 and b.phase is Phase.PROBING and b.since == 6.1
    assert b.success(6.1, 6.2)
    assert b.phase is Phase.OPEN


def test_a_quiet_probe_window_opens_the_flow() -> None:
    b = machine()
    b.failure(0.0, 0.0)
    b.timer(2.0)
    assert b.deadline == 2.0 + PROBE_QUIET
    assert not b.timer(2.0 + PROBE_QUIET, probe_running=True)  # its outcome will decide
    assert b.phase is Phase.PROBING and b.deadline == 2.0 + 2 * PROBE_QUIET
    assert b.timer(2.0 + 2 * PROBE_QUIET)
    assert b.phase is Phase.OPEN and b.level == 0


def test_a_stall_reopens_and_is_counted() -> None:
    b = machine()
    b.failure(0.0, 0.0)
    assert not b.stalled(2.0 + b.margin - 0.1)
    assert b.stalled(2.0 + b.margin)
    assert b.phase is Phase.OPEN and b.stalls == 1 and b.level == 0


def test_stop_is_final() -> None:
    b = machine()
    b.failure(0.0, 0.0)
    assert b.stop(1.0) and b.phase is Phase.STOPPED and b.flow is Flow.PAUSED
    assert b.deadline is None
    assert not b.failure(1.0, 1.1) and not b.success(1.0, 1.1) and not b.timer(99.0)
    assert not b.stalled(999.0) and b.phase is Phase.STOPPED


def test_zero_multiplier_turns_backoff_off() -> None:
    b = Backoff(multiplier=0.0, max_duration=120.0)
    assert not b.enabled
    assert not b.failure(0.0, 0.0)
    assert b.phase is Phase.OPEN


def test_a_move_outside_the_table_is_refused() -> None:
    assert (Phase.OPEN, Event.TIMER) not in TRANSITIONS
    with pytest.raises(AssertionError, match="may not move"):
        check_move(Phase.OPEN, Event.TIMER, Phase.PROBING)
    check_move(Phase.OPEN, Event.TIMER, Phase.OPEN)  # staying put is always allowed


# --- a simulated consumer on a virtual clock ----------------------------------------


@dataclass(order=True)
class _Due:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Msg:
    received_at: float
    done_at: float
    outcome: str  # "ok", "fail" or "give_up" (a dead letter: no backoff signal)


class Sim:
    """A consumer, its transport and a loop whose timers fire up to 1.5 ms early."""

    def __init__(self, rng: random.Random, window: int, backlog: int, cutoff: float) -> None:
        self.rng = rng
        self.now = 0.0
        self.window = window
        self.backlog = backlog
        self.cutoff = cutoff  # no failure is decided after this time
        self.seq = itertools.count()
        self.timers: list[_Due] = []
        self.running: list[Msg] = []
        self.on_wire = 0  # sent before a pause, still arriving
        self.last_failure = 0.0
        self.opened_at: float | None = None
        self.b = Backoff(
            multiplier=rng.choice([0.05, 0.2, 1.0]),
            max_duration=rng.choice([0.5, 4.0, 16.0]),
            rand=rng.random,
        )
        self.alarm = Alarm(self.call_later, lambda: self.now, self.on_timer)

    # the loop
    def call_later(self, delay: float, callback: Callable[[], None]) -> _Due:
        early = self.rng.choice([0.0, 0.0, 0.0005, 0.0013, 0.0015])
        due = _Due(max(self.now + delay - early, self.now + 1e-6), next(self.seq), callback)
        heapq.heappush(self.timers, due)
        return due

    # the Dispatcher's reactions
    def on_timer(self) -> None:
        self.b.timer(self.now, self.probe_running())
        self.alarm.set(self.b.deadline)

    def probe_running(self) -> bool:
        return self.b.phase is Phase.PROBING and any(
            m.received_at >= self.b.since for m in self.running
        )

    def settle(self, msg: Msg) -> None:
        self.running.remove(msg)
        if msg.outcome == "fail":
            self.last_failure = self.now
            self.b.failure(msg.received_at, self.now)
        elif msg.outcome == "ok":
            self.b.success(msg.received_at, self.now)
        self.alarm.set(self.b.deadline)

    # the transport
    def deliver(self) -> None:
        flow = self.b.flow
        limit = {Flow.OPEN: self.window, Flow.PROBE: 1, Flow.PAUSED: 0}[flow]
        if flow is Flow.PAUSED and self.on_wire:
            limit = len(self.running) + self.on_wire  # already on the wire: arrives anyway
            self.on_wire = 0
        while self.backlog and len(self.running) < limit:
            self.backlog -= 1
            took = self.rng.choice([0.002, 0.05, 0.2, 1.5])
            failing = self.now < self.cutoff
            outcome = self.rng.choice(["ok", "fail", "fail", "give_up"]) if failing else "ok"
            self.running.append(Msg(self.now, self.now + took, outcome))
        if flow is Flow.OPEN:
            self.on_wire = self.rng.randint(0, 3)

    def check(self) -> None:
        # No timer lost: a deadline always has its timer.
        if self.b.deadline is not None:
            assert self.alarm.armed and self.alarm.due == self.b.deadline
        # Never more than one probe outstanding.
        if self.b.phase is Phase.PROBING:
            assert sum(m.received_at >= self.b.since for m in self.running) <= 1
        if self.b.phase is Phase.OPEN and self.opened_at is None and self.now >= self.cutoff:
            self.opened_at = self.now

    def run(self, until: float) -> None:
        while True:
            self.deliver()
            self.check()
            while self.timers and self.timers[0].cancelled:
                heapq.heappop(self.timers)
            nexts = [m.done_at for m in self.running]
            if self.timers:
                nexts.append(self.timers[0].when)
            if not nexts or min(nexts) > until:
                return
            self.now = min(nexts)
            if self.timers and self.timers[0].when == self.now:
                heapq.heappop(self.timers).callback()
            else:
                self.settle(next(m for m in self.running if m.done_at == self.now))


@settings(max_examples=200, deadline=None)
@given(
    st.randoms(use_true_random=False),
    st.integers(1, 8),
    st.sampled_from([0, 3, 40, 400]),
    st.floats(0.0, 20.0),
)
def test_after_the_last_failure_the_flow_opens_within_the_bound(
    rng: random.Random, window: int, backlog: int, cutoff: float
) -> None:
    sim = Sim(rng, window, backlog, cutoff)
    slowest = 1.5
    sim.run(until=sim.cutoff + slowest)  # every failing handler has answered
    tail = sim.last_failure
    # The pause (at most max_duration), what was in hand before, one probe per level
    # (each one handler), or a quiet window when nothing is left to probe with.
    bound = tail + sim.b.max_duration + slowest + sim.b.max_level * slowest + PROBE_QUIET + 0.1
    sim.run(until=bound)
    assert sim.b.phase is Phase.OPEN, (sim.b, sim.now, bound, sim.backlog, sim.running)


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_early_timers_never_lose_a_pause(rng: random.Random) -> None:
    sim = Sim(rng, window=4, backlog=400, cutoff=5.0)
    sim.run(until=60.0)
    assert sim.b.phase is Phase.OPEN
    assert sim.b.stalls == 0
