"""The ``postgres`` schedule leader on a real PostgreSQL (the plugin's ``postgres``
fixture): claim, renewal, takeover after expiry (the follower's wait *and* the database's
clock), fencing of a stale holder, release, a restarted database, privileges, and the
DSN's password kept out of every log line and error."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.logging import configure_logging
from nsqworker.schedules.firing import Scheduled
from nsqworker.schedules.lease import Elector, LeaseDenied, Timings
from nsqworker.schedules.postgres import TABLE, PostgresLeaseStore
from nsqworker.schedules.runner import ScheduleRunner
from nsqworker.settings import Settings, SettingsError
from nsqworker.testing import wait_until
from nsqworker.testing.postgres import PostgresProcess

pytestmark = pytest.mark.integration

TIMINGS = Timings(lease_duration=2.0, renew_deadline=1.2, retry_period=0.25)
TICK = "2026-11-29T12:00:00Z"


@pytest.fixture(autouse=True)
def logs() -> Iterator[io.StringIO]:
    """What these tests log, in a buffer of their own."""
    buffer = io.StringIO()
    configure_logging("debug", "json", stream=buffer)
    yield buffer


def row(postgres: PostgresProcess, name: str) -> dict[str, Any]:
    """The lease row as the database has it."""
    with psycopg.connect(postgres.dsn) as conn:
        cursor = conn.execute(
            f"SELECT holder, token, version, fired, fired_token, expires_at > now()"
            f" FROM {TABLE} WHERE name = %s",
            (name,),
        )
        found = cursor.fetchone()
    assert found is not None, f"no row {name}"
    keys = ("holder", "token", "version", "fired", "fired_token", "unexpired")
    return dict(zip(keys, found, strict=True))


def elector(postgres: PostgresProcess, name: str, who: str, **clock: Any) -> Elector:
    return Elector(PostgresLeaseStore(postgres.dsn, name, 2.0), who, TIMINGS, **clock)


async def lead_within(candidate: Elector, seconds: float) -> float:
    """Try to lead every retry period until it does; the seconds it took."""
    started = time.monotonic()
    while not await candidate.try_lead():
        assert time.monotonic() - started < seconds, f"{candidate.identity} never led"
        await asyncio.sleep(TIMINGS.retry_period)
    return time.monotonic() - started


async def test_claim_renew_record_and_release(postgres: PostgresProcess) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    a, b = elector(postgres, name, "a"), elector(postgres, name, "b")
    try:
        assert await a.try_lead() and a.leading
        first = row(postgres, name)
        assert (first["holder"], first["token"], first["unexpired"]) == ("a", 1, True)
        assert not await b.try_lead(), "b took a lease a holds"
        assert await a.try_lead()  # a renewal: a new version, the same token
        renewed = row(postgres, name)
        assert (renewed["token"], renewed["version"]) == (1, first["version"] + 1)
        assert await a.record({"app.tick": TICK})
        recorded = row(postgres, name)
        assert (recorded["fired"], recorded["fired_token"]) == ({"app.tick": TICK}, 1)
        await a.release()  # a graceful stop: b leads at once, with the next token
        assert row(postgres, name)["holder"] is None
        assert await b.try_lead()
        taken = row(postgres, name)
        assert (taken["holder"], taken["token"], taken["fired"]) == ("b", 2, {"app.tick": TICK})
        assert b.fired == {"app.tick": TICK}
    finally:
        await a.store.close()
        await b.store.close()


async def test_a_follower_takes_over_only_after_the_lease_expired(
    postgres: PostgresProcess,
) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    a, b = elector(postgres, name, "a"), elector(postgres, name, "b")
    try:
        assert await a.try_lead()  # then a stops renewing, as a killed leader does
        waited = await lead_within(b, 10)
        assert waited >= TIMINGS.lease_duration - 0.05, f"taken over after {waited:.2f} s"
        taken = row(postgres, name)
        assert (taken["holder"], taken["token"]) == ("b", 2)
    finally:
        await a.store.close()
        await b.store.close()


async def test_the_database_clock_must_agree_with_a_fast_follower(
    postgres: PostgresProcess,
) -> None:
    """A follower whose own clock runs far ahead (or whose wait is wrong) still cannot
    take over before the database's clock says the lease expired."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    fast = [0.0]

    def clock() -> float:
        fast[0] += 100.0  # every reading 100 s later
        return fast[0]

    a, b = elector(postgres, name, "a"), elector(postgres, name, "b", clock=clock)
    try:
        assert await a.try_lead()
        assert not await b.try_lead()  # first read: it starts waiting
        assert not await b.try_lead(), "b took over while the database said a holds"
        assert row(postgres, name)["holder"] == "a"
        await asyncio.sleep(TIMINGS.lease_duration + 0.2)
        assert await b.try_lead()
        assert row(postgres, name)["holder"] == "b"
    finally:
        await a.store.close()
        await b.store.close()


