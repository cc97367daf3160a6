"""The firing loop: while this candidate leads, publish each due tick, then record it.

Per tick (all tasks due at the same second together):

1. check the lease is still ours (:attr:`Elector.leading`, the renew deadline);
2. publish one message per task, ``{"task": ..., "scheduled_for": ...}``, to its topic;
3. record the tick in the lease with the version check, which renews the lease too.

A crash between 2 and 3 leaves the tick unrecorded, so the next leader publishes it
again with the same ``scheduled_for`` (JetStream's ``Nats-Msg-Id`` drops that copy).
A publish that fails is retried at the next turn, so ticks stay in order and none is
recorded unpublished. A new leader resumes after the last recorded tick of each task,
firing what the old one missed within ``schedule_catchup`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from nsqworker.logging import get_logger
from nsqworker.schedules.cron import Schedule, due, format_tick, parse_tick
from nsqworker.schedules.lease import Elector, LeaseDenied

__all__ = ["Publish", "Scheduled", "Scheduler", "tick_body", "tick_id"]

log = get_logger("nsqworker.schedules")

#: Longest sleep between turns when nothing is due, in seconds.
MAX_SLEEP = 1.0
#: Seconds before a tick whose publish failed is tried again.
PUBLISH_RETRY = 0.5


@dataclass(frozen=True)
class Scheduled:
    """One task with a schedule, as the loop fires it."""

    name: str
    topic: str
    schedule: Schedule


Publish = Callable[[Scheduled, datetime], Awaitable[None]]
"""``publish(task, tick)``: send the tick's message through the task's transport."""


def tick_body(task: str, tick: datetime) -> bytes:
    """The message of one tick: ``{"task": ..., "scheduled_for": "...Z"}``."""
    return json.dumps({"task": task, "scheduled_for": format_tick(tick)}).encode()


def tick_id(task: str, tick: datetime) -> str:
    """The broker-side deduplication id of a tick: ``<task>@<scheduled_for>``."""
    return f"{task}@{format_tick(tick)}"


class Scheduler:
    """Fires ``tasks`` while ``elector`` leads; :meth:`run` until ``stop`` is set."""

    def __init__(
        self,
        tasks: Iterable[Scheduled],
        elector: Elector,
        publish: Publish,
        *,
        catchup: float,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tasks = list(tasks)
        self.elector = elector
        self.publish = publish
        self.catchup = catchup
        self._wall = wall
        self._clock = clock
        self._last: dict[str, datetime] = {}
        self._was_leading = False
        self.denied: str | None = None
        """Why the lease may not be used (RBAC), once that was found; nothing fires."""
        self.fired = 0
        self.fired_by_task: dict[str, int] = {t.name: 0 for t in self.tasks}
        """Ticks this candidate published, per task (for /metrics)."""
        self.skipped_by_task: dict[str, int] = {t.name: 0 for t in self.tasks}
        """Ticks this candidate skipped as older than the catch-up window, per task."""
        self._pause_until = float("-inf")  # after a failed publish

    async def run(self, stop: asyncio.Event) -> None:
        """Lead or follow until ``stop``; release the lease on the way out."""
        try:
            while not stop.is_set():
                try:
                    await self.turn()
                except Exception:  # a bug or a surprise: log it, keep campaigning
                    log.exception("schedule turn failed; trying again")
                    self._pause_until = self._clock() + self.elector.timings.retry_period
                with_timeout = self._sleep()
                try:
                    await asyncio.wait_for(stop.wait(), with_timeout)
                except TimeoutError:
                    pass
        finally:
            await self.elector.release()

    async def turn(self) -> None:
        """Renew or try to lead when due, then fire what is due while leading."""
        try:
            await self._turn()
        except LeaseDenied as exc:
            if self.denied != str(exc):
                log.error(f"schedules will not fire: {exc}")
            self.denied = str(exc)

    async def _turn(self) -> None:
        if self._clock() >= self.elector.renew_due:
            await self.elector.try_lead()
            self.denied = None
        leading = self.elector.leading
        if leading and not self._was_leading:
            await self._begin()
        elif not leading and self._was_leading:
            log.info("schedules: no longer leading; another candidate fires")
        self._was_leading = leading
        if leading and self._clock() >= self._pause_until:
            await self._fire_due()

    async def _begin(self) -> None:
        """Just became leader: resume each task after its recorded tick."""
        now = self._wall().replace(microsecond=0)
        fired = self.elector.fired
        self._last = {}
        start: dict[str, str] = {}
        for task in self.tasks:
            recorded = fired.get(task.name)
            try:
                self._last[task.name] = parse_tick(recorded) if recorded else now
            except ValueError:
                self._last[task.name] = now
            if not recorded:
                start[task.name] = format_tick(now)
        if start:  # where a new task starts counting, so that a takeover misses nothing
            try:
                await self.elector.record(start)
            except LeaseDenied:
                raise
            except Exception as exc:  # kept by the elector, written with its next write
                log.warning(f"could not record where schedules start: {exc}")
        shown = ", ".join(f"{t.name} after {format_tick(self._last[t.name])}" for t in self.tasks)
        log.info(f"schedules: leading ({self.elector.store.description}); firing {shown}")

    async def _fire_due(self) -> None:
        if self.elector.pending and not await self._record({}):
            return  # one tick at most is ever published and not recorded
        now = self._wall()
        by_tick: dict[datetime, list[Scheduled]] = {}
        for task in self.tasks:
            found = due(task.schedule, self._last[task.name], now, self.catchup)
            if found.skipped:
                assert found.first_skipped is not None and found.last_skipped is not None
                log.warning(
                    f"schedule of {task.name}: skipped {found.skipped} tick(s) from "
                    f"{format_tick(found.first_skipped)} to {format_tick(found.last_skipped)}, "
                    f"older than schedule_catchup ({self.catchup:g} s)"
                )
                self._last[task.name] = found.last_skipped
                self.skipped_by_task[task.name] += found.skipped
                if not found.ticks and not await self.elector.record(
                    {task.name: format_tick(found.last_skipped)}
                ):
                    return
            for tick in found.ticks:
                by_tick.setdefault(tick, []).append(task)
        for tick in sorted(by_tick):
            if not self.elector.leading:
                return
            tasks = by_tick[tick]
            try:
                for task in tasks:
                    await self.publish(task, tick)
            except Exception as exc:
                log.warning(f"schedule tick {format_tick(tick)} not published, retrying: {exc}")
                self._pause_until = self._clock() + PUBLISH_RETRY
                return
            for task in tasks:
                self._last[task.name] = tick
                self.fired_by_task[task.name] += 1
            self.fired += len(tasks)
            if not await self._record({t.name: format_tick(tick) for t in tasks}):
                return  # published, not recorded: the next leader fires it again

    async def _record(self, fired: dict[str, str]) -> bool:
        """Record ``fired`` with the lease; False when that failed (retried later, or
        another candidate leads now)."""
        try:
            return await self.elector.record(fired)
        except LeaseDenied:
            raise
        except Exception as exc:  # kept by the elector, written with its next write
            shown = ", ".join(f"{task} {tick}" for task, tick in fired.items()) or "ticks"
            log.warning(f"schedule {shown} fired, not yet recorded: {exc}")
            self._pause_until = self._clock() + PUBLISH_RETRY
            return False

    def last_fired(self) -> dict[str, datetime]:
        """The last tick fired (or skipped) per task, as this candidate knows it."""
        return dict(self._last)

    def _sleep(self) -> float:
        """Seconds until the next tick or renewal, at most :data:`MAX_SLEEP`."""
        until = self.elector.renew_due - self._clock()
        if self._pause_until > self._clock():
            until = min(until, self._pause_until - self._clock())
        elif self.elector.leading and self._last:
            now = self._wall()
            for task in self.tasks:
                last = self._last.get(task.name)
                nxt = next(task.schedule.after(last), None) if last is not None else None
                if nxt is not None:
                    until = min(until, (nxt - now).total_seconds() + 0.001)
        return max(0.001, min(until, MAX_SLEEP))
