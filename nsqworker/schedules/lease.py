"""Leader election on a lease record with compare-and-set, the same on every backend.

A backend (:mod:`.kube`: a Kubernetes Lease; :mod:`.nats_kv`: a JetStream key-value
entry; :class:`LocalStore`: this process alone) is a :class:`LeaseStore`: it reads the
record with its version, creates it, or replaces it only if the version is still the
one read (resourceVersion, KV revision). :class:`Elector` does the rest, as client-go's
leader election does, on the candidate's own monotonic clock (clocks of different
machines are never compared):

* a follower reads the record every ``retry_period``; it takes over when the record has
  no holder, or when neither its holder nor its version changed for the record's
  ``lease_duration`` (the holder's, as client-go reads ``leaseDurationSeconds``) as
  measured here since it first saw that version. So replicas with different timings
  (a deploy changing them) never both fire: the follower waits as long as the holder
  promised, not its own. A record whose duration is not above 0 and at most
  :data:`MAX_RECORD_DURATION` (a record not written by us, or damaged) is waited for
  with the follower's own ``lease_duration``;
* the leader renews every ``retry_period`` (each recorded tick renews too) and fires
  only until ``renew_deadline`` seconds after the start of its last successful renewal:
  a leader that cannot renew stops before any follower may take over, since the
  follower waits ``lease_duration`` from a moment after that renewal began;
* the record also carries the last tick fired per task (``fired``), written with the
  same version check, so a new leader knows exactly where to resume.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final, Protocol

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger

__all__ = [
    "MAX_RECORD_DURATION",
    "Conflict",
    "Elector",
    "LeaseDenied",
    "LeaseRecord",
    "LeaseStore",
    "LocalStore",
    "Timings",
]

log = get_logger("nsqworker.schedules")

MAX_RECORD_DURATION: Final = 3600.0
"""The longest lease duration a follower takes from a record (``schedule_lease_duration``'s
bound): a longer one, like one not above 0, is not sane, and the follower waits its own."""


class Conflict(Exception):
    """Raised by a store when the record changed since it was read (or exists on create)."""


class LeaseDenied(ConfigurationError):
    """Raised by a store when the worker may not read or write the lease (RBAC, ACLs):
    a configuration problem to fix, never retried into firing."""


@dataclass(frozen=True)
class LeaseRecord:
    """The lease as stored: who holds it since when, and the last tick fired per task."""

    holder: str | None = None
    lease_duration: float = 15.0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    transitions: int = 0
    fired: dict[str, str] = field(default_factory=dict)
    """Task name -> ``scheduled_for`` (``format_tick``) of the last tick it fired."""


class LeaseStore(Protocol):
    """Where the lease record lives; every write checks the version read."""

    description: str
    """Where, for logs: ``Lease default/nsqworker-schedules-app``."""

    async def get(self) -> tuple[LeaseRecord, str] | None:
        """The record and its version, or None when there is none yet."""

    async def create(self, record: LeaseRecord) -> str:
        """Create the record; its version. :class:`Conflict` if it exists."""

    async def update(self, record: LeaseRecord, version: str) -> str:
        """Replace the record if its version is still ``version``; the new version.
        :class:`Conflict` otherwise."""

    async def close(self) -> None:
        """Release what the store opened."""


class LocalStore:
    """A lease only this process sees (``schedule_leader=none``): it always leads."""

    description = "this process (schedule_leader=none)"

    def __init__(self) -> None:
        self._record: LeaseRecord | None = None
        self._version = 0

    async def get(self) -> tuple[LeaseRecord, str] | None:
        return None if self._record is None else (self._record, str(self._version))

    async def create(self, record: LeaseRecord) -> str:
        if self._record is not None:
            raise Conflict("exists")
        return self._write(record)

    async def update(self, record: LeaseRecord, version: str) -> str:
        if str(self._version) != version:
            raise Conflict(version)
        return self._write(record)

    def _write(self, record: LeaseRecord) -> str:
        self._record, self._version = record, self._version + 1
        return str(self._version)

    async def close(self) -> None:
        pass


@dataclass(frozen=True)
class Timings:
    """client-go's leader-election timings, in seconds."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


