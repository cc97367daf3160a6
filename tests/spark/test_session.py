"""@spark_session_task on a local driver in the test process: a real nsqd, a Worker,
real Spark jobs in one long-lived session (started once for the module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
