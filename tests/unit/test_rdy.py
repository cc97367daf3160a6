"""The RDY planner as a pure function: spreading, budget, settle, rotation."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqworker.nsq.rdy import IDLE_AFTER, RDY_SETTLE, ROTATE_AFTER, Mode, Slot, plan, released


def slots(n: int, max_rdy: int = 2500) -> list[Slot]:
    return [Slot(key=f"nsqd{i}", max_rdy=max_rdy) for i in range(n)]


def committed(all_slots: list[Slot], now: float) -> int:
    return sum(s.committed(now) for s in all_slots)


def test_spreads_max_in_flight_evenly() -> None:
    s = slots(3)
    plan(s, 100, now=0.0)
    assert sorted(x.rdy for x in s) == [33, 33, 34]


def test_replan_with_nothing_changed_sends_nothing() -> None:
    s = slots(3)
    plan(s, 100, now=0.0)
    assert plan(s, 100, now=1.0) == []


def test_respects_each_servers_max_rdy_count() -> None:
    s = slots(2, max_rdy=10)
    plan(s, 100, now=0.0)
    assert [x.rdy for x in s] == [10, 10]


def test_a_new_connection_waits_for_lowered_windows_to_settle() -> None:
    s = slots(1)
    plan(s, 10, now=0.0)
    assert s[0].rdy == 10
    s.append(Slot(key="new"))
    changes = plan(s, 10, now=1.0)
    # The old connection is lowered at once, but nsqd may already have sent up to 10:
    # the newcomer gets nothing until the settle time has passed.
    assert (s[0], 5) in changes
    assert s[1].rdy == 0
    assert committed(s, 1.0) <= 10
    plan(s, 10, now=1.0 + RDY_SETTLE + 0.01)
    assert [x.rdy for x in s] == [5, 5]


def test_lowering_a_full_window_needs_no_settle_time() -> None:
    s = slots(1)
    plan(s, 4, now=0.0)
    s[0].in_flight = 4  # everything the window allowed is in our hands
    s.append(Slot(key="new"))
    plan(s, 4, now=1.0)
    # Nothing can be on the wire, but the 4 unfinished messages still count.
    assert s[1].rdy == 0
    s[0].in_flight = 2
    plan(s, 4, now=1.0)
    assert s[1].rdy == 2


def test_a_fin_above_the_window_frees_capacity_only_after_nsqd_has_read_it() -> None:
    # nsqd counts a message in flight until it reads the FIN; an RDY sent to another
    # nsqd at once could be served first and put max_in_flight + 1 in flight.
    s = slots(1)
    plan(s, 4, now=0.0)
    s[0].in_flight = 4
    s.append(Slot(key="new"))
    plan(s, 4, now=1.0)
    for k in range(2):
        s[0].in_flight -= 1
        released(s[0], now=1.0 + k * 0.01)
        plan(s, 4, now=1.0 + k * 0.01)
        assert s[1].rdy == 0
    assert committed(s, 1.01) == 4
    plan(s, 4, now=1.01 + RDY_SETTLE)
    assert s[1].rdy == 2
    # Within its window a FIN holds nothing back.
    s[0].in_flight -= 1
    released(s[0], now=2.0)
    assert s[0].committed(2.0) == 2


def test_paused_sets_every_window_to_zero() -> None:
    s = slots(3)
    plan(s, 9, now=0.0)
    plan(s, 9, now=1.0, mode=Mode.PAUSED)
    assert [x.rdy for x in s] == [0, 0, 0]


def test_probing_opens_exactly_one_window_of_one() -> None:
    s = slots(3)
    plan(s, 9, now=0.0)
    plan(s, 9, now=1.0, mode=Mode.PAUSED)
    plan(s, 9, now=5.0, mode=Mode.PROBING)
    assert sorted(x.rdy for x in s) == [0, 0, 1]


def test_retiring_connection_gets_zero_and_others_take_its_share() -> None:
    s = slots(2)
    plan(s, 10, now=0.0)
    s[1].retiring = True
    plan(s, 10, now=1.0)
    plan(s, 10, now=1.0 + RDY_SETTLE + 0.01)
    assert [x.rdy for x in s] == [10, 0]


def test_rotation_gives_the_turn_to_the_least_recently_served() -> None:
    s = slots(4)
    served: list[str] = []
    now = 0.0
    for _ in range(200):
        plan(s, 1, now)
        for x in s:
            if x.rdy and (not served or served[-1] != x.key):
                served.append(str(x.key))
        now += 0.05
    # Idle connections rotate every IDLE_AFTER (+ settle): all four, in a cycle.
    assert set(served) == {"nsqd0", "nsqd1", "nsqd2", "nsqd3"}
    assert served[:8] == served[:4] * 2


def simulate(n: int, mif: int, seed: int, steps: int = 600, dt: float = 0.05) -> None:
    rng = random.Random(seed)
    s = slots(n, max_rdy=rng.choice([1, 3, 2500]))
    running: list[tuple[Slot, float]] = []
    last_turn = {x.key: 0.0 for x in s}
    # The most connections that shared the window since each one's last turn: a wait
    # that built up among four is not bounded by the two that are left.
    crowd = {x.key: len(s) for x in s}
    now = 0.0
    for _ in range(steps):
        # Messages finish...
        done = [(x, t) for x, t in running if t <= now]
        for x, _t in done:
            x.in_flight -= 1
            running.remove((x, _t))
        # ...connections come and go...
        if rng.random() < 0.02 and len(s) > 1:
            gone = s.pop(rng.randrange(len(s)))
            running = [(x, t) for x, t in running if x is not gone]
        if rng.random() < 0.02:
            fresh = Slot(key=f"late{now}", max_rdy=s[0].max_rdy if s else 2500)
            s.append(fresh)
            last_turn[fresh.key] = now
            crowd[fresh.key] = len(s)
        plan(s, mif, now)
        assert sum(x.rdy for x in s) <= mif
        assert committed(s, now) <= mif
        # ...and nsqd sends while in flight is below the window.
        for x in s:
            while x.in_flight < x.rdy and rng.random() < 0.7:
                x.in_flight += 1
                x.last_message = now
                running.append((x, now + rng.choice([0.0, 0.01, 0.2, 1.5])))
            crowd[x.key] = max(crowd[x.key], len(s))
            if x.rdy > 0:
                last_turn[x.key] = now
                crowd[x.key] = len(s)
        assert committed(s, now) <= mif
        for x in s:
            if crowd[x.key] > mif:
                # Every connection gets a turn within a bounded number of rotations: whole
                # ones (a turn is not shared), hence the ceiling (11 among 10 wait 2, not
                # 1.1), and up to two steps of the simulated clock.
                rotation = ROTATE_AFTER + RDY_SETTLE + 1.5 + 2 * dt
                bound = (math.ceil(crowd[x.key] / mif) + 1) * rotation + IDLE_AFTER + 2 * dt
                assert now - last_turn[x.key] <= bound + 1e-9, (x.key, now, last_turn[x.key])
        now += dt


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 8), mif=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_invariants_hold_under_random_traffic(n: int, mif: int, seed: int) -> None:
    simulate(n, mif, seed)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 10), seed=st.integers(0, 10_000))
def test_more_connections_than_max_in_flight_all_get_turns(n: int, seed: int) -> None:
    simulate(n, 1, seed, steps=800)


def test_a_standby_lane_gets_no_rdy_and_hands_its_window_over_at_once() -> None:
    fast, bulk = Slot(key="fast"), Slot(key="bulk", standby=True)
    plan([fast, bulk], 100, now=0.0)
    assert (fast.rdy, bulk.rdy) == (100, 0)
    fast.in_flight = 30  # and up to 70 more may be on the wire
    fast.standby, bulk.standby = True, False
    plan([fast, bulk], 100, now=0.01)
    # No settle time: the bulk lane gets all but what the fast lane holds in our hands.
    assert (fast.rdy, bulk.rdy) == (0, 70)
    fast.in_flight = 0
    plan([fast, bulk], 100, now=0.02)
    assert (fast.rdy, bulk.rdy) == (0, 100)


def test_a_lane_pair_counts_as_one_nsqd_in_the_shares() -> None:
    a_fast, a_bulk = Slot(key="a"), Slot(key="a-bulk", standby=True)
    b = Slot(key="b")
    plan([a_fast, a_bulk, b], 100, now=0.0)
    assert (a_fast.rdy, a_bulk.rdy, b.rdy) == (50, 0, 50)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), mif=st.integers(16, 400), seed=st.integers(0, 10_000))
def test_lane_handovers_keep_the_budget_and_settle_on_the_active_lanes(
    n: int, mif: int, seed: int
) -> None:
    rng = random.Random(seed)
    pairs = [(Slot(key=f"fast{i}"), Slot(key=f"bulk{i}", standby=True)) for i in range(n)]
    everything = [slot for pair in pairs for slot in pair]
    now = 0.0
    for _ in range(300):
        for slot in everything:  # nsqd fills windows, we finish some
            slot.in_flight = min(slot.rdy, slot.in_flight + rng.randint(0, 20))
            slot.in_flight -= rng.randint(0, slot.in_flight)
        if rng.random() < 0.1:  # a lane move on one nsqd
            fast, bulk = rng.choice(pairs)
            fast.standby, bulk.standby = bulk.standby, fast.standby
        plan(everything, mif, now)
        assert committed(everything, now) <= mif
        assert all(slot.rdy == 0 for slot in everything if slot.standby)
        now += 0.01
    for slot in everything:  # everything answered: the active lanes share the budget
        slot.in_flight = 0
    plan(everything, mif, now)
    assert sum(slot.rdy for slot in everything if not slot.standby) == mif
