"""Cron schedules, pure: parse, check, and compute fire times. No I/O, no clock.

A :class:`Schedule` is one or more cron expressions and an IANA time zone. Each
expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds
first); names (``MON``, ``JAN``), ranges, lists, steps, ``L``, ``W`` and ``#`` work as in
Debian's cron, whose rules `cronsim <https://github.com/cuu508/cronsim>`_ follows,
including daylight saving time for 5-field expressions:

* a job at a fixed time (no ``*`` in its minute and hour fields) that falls in a gap
  (spring forward) fires once, right after the jump; one in a repeated hour (fall back)
  fires once, at the first occurrence;
* a job with ``*`` in its minute or hour field (and every 6-field expression) follows
  the clock as it elapses: no ticks for the wall-clock times the gap skips, and ticks
  again for those the repeated hour shows twice (distinct instants, so distinct
  ``scheduled_for`` values in UTC).

Fire times are UTC datetimes with whole seconds. The firing loop
(:mod:`nsqworker.schedules.firing`) asks :func:`due` which ticks to fire now.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Due", "Schedule", "ScheduleError", "due", "format_tick", "parse_tick"]

#: Fire times computed per call of :func:`due` at most, per schedule (a guard: the
#: catch-up window bounds the count, 3600 for a per-second schedule and an hour).
MAX_TICKS = 100_000
#: Seconds late a tick may be found and still count as on time, not caught up: the
#: firing loop wakes a little after each tick, so with ``schedule_catchup`` 0 (no
#: catch-up) a tick found a few milliseconds late still fires.
ON_TIME = 1.0


class ScheduleError(ValueError):
    """Raised when a cron expression or time zone is not valid; says what to write."""


def _zone(name: str) -> ZoneInfo | None:
    """The zone called ``name``; None for UTC (cronsim treats UTC as having no DST)."""
    if name.upper() in ("UTC", "ETC/UTC", "Z"):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"timezone {name!r} is not an IANA time zone name; write one like "
            "'Europe/Berlin' or 'America/New_York' (default 'UTC')"
        ) from None


def _check_expression(expression: object) -> str:
    from cronsim import CronSim, CronSimError

    if not isinstance(expression, str) or not expression.strip():
        raise ScheduleError(f"schedule {expression!r} is not a cron expression (a string)")
    text = " ".join(expression.split())
    fields = len(text.split())
    if fields not in (5, 6):
        raise ScheduleError(
            f"schedule {expression!r} has {fields} field{'s' * (fields != 1)}; write 5 "
            "(minute hour day month weekday, like '0 6 * * *') or 6 with seconds first "
            "(like '*/10 * * * * *')"
        )
    start = datetime(2000, 1, 1, tzinfo=UTC)
    try:
        next(iter(CronSim(text, start)))
    except CronSimError as exc:
        reason = str(exc).lower() or "not understood"
        problem = f"schedule {expression!r} is not a valid cron expression: {reason}"
        raise ScheduleError(problem) from None
    except StopIteration:
        raise ScheduleError(f"schedule {expression!r} never fires") from None
    return text


@dataclass(frozen=True)
class Schedule:
    """When a task fires: cron ``expressions`` (any of them) in ``timezone``.

    Raises:
        ScheduleError: an expression or the time zone is not valid (the message names
            it and says what to write).
    """

    expressions: tuple[str, ...]
    timezone: str = "UTC"
    _zone: ZoneInfo | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expressions, tuple) or not self.expressions:
            raise ScheduleError("a schedule needs at least one cron expression")
        checked = tuple(_check_expression(e) for e in self.expressions)
        object.__setattr__(self, "expressions", checked)
        if not isinstance(self.timezone, str):
            raise ScheduleError(f"timezone must be an IANA name (a string), got {self.timezone!r}")
        object.__setattr__(self, "_zone", _zone(self.timezone))

    @classmethod
    def of(cls, schedule: str | Sequence[str], timezone: str | None = None) -> Schedule:
        """A schedule from ``@task``'s ``schedule=`` (one expression or a list)."""
        if isinstance(schedule, str):
            expressions: tuple[str, ...] = (schedule,)
        elif isinstance(schedule, list | tuple):
            expressions = tuple(schedule)
        else:
            raise ScheduleError(
                f"schedule must be a cron expression or a list of them, got {schedule!r}"
            )
        return cls(expressions, "UTC" if timezone is None else timezone)

    def __str__(self) -> str:
        shown = " | ".join(self.expressions)
        return shown if self.timezone.upper() == "UTC" else f"{shown} ({self.timezone})"

    def after(self, moment: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``moment`` (aware), ascending, as UTC whole seconds."""
        from cronsim import CronSim

        start = moment.astimezone(self._zone or UTC).replace(microsecond=0)
        iterators = [iter(CronSim(e, start)) for e in self.expressions]
        heads: list[datetime | None] = [_next_utc(it) for it in iterators]
        last: datetime | None = None
        while True:
            live = [h for h in heads if h is not None]
            if not live:
                return
            tick = min(live)
            for i, head in enumerate(heads):
                if head == tick:
                    heads[i] = _next_utc(iterators[i])
            if last is None or tick > last:  # two expressions on one second fire once
                last = tick
                yield tick

    def upcoming(self, now: datetime, count: int = 3) -> list[datetime]:
        """The next ``count`` fire times after ``now``."""
        ticks = self.after(now)
        return [tick for _, tick in zip(range(count), ticks, strict=False)]


def _next_utc(iterator: Iterator[datetime]) -> datetime | None:
    try:
        return next(iterator).astimezone(UTC)
    except StopIteration:
        return None


@dataclass(frozen=True)
class Due:
    """What :func:`due` found: the ticks to fire now, and those too old to."""

    ticks: list[datetime]
    """Fire times in ``(last, now]`` within the catch-up window, ascending."""
    skipped: int = 0
    """Fire times in ``(last, now - catchup)``: missed too long ago, not fired."""
    first_skipped: datetime | None = None
    last_skipped: datetime | None = None


def due(schedule: Schedule, last: datetime, now: datetime, catchup: float) -> Due:
    """The ticks of ``schedule`` to fire at ``now`` when ``last`` was the last one fired.

    Ticks after ``last`` and at or before ``now`` are due; those more than ``catchup``
    seconds before ``now`` (and more than :data:`ON_TIME`) are counted as skipped
    instead. A clock stepped back (``now`` before ``last``) makes nothing due until it
    passes ``last`` again: a tick is never fired twice by the same record.
    """
    if now <= last:
        return Due([])
    oldest = now - timedelta(seconds=max(catchup, ON_TIME))
    ticks: list[datetime] = []
    skipped, first_skipped, last_skipped = 0, None, None
    if last < oldest - timedelta(seconds=1):
        # jump over the window nobody fires, counting it without listing every tick
        for tick in schedule.after(last):
            if tick >= oldest or skipped >= MAX_TICKS:
                break
            skipped += 1
            first_skipped = first_skipped or tick
            last_skipped = tick
        last = max(last, oldest - timedelta(microseconds=1))
    for tick in schedule.after(last):
        if tick > now or len(ticks) >= MAX_TICKS:
            break
        if tick < oldest:
            skipped += 1
            first_skipped = first_skipped or tick
            last_skipped = tick
            continue
        ticks.append(tick)
    return Due(ticks, skipped, first_skipped, last_skipped)


def format_tick(tick: datetime) -> str:
    """``2026-11-26T07:45:00Z``: a fire time as ``scheduled_for`` carries it."""
    return tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_tick(text: str) -> datetime:
    """The UTC datetime of a :func:`format_tick` string."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
