"""Retry and reconnect delays (consumer backoff: test_backoff_machine.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nsqworker.policy import retry_delay
from nsqworker.reconnect import reconnect_delay


def test_requeue_delay_grows_exponentially_and_is_capped() -> None:
    def mid(attempts: int) -> float:
        return retry_delay(attempts, 1.0, 2.0, 60.0, rand=lambda: 0.5)

    assert [mid(a) for a in range(1, 8)] == [1, 2, 4, 8, 16, 32, 60]


def test_requeue_delay_never_exceeds_nsqds_max_req_timeout() -> None:
    assert retry_delay(100, 90.0, 3.0, 1e9, rand=lambda: 1.0) == 3600.0


@given(st.integers(1, 10_000), st.floats(0, 100), st.floats(1, 10), st.floats(0, 3600))
def test_requeue_delay_jitter_stays_within_ten_percent(
    attempts: int, base: float, mult: float, cap: float
) -> None:
    low = retry_delay(attempts, base, mult, cap, rand=lambda: 0.0)
    high = retry_delay(attempts, base, mult, cap, rand=lambda: 1.0)
    mid = retry_delay(attempts, base, mult, cap, rand=lambda: 0.5)
    assert 0 <= low <= mid <= high <= min(cap, 3600)
    assert low >= min(mid * 0.9 - 1e-9, cap)


def test_reconnect_delay_is_exponential_with_equal_jitter() -> None:
    assert reconnect_delay(1, 1.0, 60.0, rand=lambda: 0.0) == 0.5
    assert reconnect_delay(1, 1.0, 60.0, rand=lambda: 1.0) == 1.0
    assert reconnect_delay(4, 1.0, 60.0, rand=lambda: 1.0) == 8.0
    assert reconnect_delay(40, 1.0, 60.0, rand=lambda: 1.0) == 60.0
