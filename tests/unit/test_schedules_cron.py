"""Cron schedules without I/O: parsing, fire times, DST as Debian's cron, catch-up."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from nsqworker import Registry
from nsqworker.schedules.cron import Schedule, ScheduleError, due, format_tick, parse_tick
from nsqworker.task import TaskDefinitionError

BERLIN = ZoneInfo("Europe/Berlin")


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def local(ticks: list[datetime]) -> list[str]:
    return [t.astimezone(BERLIN).isoformat() for t in ticks]


def test_five_fields_fire_on_the_minute_and_six_on_the_second() -> None:
    assert Schedule.of("*/15 * * * *").upcoming(at(2026, 1, 1, 0, 0, 10)) == [
        at(2026, 1, 1, 0, 15), at(2026, 1, 1, 0, 30), at(2026, 1, 1, 0, 45),
    ]  # fmt: skip
    assert Schedule.of("*/20 * * * * *").upcoming(at(2026, 1, 1, 0, 0, 10, 500)) == [
        at(2026, 1, 1, 0, 0, 20), at(2026, 1, 1, 0, 0, 40), at(2026, 1, 1, 0, 1, 0),
    ]  # fmt: skip


def test_a_list_fires_at_the_union_and_a_shared_second_once() -> None:
    schedule = Schedule.of(["0 6 * * *", "0 18 * * *", "0 6 * * MON-FRI"])
    assert schedule.upcoming(at(2026, 1, 1), 4) == [
        at(2026, 1, 1, 6), at(2026, 1, 1, 18), at(2026, 1, 2, 6), at(2026, 1, 2, 18),
    ]  # fmt: skip


def test_the_time_zone_applies_to_the_fields() -> None:
    schedule = Schedule.of("0 6 * * *", "Europe/Berlin")
    assert schedule.upcoming(at(2026, 1, 1), 1) == [at(2026, 1, 1, 5)]  # CET is UTC+1
    assert schedule.upcoming(at(2026, 7, 1), 1) == [at(2026, 7, 1, 4)]  # CEST is UTC+2
    assert str(schedule) == "0 6 * * * (Europe/Berlin)"


def test_dst_gap_fixed_time_fires_once_right_after_the_jump() -> None:
    # 2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist that day
    ticks = Schedule.of("30 2 * * *", "Europe/Berlin").upcoming(at(2026, 3, 28, 12), 2)
    assert local(ticks) == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_dst_repeat_fixed_time_fires_once() -> None:
    # 2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice, fires at the first
    ticks = Schedule.of("30 2 * * *", "Europe/Berlin").upcoming(at(2026, 10, 24, 12), 2)
    assert local(ticks) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]


def test_dst_wildcard_jobs_follow_elapsed_time() -> None:
    schedule = Schedule.of("*/30 * * * *", "Europe/Berlin")
    spring = list(itertools.islice(schedule.after(at(2026, 3, 29, 0, 10)), 3))
    assert local(spring) == [
        "2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00",
    ]  # fmt: skip
    autumn = list(itertools.islice(schedule.after(at(2026, 10, 24, 23, 50)), 4))
    assert local(autumn) == [
        "2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00", "2026-10-25T02:30:00+01:00",
    ]  # fmt: skip
    assert len(set(map(format_tick, autumn))) == 4  # distinct scheduled_for in UTC


@pytest.mark.parametrize(
    ("schedule", "timezone", "problem"),
    [
        ("61 * * * *", None, "'61 * * * *' is not a valid cron expression: bad minute"),
        ("* * * *", None, "has 4 fields; write 5"),
        ("* * * * * * *", None, "has 7 fields"),
        ("0 0 30 2 *", None, "'0 0 30 2 *' is not a valid cron expression"),
        ("", None, "is not a cron expression"),
        (42, None, "must be a cron expression or a list"),
        ([], None, "at least one cron expression"),
        ("0 6 * * *", "Mars/Olympus", "'Mars/Olympus' is not an IANA time zone name"),
    ],
)
def test_bad_schedules_say_what_is_wrong(
    schedule: object, timezone: str | None, problem: str
) -> None:
    with pytest.raises(ScheduleError, match=problem.replace("*", r"\*")):
        Schedule.of(schedule, timezone)  # type: ignore[arg-type]


def test_task_refuses_a_bad_schedule_at_import_naming_the_task() -> None:
    registry = Registry()
    with pytest.raises(TaskDefinitionError) as caught:

        @registry.task("reports", channel="r", schedule="0 25 * * *", name="daily")
        async def daily(msg: object) -> None: ...

    assert str(caught.value) == (
        "@task('reports', channel='r'), task 'daily': schedule '0 25 * * *' is not a valid "
        "cron expression: bad hour"
    )
    with pytest.raises(TaskDefinitionError, match="timezone='Europe/Paris' needs schedule"):
        registry.task("reports", channel="r", timezone="Europe/Paris")
    assert "daily" not in registry


def test_task_keeps_the_schedule() -> None:
    registry = Registry()

    @registry.task("reports", channel="r", schedule=["0 6 * * *"], timezone="Europe/Berlin")
    async def daily(msg: object) -> None: ...

    spec = registry.get(daily.spec.name)
    assert spec is not None and spec.schedule == Schedule(("0 6 * * *",), "Europe/Berlin")


def test_due_fires_what_was_missed_within_the_catchup_and_skips_older() -> None:
    every_second = Schedule.of("* * * * * *")
    found = due(every_second, at(2026, 1, 1, 0, 0, 0), at(2026, 1, 1, 0, 0, 5, 300), 3600)
    assert found.ticks == [at(2026, 1, 1, 0, 0, s) for s in range(1, 6)] and not found.skipped
    found = due(every_second, at(2026, 1, 1, 0, 0, 0), at(2026, 1, 1, 0, 0, 10), 3)
    assert found.ticks == [at(2026, 1, 1, 0, 0, s) for s in range(7, 11)]
    assert (found.skipped, found.first_skipped, found.last_skipped) == (
        6, at(2026, 1, 1, 0, 0, 1), at(2026, 1, 1, 0, 0, 6),
    )  # fmt: skip


def test_no_catchup_still_fires_a_tick_found_a_little_late() -> None:
    every_second = Schedule.of("* * * * * *")
    last = at(2026, 1, 1, 0, 0, 0)
    found = due(every_second, last, at(2026, 1, 1, 0, 0, 1, 3000), 0)
    assert found.ticks == [at(2026, 1, 1, 0, 0, 1)] and not found.skipped
    found = due(every_second, last, at(2026, 1, 1, 0, 0, 9, 3000), 0)
    assert found.ticks == [at(2026, 1, 1, 0, 0, 9)] and found.skipped == 8


def test_due_after_a_clock_step_back_fires_nothing_twice() -> None:
    every_second = Schedule.of("* * * * * *")
    last = at(2026, 1, 1, 0, 0, 30)
    assert due(every_second, last, last - timedelta(seconds=20), 3600).ticks == []
    assert due(every_second, last, last + timedelta(seconds=1), 3600).ticks == [
        last + timedelta(seconds=1)
    ]


def test_scheduled_for_is_iso_utc_to_the_second() -> None:
    tick = datetime(2026, 3, 29, 3, 0, tzinfo=BERLIN)
    assert format_tick(tick) == "2026-03-29T01:00:00Z"
    assert parse_tick("2026-03-29T01:00:00Z") == at(2026, 3, 29, 1)
