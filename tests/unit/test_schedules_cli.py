"""``nsqworker tasks`` shows schedules; ``nsqworker run`` refuses a bad one with exit 2."""

from __future__ import annotations

import itertools
import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nsqworker.cli import app
from nsqworker.message import Message
from nsqworker.schedules.cron import parse_tick

ENV = {"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
_names = itertools.count()

SCHEDULED = """
from nsqworker import Registry

registry = Registry()
task = registry.task

@task("reports", channel="r", schedule="0 6 * * *", timezone="Europe/Berlin", name="daily")
async def daily(msg):
    pass

@task("ticks", channel="t", schedule=["*/10 * * * * *", "0 0 * * *"], name="tick")
async def tick(msg):
    pass

@task("plain", channel="p", name="plain")
async def plain(msg):
    pass
"""


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NSQWORKER_CONFIG", raising=False)

    def module(source: str) -> str:
        name = f"sched_cli_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return module


def test_tasks_shows_each_schedule_and_its_next_three_fire_times(write) -> None:  # type: ignore[no-untyped-def]
    name = write(SCHEDULED)
    result = CliRunner(env=ENV).invoke(app, ["tasks", f"{name}:registry", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert "schedule" not in rows["plain"]
    daily = rows["daily"]["schedule"]
    assert daily["expressions"] == ["0 6 * * *"] and daily["timezone"] == "Europe/Berlin"
    assert len(daily["next"]) == 3
    for shown in daily["next"]:
        moment = datetime.fromisoformat(shown)
        assert (moment.hour, moment.minute) == (6, 0) and moment > datetime.now(UTC)
    ticks = [parse_tick(t) for t in rows["tick"]["schedule"]["next"]]
    assert [t.second % 10 for t in ticks] == [0, 0, 0]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)] == [10, 10]

    text = CliRunner(env=ENV).invoke(app, ["tasks", f"{name}:registry"]).stdout
    line = next(line for line in text.splitlines() if line.startswith("daily fires on"))
    assert line.startswith("daily fires on 0 6 * * * (Europe/Berlin); next: ")
    assert ", ".join(daily["next"]) in line or line.count("T06:00:00") == 3
    assert "tick fires on */10 * * * * * | 0 0 * * *; next: " in text
    assert "warning: schedules: no leader (schedule_leader none)" in " ".join(text.split())
    led = CliRunner(env={**ENV, "NSQWORKER_SCHEDULE_LEADER": "nats"}).invoke(
        app, ["tasks", f"{name}:registry"]
    )
    assert led.exit_code == 0 and "no leader" not in led.stdout


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ('schedule="0 6 * * * * *"', "schedule '0 6 * * * * *' has 7 fields"),
        ('schedule="0 6 31 2 *"', "schedule '0 6 31 2 *' is not a valid cron expression"),
        ('schedule="0 6 * * *", timezone="Europe/Atlantis"', "timezone 'Europe/Atlantis'"),
    ],
)
def test_run_refuses_a_bad_schedule_naming_the_task_with_exit_2(
    write, option: str, problem: str
) -> None:  # type: ignore[no-untyped-def]
    name = write(f"""
        from nsqworker import task

        @task("reports", channel="r", {option}, name="daily")
        async def daily(msg):
            pass
    """)
    result = CliRunner(env=ENV).invoke(app, ["run", name, "--nsqd", "127.0.0.1:1"])
    assert result.exit_code == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        f"could not import {name}: TaskDefinitionError: @task('reports', channel='r'), "
        f"task 'daily': {problem}"
    ), result.stderr
    # the project's import-error form: the user's own frame (the decorator line), then
    # one line; no frame of nsqworker or cronsim, no chained ScheduleError
    assert "cronsim" not in result.stderr and "During handling" not in result.stderr
    assert f'{name}.py", line 4, in <module>' in result.stderr
    assert sum(line.startswith("could not import") for line in result.stderr.splitlines()) == 1


def test_run_refuses_lease_timings_that_cannot_work(write, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    name = write(SCHEDULED)
    monkeypatch.setenv("NSQWORKER_SCHEDULE_RENEW_DEADLINE", "20")
    result = CliRunner(env=ENV).invoke(
        app, ["run", f"{name}:registry", "--nsqd", "127.0.0.1:1", "--health-port", "0"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        "error: schedule_renew_deadline (20) must be below schedule_lease_duration (15), so "
        "that a leader stops firing before another may take over"
    )


def test_spark_task_decorators_take_a_schedule() -> None:
    from nsqworker import Registry
    from nsqworker.spark import SparkJob, spark_task
    from nsqworker.spark.session_task import spark_session_task

    registry = Registry()

    @spark_task(
        "reports", channel="s", registry=registry, schedule="0 6 * * *", timezone="Europe/Berlin"
    )
    def daily(msg: Message) -> SparkJob:
        return SparkJob(app="jobs/daily.py")

    @spark_session_task("reports", channel="ss", registry=registry, schedule=["*/5 * * * * *"])
    def session(msg, spark):  # type: ignore[no-untyped-def]
        pass

    shown = {spec.name.rsplit(".", 1)[1]: str(spec.schedule) for spec in registry}
    assert shown == {"daily": "0 6 * * * (Europe/Berlin)", "session": "*/5 * * * * *"}


def test_the_leader_defaults_to_kubernetes_only_in_a_pod_with_a_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nsqworker.schedules import kube
    from nsqworker.schedules.runner import choose_leader, lease_name
    from nsqworker.settings import Settings

    monkeypatch.delenv("NSQWORKER_SCHEDULE_LEADER", raising=False)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert choose_leader(Settings())[0] == "none"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert choose_leader(Settings())[0] == "none"  # no token mounted
    (tmp_path / "token").write_text("t")
    assert choose_leader(Settings()) == ("kubernetes", "running in a pod with a service account")
    assert choose_leader(Settings(schedule_leader="NATS")) == ("nats", "NSQWORKER_SCHEDULE_LEADER")
    assert (
        lease_name("My_Service.tasks:registry", Settings())
        == "nsqworker-schedules-my-service.tasks"
    )
    assert lease_name("x", Settings(schedule_lease_name="beat")) == "beat"


def test_schedules_with_no_leader_warn_at_start(log_lines) -> None:  # type: ignore[no-untyped-def]
    from nsqworker.schedules.cron import Schedule
    from nsqworker.schedules.firing import Scheduled
    from nsqworker.schedules.runner import ScheduleRunner
    from nsqworker.settings import Settings

    yearly = [Scheduled("app.report", "reports", Schedule.of("0 0 1 1 *"))]  # never fires here

    def warnings() -> list[dict[str, Any]]:
        said = [x for x in log_lines() if "no leader (schedule_leader none)" in x["event"]]
        assert all(x["level"] == "warning" for x in said)
        return said

    for count, leader in enumerate(("none", None), 1):  # said, or the default off Kubernetes
        settings = Settings(nsqd_tcp_addresses=["127.0.0.1:1"], schedule_leader=leader)
        runner = ScheduleRunner("app.tasks", settings, yearly)
        runner.start()
        runner.stop()
        assert len(warnings()) == count
    led = ScheduleRunner("app.tasks", Settings(schedule_leader="nats"), yearly)
    assert led.leader == "nats" and len(warnings()) == 2  # not started: nothing more said
