"""Leader election and firing without I/O: three candidates on one compare-and-set
store, a simulated clock, kills and pauses of the leader."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from nsqworker.logging import configure_logging
from nsqworker.schedules.cron import Schedule, format_tick
from nsqworker.schedules.firing import Scheduled, Scheduler, tick_body
from nsqworker.schedules.lease import Conflict, Elector, LeaseRecord, LocalStore, Timings

START = datetime(2026, 1, 1, tzinfo=UTC)
TIMINGS = Timings(lease_duration=6.0, renew_deadline=4.0, retry_period=1.0)
TASK = Scheduled("app.tick", "ticks", Schedule.of("* * * * * *"))


@pytest.fixture(autouse=True)
def logs() -> Iterator[io.StringIO]:
    """The lines these tests log, in a buffer of their own (not a stream another test
    set up and closed)."""
    buffer = io.StringIO()
    configure_logging("info", "json", stream=buffer)
    yield buffer


class Clock:
    """Seconds since START, shared by every candidate (one machine's clock)."""

    def __init__(self) -> None:
        self.now = 0.0

    def mono(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return START + timedelta(seconds=self.now)


class Flaky(LocalStore):
    """A store that fails every call while ``down`` (an API server unreachable)."""

    down = False

    async def get(self) -> tuple[LeaseRecord, str] | None:
        if self.down:
            raise OSError("unreachable")
        return await super().get()

    async def update(self, record: LeaseRecord, version: str) -> str:
        if self.down:
            raise OSError("unreachable")
        return await super().update(record, version)


def candidates(
    store: LocalStore, clock: Clock, count: int = 3
) -> tuple[list[Scheduler], list[tuple[str, str]]]:
    published: list[tuple[str, str]] = []

    def make(index: int) -> Scheduler:
        async def publish(task: Scheduled, tick: datetime) -> None:
            published.append((f"c{index}", format_tick(tick)))

        elector = Elector(store, f"c{index}", TIMINGS, clock=clock.mono, wall=clock.wall)
        return Scheduler([TASK], elector, publish, catchup=3600, wall=clock.wall, clock=clock.mono)

    return [make(i) for i in range(count)], published


def run(schedulers: list[Scheduler], clock: Clock, seconds: float, step: float = 0.25) -> None:
    async def go() -> None:
        end = clock.now + seconds
        while clock.now < end:
            for scheduler in schedulers:
                await scheduler.turn()
            clock.now += step

    asyncio.run(go())


def test_one_leader_fires_each_second_once() -> None:
    clock = Clock()
    schedulers, published = candidates(LocalStore(), clock)
    run(schedulers, clock, 20)
    leaders = {who for who, _ in published}
    assert len(leaders) == 1
    ticks = [tick for _, tick in published]
    assert len(ticks) == len(set(ticks)) >= 19
    assert ticks == sorted(ticks)


def test_a_killed_leader_is_replaced_within_the_lease_and_the_gap_is_fired() -> None:
    clock = Clock()
    store = LocalStore()
    schedulers, published = candidates(store, clock)
    run(schedulers, clock, 10)
    leader = next(s for s in schedulers if s.elector.leading)
    killed_at = clock.now
    rest = [s for s in schedulers if s is not leader]
    run(rest, clock, 15)
    new = next(s for s in rest if s.elector.leading)
    first_new = next(i for i, (who, _) in enumerate(published) if who == new.elector.identity)
    assert new.fired > 0
    ticks = [tick for _, tick in published]
    counts = Counter(ticks)
    assert all(n == 1 for n in counts.values()), counts.most_common(3)
    seconds = sorted(counts)
    expected = [format_tick(START + timedelta(seconds=s)) for s in range(1, int(clock.now) + 1)]
    assert seconds == expected[: len(seconds)] and len(seconds) >= len(expected) - 1
    # takeover within lease_duration (+ a retry period) of the kill, on this clock
    assert published[first_new][1] <= format_tick(
        START + timedelta(seconds=killed_at + TIMINGS.lease_duration + TIMINGS.retry_period)
    )
    record, _ = asyncio.run(store.get()) or (None, None)
    assert record is not None and record.transitions == 1


def test_a_paused_leader_stops_firing_before_another_takes_over() -> None:
    clock = Clock()
    schedulers, published = candidates(LocalStore(), clock)
    run(schedulers, clock, 5)
    leader = next(s for s in schedulers if s.elector.leading)
    rest = [s for s in schedulers if s is not leader]
    run(rest, clock, 12)  # the leader is paused (SIGSTOP): it does not turn
    run(schedulers, clock, 8)  # resumed: it must see its deadline passed
    counts = Counter(tick for _, tick in published)
    assert all(n == 1 for n in counts.values()), counts.most_common(3)
    assert not leader.elector.leading


def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline() -> None:
    clock = Clock()
    store = Flaky()
    schedulers, published = candidates(store, clock, count=1)
    run(schedulers, clock, 5)
    assert schedulers[0].elector.leading
    store.down = True
    fired = len(published)
    run(schedulers, clock, 6)
    assert not schedulers[0].elector.leading
    # ticks are recorded by writes, which fail: nothing is published unrecorded beyond one
    assert len(published) <= fired + 1


def test_a_graceful_release_hands_over_at_once() -> None:
    clock = Clock()
    store = LocalStore()
    schedulers, published = candidates(store, clock)
    run(schedulers, clock, 5)
    leader = next(s for s in schedulers if s.elector.leading)
    asyncio.run(leader.elector.release())
    rest = [s for s in schedulers if s is not leader]
    run(rest, clock, 2)
    assert any(s.elector.leading for s in rest)
    counts = Counter(tick for _, tick in published)
    assert all(n == 1 for n in counts.values())
    assert max(counts) == format_tick(START + timedelta(seconds=int(clock.now - 0.25)))


def test_the_store_refuses_a_stale_version() -> None:
    store = LocalStore()
    version = asyncio.run(store.create(LeaseRecord(holder="a")))
    asyncio.run(store.update(LeaseRecord(holder="b"), version))
    try:
        asyncio.run(store.update(LeaseRecord(holder="c"), version))
    except Conflict:
        pass
    else:
        raise AssertionError("a stale version was accepted")


def test_the_tick_message_is_the_task_and_its_utc_second() -> None:
    assert (
        tick_body("app.tick", START)
        == b'{"task": "app.tick", "scheduled_for": "2026-01-01T00:00:00Z"}'
    )
