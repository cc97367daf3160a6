"""The ``postgres`` schedule leader without a server: its setting, what it refuses at
start, and the password kept out of every message (the server tests are in
tests/integration/test_schedules_lease_postgres.py)."""

from __future__ import annotations

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.schedules.postgres import MASK, PostgresLeaseStore, dsn_secrets, scrub
from nsqworker.schedules.runner import NO_LEADER, ScheduleRunner, choose_leader
from nsqworker.settings import Settings, SettingsError

SECRET = "s3cr3t-P@ss"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://app:{SECRET}@db:5432/app",
        "postgresql://app:s3cr3t-P%40ss@db/app",
        f"postgres://db/app?user=app&password={SECRET}",
        f"host=db user=app password={SECRET} dbname=app",
        f"host=db password='{SECRET}' dbname=app",
    ],
)
def test_every_form_of_the_password_is_masked(dsn: str) -> None:
    text = f"could not connect with {dsn}: password {SECRET} refused"
    masked = scrub(text, dsn_secrets(dsn))
    assert SECRET not in masked and "s3cr3t-P%40ss" not in masked
    assert MASK in masked


def test_the_setting_is_a_secret_and_its_problems_never_show_it() -> None:
    settings = Settings(
        schedule_leader="postgres", schedule_postgres_dsn=f"host=db password={SECRET}"
    )
    assert SECRET not in repr(settings) and SECRET not in settings.display("schedule_postgres_dsn")
    assert Settings(schedule_postgres_dsn=" ").schedule_postgres_dsn is None
    for bad in (f"mysql://app:{SECRET}@db/app", f"postgresql://app:{SECRET}@db:99999/app", SECRET):
        with pytest.raises(SettingsError) as problem:
            Settings(schedule_postgres_dsn=bad)
        assert SECRET not in str(problem.value)
        assert "schedule_postgres_dsn" in str(problem.value)


def test_the_leader_needs_its_dsn() -> None:
    settings = Settings(schedule_leader="postgres")
    assert choose_leader(settings) == ("postgres", "NSQWORKER_SCHEDULE_LEADER")
    with pytest.raises(ConfigurationError, match="NSQWORKER_SCHEDULE_POSTGRES_DSN=postgresql://"):
        ScheduleRunner("app.tasks", settings, [])


def test_a_dsn_libpq_cannot_read_is_refused_without_its_password() -> None:
    settings = Settings(schedule_leader="postgres", schedule_postgres_dsn=f"password={SECRET} host")
    with pytest.raises(ConfigurationError) as refused:
        PostgresLeaseStore.from_settings(settings, "lease")
    assert "libpq" in str(refused.value) and SECRET not in str(refused.value)


def test_the_store_says_where_without_the_password() -> None:
    store = PostgresLeaseStore("postgresql://app:s3cr3t-P%40ss@db.internal:6432/orders", "t", 1.0)
    assert store.description == "PostgreSQL db.internal:6432/orders nsqworker_schedule_leases/t"
    assert store.token is None
    # an unencoded @ in the password: libpq splits at the first one; nothing of it shows
    store = PostgresLeaseStore(f"postgresql://app:{SECRET}@db.internal/orders", "t", 1.0)
    assert store.description == "PostgreSQL db.internal:5432/orders nsqworker_schedule_leases/t"


def test_no_leader_names_postgres() -> None:
    assert "(kubernetes, nats or postgres)" in NO_LEADER
