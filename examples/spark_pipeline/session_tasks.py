"""The pipeline's task in session form: the same sessionize, in the worker's SparkSession.

Where ``tasks.py`` starts a spark-submit (a JVM and a driver, 20-40 s) per message,
this runs :func:`~examples.spark_pipeline.jobs.sessionize.sessionize_day` in the
worker process's long-lived session (a local driver, or Spark Connect when
``NSQWORKER_SPARK_REMOTE`` is set): the same Parquet under the same layout, in about a
second per day once the session is up. It publishes the same ``reports_ready``
message, with ``job_id`` ``session``.

Run it with ``nsqworker run examples.spark_pipeline.session_tasks``; ``make run-spark``
runs both forms and prints their times side by side.
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import SparkSession

from examples.spark_pipeline.jobs.sessionize import sessionize_day
from examples.spark_pipeline.reports import OUTPUT, REPORTS_TOPIC, producer_for
from nsqworker import Message, Reject
from nsqworker.spark import spark_session_task


async def publish_report(msg: Message, result: dict[str, Any]) -> None:
    """After the day's jobs: tell ``reports_ready`` where the reports are."""
    report = {"day": msg.json()["day"], "output": OUTPUT, "job_id": "session", **result}
    await producer_for(msg).publish_json(REPORTS_TOPIC, report)


@spark_session_task(
    "clicks_batches", channel="sessionize", max_in_flight=2, max_attempts=3, timeout=600,
    on_success=publish_report,
)  # fmt: skip
def sessionize(msg: Message, spark: SparkSession) -> dict[str, Any]:
    """Sessionize one batch's day in the worker's session; returns counts and seconds."""
    body = msg.json()
    if not isinstance(body, dict) or "day" not in body or "input" not in body:
        raise Reject(f"expected {{'day': ..., 'input': ...}}, got {body!r}")
    started = time.monotonic()
    rows = sessionize_day(spark, str(body["input"]), str(body["day"]), OUTPUT)
    return {"rows": rows, "seconds": round(time.monotonic() - started, 2)}
