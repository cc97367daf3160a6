"""The pipeline's task: each ``clicks_batches`` message starts a sessionize job.

A message names a day and its input: ``{"day": "2026-11-23", "input": "/data/clicks.jsonl"}``.
When the job succeeds the task publishes ``reports_ready``::

    {"day": "2026-11-23", "output": "/data/reports",
     "rows": {"sessions": 97, "daily": 1, "top_pages": 8}}

Run it with ``nsqworker run examples.spark_pipeline.tasks`` (``make run-spark`` does
everything). Where things are comes from the environment, so the same module runs
on Kubernetes (README.md):

- ``SPARK_PIPELINE_APP``: the job (default: jobs/sessionize.py next to this file;
  on Kubernetes ``local:///opt/pipeline/jobs/sessionize.py`` inside the image);
- ``SPARK_PIPELINE_OUTPUT``: where reports go (default .run/spark_pipeline/reports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from examples.spark_pipeline.reports import OUTPUT, REPORTS_TOPIC, producer_for
from nsqworker import Message, Reject
from nsqworker.spark import JobResult, SparkJob, spark_task

HERE = Path(__file__).resolve().parent
APP = os.environ.get("SPARK_PIPELINE_APP", str(HERE / "jobs" / "sessionize.py"))


async def publish_report(msg: Message, job: SparkJob, result: JobResult) -> None:
    """After a successful job: tell ``reports_ready`` where the reports are."""
    day = msg.json()["day"]
    report: dict[str, Any] = {"day": day, "output": OUTPUT, "job_id": result.job_id}
    counts = Path(OUTPUT, "_counts", f"day={day}.json")
    if counts.is_file():  # a local output; on object storage the job's log has them
        report["rows"] = json.loads(counts.read_text())
    report["seconds"] = round(result.duration, 1)
    await producer_for(msg).publish_json(REPORTS_TOPIC, report)


@spark_task(
    "clicks_batches", channel="sessionize", max_in_flight=2, max_attempts=3,
    on_success=publish_report,
)  # fmt: skip
def sessionize(msg: Message) -> SparkJob:
    """Describe the job for one batch: its day, its input, where reports go."""
    body = msg.json()
    if not isinstance(body, dict) or "day" not in body or "input" not in body:
        raise Reject(f"expected {{'day': ..., 'input': ...}}, got {body!r}")
    return SparkJob(
        app=APP,
        args=["--input", str(body["input"]), "--day", str(body["day"]), "--output", OUTPUT],
        conf={"spark.sql.shuffle.partitions": 4, "spark.ui.enabled": False},
        name=f"sessionize-{body['day']}",
        timeout=600,  # stopped and retried past it; refused if nsqd's --max-msg-timeout is shorter
    )
