"""The local runner end to end: a real nsqd, a Worker, real spark-submit jobs."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.spark import SparkJob, runner_for, spark_task
from nsqworker.spark.local import LocalRunner
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]

APPS = Path(__file__).parent / "apps"
TOPIC = "spark_jobs"
CHANNEL = "spark"
# Small and quiet: one core, no UI, few shuffle partitions.
FAST_CONF = {"spark.ui.enabled": False, "spark.sql.shuffle.partitions": 2}


def settings_for(nsqd: NsqdProcess, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nsqd_tcp_addresses": [nsqd.tcp_address],
        "spark_master": "local[1]",
        "retry_delay": 0.1,
        "backoff_multiplier": 0.0,
        "drain_timeout": 5.0,
        "msg_timeout": 10.0,
        "health_port": 0,
    }
    values.update(overrides)
    return Settings(**values)


def prepare(nsqd: NsqdProcess) -> NsqdProcess:
    """Create the channel and restart nsqd so requeued messages come back at once."""
    nsqd.create_channel(TOPIC, CHANNEL)
    return nsqd.restart()


def channel(nsqd: NsqdProcess) -> dict[str, Any]:
    return nsqd.channel_stats(TOPIC, CHANNEL) or {}


def finished(nsqd: NsqdProcess) -> int:
    """FINs nsqd counted from the connected worker."""
    return sum(c.get("finish_count", 0) for c in channel(nsqd).get("clients") or [])


def process_group_alive(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(entry.name))
    return alive


async def test_job_succeeds_fin_and_parquet_output(nsqd: NsqdProcess, tmp_path: Path) -> None:
    nsqd = prepare(nsqd)
    source = tmp_path / "events.jsonl"
    rows = [("ann", 3), ("bob", 4), ("ann", 5), ("cyd", 1), ("bob", 6)]
    source.write_text("".join(json.dumps({"user": u, "value": v}) + "\n" for u, v in rows))
    target = tmp_path / "out"
    registry = Registry()
    dead: list[str] = []

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, on_dead_letter=lambda m, r: dead.append(r)
    )
    def aggregate(msg: Message) -> SparkJob:
        body = msg.json()
        return SparkJob(str(APPS / "aggregate.py"), [body["in"], body["out"]], conf=FAST_CONF)

    async with Worker(registry, settings_for(nsqd)):
        nsqd.publish(TOPIC, json.dumps({"in": str(source), "out": str(target)}))
        await wait_until(lambda: channel(nsqd).get("message_count") == 1, 10, "delivery")
        await wait_until(
            lambda: channel(nsqd).get("in_flight_count") == 0 and not nsqd.depth(TOPIC, CHANNEL),
            120, "the job to end",
        )  # fmt: skip
        stats = channel(nsqd)
    assert dead == []
    assert stats["requeue_count"] == 0 and stats["timeout_count"] == 0
    table = pq.read_table(target).to_pylist()
    got = {row["user"]: (row["events"], row["total"]) for row in table}
    assert got == {"ann": (2, 8), "bob": (2, 10), "cyd": (1, 1)}


async def test_failing_job_is_requeued_then_dead_lettered(nsqd: NsqdProcess) -> None:
    nsqd = prepare(nsqd)
    registry = Registry()
    dead: list[tuple[int, str]] = []
    runs: list[int] = []

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, max_attempts=2,
        on_dead_letter=lambda m, r: dead.append((m.attempts, r)),
    )  # fmt: skip
    def fail(msg: Message) -> SparkJob:
        runs.append(msg.attempts)
        return SparkJob(str(APPS / "fail.py"), conf=FAST_CONF)

    async with Worker(registry, settings_for(nsqd)):
        nsqd.publish(TOPIC, b"{}")
        await wait_until(lambda: dead, 120, "the dead letter")
        await wait_until(lambda: finished(nsqd) == 1, 10, "the FIN after the dead letter")
        stats = channel(nsqd)
    # Two runs, each failing; the second was the last allowed: dead-lettered at once.
    assert runs == [1, 2]
    assert stats["requeue_count"] == 1
    assert dead == [(2, "max attempts exceeded")]


async def test_bad_job_is_dead_lettered_without_submitting(nsqd: NsqdProcess) -> None:
    nsqd = prepare(nsqd)
    registry = Registry()
    dead: list[str] = []

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, on_dead_letter=lambda m, r: dead.append(r)
    )
    def bad(msg: Message) -> SparkJob:
        body = msg.json()
        return SparkJob(body["app"], conf={"spark.executor.memory": body["memory"]})

    settings = settings_for(nsqd)
    runner = runner_for(settings)
    assert isinstance(runner, LocalRunner)
    submitted = runner.submitted
    async with Worker(registry, settings):
        nsqd.publish(TOPIC, json.dumps({"app": str(APPS / "missing.py"), "memory": "1g"}))
        nsqd.publish(TOPIC, json.dumps({"app": str(APPS / "fail.py"), "memory": None}))
        await wait_until(lambda: finished(nsqd) == 2, 20, "two dead letters")
        stats = channel(nsqd)
    assert runner.submitted == submitted
    assert stats["requeue_count"] == 0 and len(dead) == 2
    assert "app" in dead[0] and "missing.py" in dead[0] and "no such file" in dead[0]
    assert "conf['spark.executor.memory'] = None" in dead[1]


async def test_sigterm_stops_the_job_and_requeues(nsqd: NsqdProcess, tmp_path: Path) -> None:
    nsqd = prepare(nsqd)
    registry = Registry()
    pid_file = tmp_path / "driver.pid"

    @spark_task(TOPIC, channel=CHANNEL, registry=registry)
    def sleepy(msg: Message) -> SparkJob:
        return SparkJob(str(APPS / "sleep.py"), [str(pid_file)], conf=FAST_CONF)

    settings = settings_for(nsqd, drain_timeout=1.0)
    runner = runner_for(settings)
    assert isinstance(runner, LocalRunner)
    worker = Worker(registry, settings)
    serving = asyncio.ensure_future(worker.run())
    try:
        await wait_until(lambda: worker.ready, 10, "the worker")
        nsqd.publish(TOPIC, b"{}")
        await wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the driver"
        )
        (job,) = runner.jobs.values()
        pgid = job.process.pid
        driver = int(pid_file.read_text())
        assert driver in process_group_alive(pgid)
        started = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)  # what the worker's signal handler drains on
        await asyncio.wait_for(serving, 15)
        stopped_in = time.monotonic() - started
    finally:
        if not serving.done():
            worker.force_stop()
            await serving
    assert stopped_in < 1.0 + 5.0  # drain_timeout, then the group is stopped
    assert process_group_alive(pgid) == []
    assert runner.jobs == {}
    stats = channel(nsqd)
    assert stats["requeue_count"] == 1 and stats["message_count"] == 1
    assert nsqd.depth(TOPIC, CHANNEL) == 1  # back in the queue for the next worker


async def test_job_longer_than_max_msg_timeout_is_refused(
    nsqd_factory: Any, tmp_path: Path
) -> None:
    """nsqd --max-msg-timeout=30s and a job expected to take 10 minutes: dead letter
    at once, naming the limit, and nothing submitted."""
    nsqd = prepare(nsqd_factory(extra_args=["--max-msg-timeout=30s"]))
    registry = Registry()
    dead: list[str] = []

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, on_dead_letter=lambda m, r: dead.append(r)
    )
    def long_job(msg: Message) -> SparkJob:
        return SparkJob(str(APPS / "fail.py"), timeout=600)

    settings = settings_for(nsqd)
    runner = runner_for(settings)
    assert isinstance(runner, LocalRunner)
    submitted = runner.submitted
    async with Worker(registry, settings):
        nsqd.publish(TOPIC, b"{}")
        await wait_until(lambda: finished(nsqd) == 1, 20, "the dead letter's FIN")
        requeued = channel(nsqd)["requeue_count"]
    assert runner.submitted == submitted and requeued == 0
    (reason,) = dead
    assert "timeout 600s is longer than the broker holds a delivery (30s; on NSQ" in reason


async def test_job_output_reaches_the_log_and_the_outcome_the_span(
    nsqd: NsqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each output line is a log record with the message id and the job's name; the span
    of the message carries the runner, the exit code, the state and the wall time."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nsqworker.logging import configure_logging

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    nsqd = prepare(nsqd)
    registry = Registry()
    dead: list[str] = []

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, max_attempts=1,
        on_dead_letter=lambda m, r: dead.append(m.id),
    )  # fmt: skip
    def fail(msg: Message) -> SparkJob:
        return SparkJob(str(APPS / "fail.py"), conf=FAST_CONF, name="failing-job")

    try:
        async with Worker(registry, settings_for(nsqd)):
            nsqd.publish(TOPIC, b"{}")
            await wait_until(lambda: dead, 60, "the dead letter")
    finally:
        configure_logging("info", "console")
        provider.shutdown()
    records = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    output = [r for r in records if r.get("event") == "spark output"]
    (mine,) = [r for r in output if r.get("line") == "failing on purpose"]
    assert mine["id"] == dead[0] and mine["job"] == "failing-job"
    assert {r["stream"] for r in output} == {"stdout", "stderr"}  # Spark's own lines: stderr
    assert mine["job_id"].startswith("local-")
    (span,) = [
        s for s in exporter.get_finished_spans() if "spark.exit_code" in (s.attributes or {})
    ]
    attributes = dict(span.attributes or {})
    assert attributes["spark.exit_code"] == 3 and attributes["spark.state"] == "failed"
    assert attributes["spark.runner"] == "local" and attributes["spark.job_id"] == mine["job_id"]
    assert 0 < float(attributes["spark.duration_s"]) < 60  # type: ignore[arg-type]
    assert "failing on purpose" in str(attributes["spark.error"])


@pytest.mark.parametrize("where", ["task", "job"])
async def test_a_job_past_its_time_limit_is_stopped_retried_then_dead_lettered(
    nsqd: NsqdProcess, where: str
) -> None:
    """``@spark_task(timeout=)`` (the task's time limit) or ``SparkJob(timeout=)``: the
    sleeping job's process group is stopped at the limit, the attempt fails, and after
    ``max_attempts`` the message is dead-lettered."""
    nsqd = prepare(nsqd)
    registry = Registry()
    dead: list[tuple[int, str]] = []
    errors: list[BaseException | None] = []
    limit = 6.0
    task_limit = {"timeout": limit} if where == "task" else {}
    job_limit = limit if where == "job" else None

    @spark_task(
        TOPIC, channel=CHANNEL, registry=registry, max_attempts=2,
        on_dead_letter=lambda m, r: dead.append((m.attempts, r)), **task_limit,
    )  # fmt: skip
    def sleepy(msg: Message) -> SparkJob:
        return SparkJob(str(APPS / "sleep.py"), ["/dev/null"], conf=FAST_CONF, timeout=job_limit)

    @registry.after
    def record(msg: Message, outcome: object, error: BaseException | None, took: float) -> None:
        errors.append(error)

    settings = settings_for(nsqd)
    runner = runner_for(settings)
    assert isinstance(runner, LocalRunner)
    groups: set[int] = set()

    async def watch_groups() -> None:
        while True:
            groups.update(job.process.pid for job in runner.jobs.values())
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch_groups())
    try:
        async with Worker(registry, settings):
            nsqd.publish(TOPIC, b"{}")
            await wait_until(lambda: dead, 90, "the dead letter")
            await wait_until(lambda: finished(nsqd) == 1, 10, "the FIN after the dead letter")
            stats = channel(nsqd)
    finally:
        watcher.cancel()
    assert len(groups) == 2  # one job per attempt, each stopped at the limit
    assert all(process_group_alive(pgid) == [] for pgid in groups)
    assert runner.jobs == {}
    assert stats["requeue_count"] == 1  # the second failure was the last: no retry
    assert dead == [(2, "max attempts exceeded")]
    failures = errors[:2]
    if where == "task":
        assert [type(e).__name__ for e in failures] == ["TaskTimeout", "TaskTimeout"]
    else:
        assert [type(e).__name__ for e in failures] == ["SparkJobFailed", "SparkJobFailed"]
        assert all("ran past its SparkJob timeout of 6s" in str(e) for e in failures)