class Elector:
    """One candidate: :meth:`try_lead` every ``retry_period``; fire while :attr:`leading`."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timings: Timings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _now,
    ) -> None:
        self.store = store
        self.identity = identity
        self.timings = timings
        self._clock = clock
        self._wall = wall
        self._record: LeaseRecord | None = None
        self._version: str | None = None
        self._seen: tuple[str, float] | None = None  # (version, when first seen here)
        self._valid_until = float("-inf")
        self._renewed_at = float("-inf")
        self._pending: dict[str, str] = {}  # fired, not yet written (a write failed)

    @property
    def leading(self) -> bool:
        """True while this candidate may fire: it holds the lease and its last renewal
        began less than ``renew_deadline`` seconds ago."""
        return self._clock() < self._valid_until

    @property
    def renew_due(self) -> float:
        """The clock time of the next renewal (or attempt to lead)."""
        return self._renewed_at + self.timings.retry_period

    @property
    def fired(self) -> dict[str, str]:
        """The last tick fired per task, as the record held when last read or written."""
        return dict(self._record.fired) if self._record is not None else {}

    @property
    def pending(self) -> bool:
        """True when a fired tick is not yet written (its write failed)."""
        return bool(self._pending)

    @property
    def holder(self) -> str | None:
        """Who held the lease when it was last read."""
        return self._record.holder if self._record is not None else None

    async def try_lead(self) -> bool:
        """Renew if leading, else read the record and take it over if it is free or
        expired. True when this candidate leads afterwards. ``LeaseDenied`` propagates."""
        started = self._clock()
        self._renewed_at = started
        if self.leading and self._record is not None and self._version is not None:
            fired = {**self._record.fired, **self._pending}
            try:
                await self._write(
                    replace(self._record, fired=fired, renew_time=self._wall()), started
                )
                self._pending = {}
                return True
            except Conflict:
                self._lose("the lease changed under it")
            except LeaseDenied:
                raise
            except Exception as exc:  # transient: retried, while the deadline allows
                log.warning(f"could not renew the schedule lease: {exc}")
                return self.leading
        return await self._acquire(started)

    async def record(self, fired: dict[str, str]) -> bool:
        """Write ``fired`` (task -> last tick) into the record; it renews the lease too.
        False (and no longer leading) when the record changed: another took over. Any
        other failure propagates; ``fired`` is then written with the next write."""
        if self._record is None or self._version is None:
            return False
        self._pending.update(fired)
        started = self._clock()
        merged = {**self._record.fired, **self._pending}
        record = replace(self._record, fired=merged, renew_time=self._wall())
        try:
            await self._write(record, started)
        except Conflict:
            self._lose("the lease changed under it")
            return False
        self._pending = {}
        self._renewed_at = max(self._renewed_at, started)
        return True

    async def release(self) -> None:
        """Give the lease up (a graceful stop), so another candidate leads at once."""
        if not self.leading or self._record is None or self._version is None:
            return
        record = replace(self._record, holder=None, renew_time=self._wall())
        self._valid_until = float("-inf")
        try:
            self._version = await self.store.update(record, self._version)
            self._record = record
        except Exception as exc:  # it expires on its own
            log.info(f"could not release the schedule lease ({exc}); it expires on its own")

    def _duration_of(self, record: LeaseRecord, *, warn: bool) -> float:
        """How long the record's holder may hold it unrenewed: the duration it wrote,
        when sane; else this candidate's own (module docstring), said once per version
        when ``warn``."""
        duration = record.lease_duration
        if math.isfinite(duration) and 0 < duration <= MAX_RECORD_DURATION:
            return float(duration)
        if warn and record.holder and record.holder != self.identity:
            log.warning(
                f"the schedule lease of {record.holder} says it lasts {duration!r} s; "
                f"waiting {self.timings.lease_duration:g} s (schedule_lease_duration) instead"
            )
        return self.timings.lease_duration

    # -- inside ------------------------------------------------------------------------

    async def _write(self, record: LeaseRecord, started: float) -> None:
        assert self._version is not None
        self._version = await self.store.update(record, self._version)
        self._record = record
        self._valid_until = started + self.timings.renew_deadline

    def _lose(self, why: str) -> None:
        if self._valid_until > float("-inf"):
            log.warning(f"no longer the schedule leader: {why}")
        self._valid_until = float("-inf")
        self._pending = {}  # the new leader fires these ticks again (same scheduled_for)

    async def _acquire(self, started: float) -> bool:
        try:
            found = await self.store.get()
        except LeaseDenied:
            raise
        except Exception as exc:
            log.warning(f"could not read the schedule lease: {exc}")
            return False
        now = self._wall()
        mine = LeaseRecord(
            holder=self.identity,
            lease_duration=self.timings.lease_duration,
            acquire_time=now,
            renew_time=now,
        )
        if found is None:
            try:
                self._version = await self.store.create(mine)
            except Conflict:
                return False
            self._record = mine
            self._valid_until = started + self.timings.renew_deadline
            return True
        record, version = found
        self._record, self._version = record, version
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, started)
        waited = started - self._seen[1]
        expired = waited >= self._duration_of(record, warn=waited == 0)
        if record.holder and record.holder != self.identity and not expired:
            return False
        taken = replace(
            mine,
            fired=record.fired,
            transitions=record.transitions + (record.holder != self.identity),
        )
        try:
            await self._write(taken, started)
        except Conflict:
            return False
        return True