async def test_a_stale_leader_is_fenced(postgres: PostgresProcess) -> None:
    """a is paused (its clock frozen: it believes it still leads) while b takes over; its
    recorded tick and its renewal are refused, and the row keeps b's."""
    name = f"lease-{uuid.uuid4().hex[:8]}"
    frozen = time.monotonic()
    a = elector(postgres, name, "a", clock=lambda: frozen)
    b = elector(postgres, name, "b")
    try:
        assert await a.try_lead()
        await lead_within(b, 10)
        assert await b.record({"app.tick": TICK})
        assert a.leading, "a's frozen clock should still say it leads"
        assert not await a.record({"app.tick": "2026-11-29T12:00:01Z"})
        assert not a.leading
        assert not await a.try_lead()  # b's lease is fresh: a follows
        now = row(postgres, name)
        assert (now["holder"], now["token"]) == ("b", 2)
        assert (now["fired"], now["fired_token"]) == ({"app.tick": TICK}, 2)
    finally:
        await a.store.close()
        await b.store.close()


async def test_candidates_creating_the_table_at_once(postgres: PostgresProcess) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    stores = [PostgresLeaseStore(postgres.dsn, name, 5.0) for _ in range(4)]
    try:
        assert await asyncio.gather(*(s.get() for s in stores)) == [None] * 4
    finally:
        for store in stores:
            await store.close()


async def test_a_restarted_database_is_reconnected(postgres: PostgresProcess) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    a = elector(postgres, name, "a")
    try:
        assert await a.try_lead()
        group = postgres.pid
        postgres.kill()  # SIGKILL to the whole process group: no backend outlives it
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
        with pytest.raises(RuntimeError, match=r"failed|longer than"):
            await a.store.get()
        postgres.start()  # same data, same port
        found = await a.store.get()
        assert found is not None and found[0].holder == "a"
    finally:
        await a.store.close()


async def test_a_user_without_privileges_is_denied(postgres: PostgresProcess) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    owner = PostgresLeaseStore(postgres.dsn, name, 5.0)
    assert await owner.get() is None  # creates the table
    await owner.close()
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE visitor LOGIN PASSWORD 'visitor-pass-123'")
    dsn = postgres.dsn.replace(f"nsqworker:{postgres.password}", "visitor:visitor-pass-123")
    visitor = PostgresLeaseStore(dsn, name, 5.0)
    try:
        with pytest.raises(LeaseDenied, match=f"grant it SELECT, INSERT and UPDATE on {TABLE}"):
            await visitor.get()
    finally:
        await visitor.close()


async def test_the_password_is_in_no_log_line_or_error(
    postgres: PostgresProcess, logs: io.StringIO
) -> None:
    secret = postgres.password
    wrong = postgres.dsn.replace(secret, f"{secret}-wrong")
    # a wrong password: the server refuses, the error names neither password
    store = PostgresLeaseStore(wrong, "lease-x", 5.0)
    with pytest.raises(RuntimeError) as refused:
        await store.get()
    assert "password authentication failed" in str(refused.value)
    assert secret not in str(refused.value)
    # a connection string libpq cannot read, with the password in it
    broken = Settings(
        schedule_leader="postgres", schedule_postgres_dsn=f"user=a password={secret} host"
    )
    with pytest.raises(ConfigurationError) as unread:
        PostgresLeaseStore.from_settings(broken, "lease-x")
    assert secret not in str(unread.value)
    # a setting that is not a connection string at all
    with pytest.raises(SettingsError) as invalid:
        Settings(schedule_postgres_dsn=f"mysql://a:{secret}@h/db")
    assert secret not in str(invalid.value)
    # the effective settings, and a runner's log lines while it leads
    settings = Settings(
        schedule_leader="postgres",
        schedule_postgres_dsn=postgres.dsn,
        schedule_lease_duration=2.0,
        schedule_renew_deadline=1.2,
        schedule_retry_period=0.25,
        nsqd_tcp_addresses=["127.0.0.1:1"],
    )
    assert secret not in json.dumps(settings.describe())
    from nsqworker.schedules.cron import Schedule

    runner = ScheduleRunner(
        "app.tasks", settings, [Scheduled("app.t", "t", Schedule.of("0 0 1 1 *"))]
    )
    runner.start()
    try:
        await wait_until(lambda: runner.elector.leading, 10, "the runner never led")
    finally:
        await asyncio.to_thread(runner.stop)
    text = logs.getvalue()
    assert "fencing token 1" in text and f"127.0.0.1:{postgres.port}/postgres" in text
    assert secret not in text
