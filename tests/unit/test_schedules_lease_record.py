"""Which lease duration a follower waits (nsqworker/schedules/lease.py): the one in the
record, as client-go's leader election does, unless that one is not sane; on one
compare-and-set store and a simulated clock. tests/integration/test_schedules_lease_kube.py
shows the same on a real kube-apiserver."""

from __future__ import annotations

import asyncio
import math

from nsqworker.schedules.lease import Elector, LeaseRecord, LocalStore, Timings

OWN = Timings(lease_duration=2.0, renew_deadline=1.0, retry_period=0.25)


def takeover_after(recorded: float) -> float:
    """Seconds a follower with a 2 s lease waits before it takes over a record whose
    holder wrote ``recorded`` and never renews it (polling every 0.25 s)."""
    now = [0.0]
    store = LocalStore()
    follower = Elector(store, "follower", OWN, clock=lambda: now[0])

    async def go() -> float:
        await store.create(LeaseRecord(holder="holder", lease_duration=recorded))
        while not await follower.try_lead():
            assert now[0] < 7200, "never taken over"
            now[0] += OWN.retry_period
        return now[0]

    return asyncio.run(go())


def test_a_follower_waits_the_records_duration_unless_it_is_absurd() -> None:
    assert takeover_after(6.0) == 6.0  # the holder's, longer than the follower's own
    assert takeover_after(1.0) == 1.0  # and shorter: the holder renews within it
    # Not sane (not written by a worker's settings): the follower's own 2 s.
    for absurd in (0.0, -5.0, math.inf, math.nan, 1e9):
        assert takeover_after(absurd) == OWN.lease_duration, absurd
