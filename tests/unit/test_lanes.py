"""The lane meter as a pure function: when an nsqd's RDY moves between its lanes."""

from __future__ import annotations

from nsqworker.nsq.lanes import (
    BULK_WINDOW,
    DOWN_RATE,
    FAST_WINDOW,
    MIN_RDY,
    UP_RATE,
    UP_STREAK,
    LaneMeter,
)


def feed(meter: LaneMeter, now: float, total: int, rate: float, windows: int, rdy: int = 2500):
    """``windows`` windows at ``rate`` bytes/s; returns (now, total, answers)."""
    answers = []
    for _ in range(windows):
        step = BULK_WINDOW if meter.bulk else FAST_WINDOW
        now += step
        total += int(rate * step)
        assert now >= meter.check_at - 1e-9
        answers.append(meter.observe(now, total, rdy))
    return now, total, answers


def test_a_sustained_load_moves_to_the_bulk_lane() -> None:
    meter = LaneMeter(0.0, 0)
    _, _, answers = feed(meter, 0.0, 0, UP_RATE * 1.5, UP_STREAK)
    assert answers == [None] * (UP_STREAK - 1) + [True]


def test_a_trickle_and_a_lone_burst_stay_on_the_fast_lane() -> None:
    meter = LaneMeter(0.0, 0)
    now, total, answers = feed(meter, 0.0, 0, 134_000, 100)  # 1,000 msg/s of 100 B
    assert set(answers) == {None}
    now, total, answers = feed(meter, now, total, UP_RATE * 10, UP_STREAK - 1)  # a burst
    now, total, after = feed(meter, now, total, 134_000, 10)
    assert set(answers + after) == {None}


def test_a_small_rdy_never_moves() -> None:
    meter = LaneMeter(0.0, 0)
    _, _, answers = feed(meter, 0.0, 0, UP_RATE * 10, 10, rdy=MIN_RDY - 1)
    assert set(answers) == {None}


def test_the_bulk_lane_goes_back_when_the_rate_falls_below_a_quarter() -> None:
    meter = LaneMeter(0.0, 0)
    meter.moved(0.0, bulk=True, total_bytes=0)
    now, total, answers = feed(meter, 0.0, 0, DOWN_RATE * 1.2, 5)  # hysteresis: stays
    assert set(answers) == {None}
    now, total, answers = feed(meter, now, total, DOWN_RATE * 0.5, 1)
    assert answers == [False]
    meter.moved(now, bulk=False, total_bytes=1_000_000)
    assert not meter.bulk and meter.check_at == now + FAST_WINDOW
