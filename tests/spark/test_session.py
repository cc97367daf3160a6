"""@spark_session_task on a local driver in the test process: a real nsqd, a Worker,
real Spark jobs in one long-lived session (started once for the module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import Settings
from nsqworker.spark.session import SessionHolder, group_name, holder_for
from nsqworker.testing import NsqdProcess
from tests.spark import session_cases as cases

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def holder() -> Iterator[SessionHolder]:
    """The holder workers of these settings use, with a session started once and
    adopted, so a worker's drain does not stop it between tests."""
    cases.need_java()
    holder = holder_for(Settings(spark_master="local[2]", spark_session_conf=cases.CONF))
    spark = holder.get()
    holder.adopt(spark)
    yield holder
    holder.session = None
    spark.stop()


async def test_success_fin_and_parquet_output(
    holder: SessionHolder, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    await cases.success_writes_parquet(nsqd, tmp_path)
    assert holder.session is not None and holder.started == 1  # the one session


async def test_job_failure_requeued_then_dead_lettered(
    holder: SessionHolder, nsqd: NsqdProcess
) -> None:
    await cases.failure_requeued_then_dead_lettered(nsqd)


async def test_drain_cancels_the_messages_job_group(
    holder: SessionHolder, nsqd: NsqdProcess
) -> None:
    seen = await cases.drain_cancels_the_running_job(nsqd, holder)
    group = group_name(seen["task"], seen["id"])
    tracker = holder.session.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    assert jobs, f"no job ran in group {group}"
    assert {tracker.getJobInfo(j).status for j in jobs} == {"FAILED"}  # cancelled
    assert "cancelled job group" in seen["error"]
    assert holder.session is not None  # adopted: the drain does not stop it


async def test_two_messages_run_as_concurrent_jobs(
    holder: SessionHolder, nsqd: NsqdProcess
) -> None:
    await cases.concurrent_messages_overlap(nsqd)


def test_the_examples_session_form_writes_the_jobs_parquet_layout(
    holder: SessionHolder, tmp_path: Path
) -> None:
    """examples/spark_pipeline's sessionize_day, in the session: partitions by day,
    counts that match the rows (make run-spark compares it with spark-submit's)."""
    from datetime import date

    import pyarrow.parquet as pq

    from examples.spark_pipeline.generate import generate, write
    from examples.spark_pipeline.jobs.sessionize import sessionize_day

    day = date(2026, 11, 21)
    clicks = generate(day)
    source = write(tmp_path / "clicks.jsonl", clicks)
    out = tmp_path / "reports"
    counts = sessionize_day(holder.session, str(source), str(day), str(out))
    for table in ("sessions", "daily", "top_pages"):
        rows = pq.read_table(out / table / f"day={day}").to_pylist()
        assert len(rows) == counts[table] > 0
    daily = pq.read_table(out / "daily" / f"day={day}").to_pylist()[0]
    assert daily["clicks"] == len(clicks) and daily["sessions"] == counts["sessions"]
    assert (out / "_counts" / f"day={day}.json").is_file()


async def test_job_error_first_lines_in_the_log_and_on_the_span(
    holder: SessionHolder, nsqd: NsqdProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import json

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from nsqworker.logging import configure_logging
    from nsqworker.message import Message
    from nsqworker.spark import spark_session_task
    from nsqworker.task import Registry
    from nsqworker.testing import wait_until
    from nsqworker.worker import Worker

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    nsqd = cases.prepare(nsqd)
    registry = Registry()
    dead: list[str] = []

    @spark_session_task(
        cases.TOPIC, channel=cases.CHANNEL, registry=registry, max_attempts=1,
        on_dead_letter=lambda m, r: dead.append(m.id),
    )  # fmt: skip
    def fail(msg: Message, spark: Any) -> None:
        spark.sql("SELECT raise_error('failing on purpose')").collect()

    try:
        async with Worker(registry, cases.settings_for(nsqd)):
            nsqd.publish(cases.TOPIC, b"{}")
            await wait_until(lambda: dead, 60, "the dead letter")
    finally:
        configure_logging("info", "console")
        provider.shutdown()
    records = [json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    (failed,) = [r for r in records if r.get("event") == "spark job failed"]
    assert failed["id"] == dead[0] and "failing on purpose" in failed["error"]
    assert "\tat " not in failed["error"] and failed["error"].count("\n") < 6
    (span,) = [s for s in exporter.get_finished_spans() if "spark.error" in (s.attributes or {})]
    attributes = dict(span.attributes or {})
    assert attributes["spark.backend"] == "local"
    assert attributes["spark.job_group"] == failed["group"]
    assert "failing on purpose" in str(attributes["spark.error"])
