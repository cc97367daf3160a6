"""The ``nats`` schedule leader: one entry of a JetStream key-value bucket.

The entry (key: the lease name, bucket: ``schedule_kv_bucket``, created with history 1
and ``nats_stream_replicas`` replicas when missing) holds the lease record as JSON:
holder, times, transitions and the last tick fired per task. Every write is a
compare-and-set on the entry's revision (``Nats-Expected-Last-Subject-Sequence``), as
a Kubernetes Lease is on its resourceVersion; the stream's RAFT group orders the writes,
so with replicas 3 a lost server loses no lease.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nsqworker.schedules.lease import Conflict, LeaseDenied, LeaseRecord

if TYPE_CHECKING:
    from nsqworker.settings.nats import NatsSettings

__all__ = ["NatsLeaseStore"]

_PERMISSION = "permissions violation"


class NatsLeaseStore:
    """The entry ``key`` of bucket ``bucket`` on ``connection`` (the NATS transport's
    connection object, as its producer holds it: ``jetstream()`` and ``close()``)."""

    def __init__(self, connection: Any, bucket: str, key: str, settings: NatsSettings):
        self.connection = connection
        self.bucket = bucket
        self.key = key
        self.replicas = settings.nats_stream_replicas
        self.description = f"JetStream KV {bucket}/{key}"
        self._kv: Any = None

    async def _store(self) -> Any:
        if self._kv is None:
            from nats.js.api import KeyValueConfig
            from nats.js.errors import BucketNotFoundError

            js = await self.connection.jetstream()
            try:
                self._kv = await js.key_value(self.bucket)
            except BucketNotFoundError:
                config = KeyValueConfig(bucket=self.bucket, history=1, replicas=self.replicas)
                self._kv = await js.create_key_value(config=config)
        return self._kv

    async def get(self) -> tuple[LeaseRecord, str] | None:
        from nats.js.errors import KeyDeletedError, KeyNotFoundError

        kv = await self._guard(self._store())
        try:
            entry = await self._guard(kv.get(self.key))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        return _decode(entry.value or b"{}"), str(entry.revision)

    async def create(self, record: LeaseRecord) -> str:
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self._guard(self._store())
        try:
            return str(await self._guard(kv.create(self.key, _encode(record))))
        except KeyWrongLastSequenceError:
            raise Conflict("the entry exists") from None

    async def update(self, record: LeaseRecord, version: str) -> str:
        from nats.js.errors import KeyWrongLastSequenceError

        kv = await self._guard(self._store())
        try:
            revision = await self._guard(kv.update(self.key, _encode(record), last=int(version)))
        except KeyWrongLastSequenceError:
            raise Conflict(f"revision {version} is not current") from None
        return str(revision)

    async def close(self) -> None:
        await self.connection.close()

    async def _guard(self, call: Any) -> Any:
        try:
            return await call
        except Exception as exc:
            if _PERMISSION in str(exc).lower():
                raise LeaseDenied(
                    f"the NATS user may not use {self.description} ({exc}); allow it to publish"
                    f" to $KV.{self.bucket}.> and $JS.API.> (docs/schedules.md)"
                ) from None
            raise


def _encode(record: LeaseRecord) -> bytes:
    def when(moment: datetime | None) -> str | None:
        return None if moment is None else moment.isoformat()

    return json.dumps(
        {
            "holder": record.holder,
            "lease_duration": record.lease_duration,
            "acquire_time": when(record.acquire_time),
            "renew_time": when(record.renew_time),
            "transitions": record.transitions,
            "fired": record.fired,
        },
        sort_keys=True,
    ).encode()


def _decode(data: bytes) -> LeaseRecord:
    try:
        raw = json.loads(data)
    except ValueError:
        raw = {}
    if not isinstance(raw, dict):
        raw = {}

    def when(value: Any) -> datetime | None:
        try:
            return datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            return None

    fired = raw.get("fired")
    return LeaseRecord(
        holder=raw.get("holder") or None,
        lease_duration=float(raw.get("lease_duration") or 15),
        acquire_time=when(raw.get("acquire_time")),
        renew_time=when(raw.get("renew_time")),
        transitions=int(raw.get("transitions") or 0),
        fired={str(k): str(v) for k, v in fired.items()} if isinstance(fired, dict) else {},
    )
