"""Requeue, reconnect and consumer backoff policies."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nsqworker.nsq.backoff import reconnect_delay
from nsqworker.policy import BackoffPhase, BackoffState, requeue_delay


def test_requeue_delay_grows_exponentially_and_is_capped() -> None:
    def mid(attempts: int) -> float:
        return requeue_delay(attempts, 1.0, 2.0, 60.0, rand=lambda: 0.5)

    assert [mid(a) for a in range(1, 8)] == [1, 2, 4, 8, 16, 32, 60]


def test_requeue_delay_never_exceeds_nsqds_max_req_timeout() -> None:
    assert requeue_delay(100, 90.0, 3.0, 1e9, rand=lambda: 1.0) == 3600.0


@given(st.integers(1, 10_000), st.floats(0, 100), st.floats(1, 10), st.floats(0, 3600))
def test_requeue_delay_jitter_stays_within_ten_percent(
    attempts: int, base: float, mult: float, cap: float
) -> None:
    low = requeue_delay(attempts, base, mult, cap, rand=lambda: 0.0)
    high = requeue_delay(attempts, base, mult, cap, rand=lambda: 1.0)
    mid = requeue_delay(attempts, base, mult, cap, rand=lambda: 0.5)
    assert 0 <= low <= mid <= high <= min(cap, 3600)
    assert low >= min(mid * 0.9 - 1e-9, cap)


def test_reconnect_delay_is_exponential_with_equal_jitter() -> None:
    assert reconnect_delay(1, 1.0, 60.0, rand=lambda: 0.0) == 0.5
    assert reconnect_delay(1, 1.0, 60.0, rand=lambda: 1.0) == 1.0
    assert reconnect_delay(4, 1.0, 60.0, rand=lambda: 1.0) == 8.0
    assert reconnect_delay(40, 1.0, 60.0, rand=lambda: 1.0) == 60.0


def state() -> BackoffState:
    return BackoffState(multiplier=1.0, max_duration=16.0, jitter=0.0)


def test_failure_pauses_for_multiplier_times_two_to_the_level() -> None:
    b = state()
    assert b.on_failure(received_at=0.0, now=10.0)
    assert b.phase is BackoffPhase.PAUSED and b.level == 1
    assert b.resume_at == 12.0


def test_outcomes_during_a_pause_do_not_count() -> None:
    b = state()
    b.on_failure(0.0, 10.0)
    assert not b.on_failure(0.0, 10.1)
    assert not b.on_success(0.0, 10.1)
    assert b.level == 1


def test_after_the_pause_a_probe_decides() -> None:
    b = state()
    b.on_failure(0.0, 10.0)
    assert not b.tick(11.0)
    assert b.tick(12.0) and b.phase is BackoffPhase.PROBING
    # A message received before the probe began does not decide.
    assert not b.on_success(received_at=9.0, now=12.1)
    assert b.on_success(received_at=12.05, now=12.1)
    assert b.phase is BackoffPhase.NORMAL and b.level == 0


def test_failed_probe_raises_the_level_and_the_cap_holds() -> None:
    b = state()
    now = 0.0
    for _ in range(10):
        b.on_failure(now, now)
        now = b.resume_at
        b.tick(now)
    assert b.level == b.max_level == 4
    assert b.duration(b.level) == 16.0


def test_success_at_a_high_level_keeps_probing_one_message_at_a_time() -> None:
    b = state()
    b.on_failure(0.0, 0.0)
    b.tick(b.resume_at)
    b.on_failure(b.resume_at, b.resume_at)
    b.tick(b.resume_at)
    assert b.level == 2
    assert not b.on_success(b.resume_at, b.resume_at + 0.1)
    assert b.level == 1 and b.phase is BackoffPhase.PROBING
    assert b.on_success(b.resume_at + 0.1, b.resume_at + 0.2)
    assert b.phase is BackoffPhase.NORMAL


def test_zero_multiplier_turns_backoff_off() -> None:
    b = BackoffState(multiplier=0.0, max_duration=120.0)
    assert not b.enabled
    assert not b.on_failure(0.0, 0.0)
    assert b.phase is BackoffPhase.NORMAL
