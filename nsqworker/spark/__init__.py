"""Spark jobs from messages (docs/spark.md).

::

    from nsqworker import Message
    from nsqworker.spark import SparkJob, spark_task

    @spark_task("reports", channel="spark", max_attempts=3)
    def daily_report(msg: Message) -> SparkJob:
        return SparkJob(app="jobs/daily_report.py", args=["--day", msg.json()["day"]])

The runner is chosen by ``Settings.spark_runner``: ``local`` (spark-submit of the
installed pyspark, the default) or ``kubernetes`` (a SparkApplication).

``@spark_session_task`` runs a handler ``def f(msg, spark)`` in the worker process's
long-lived SparkSession instead: a local driver, or Spark Connect (``spark_remote``).
"""

from nsqworker.spark.job import (
    JobContext,
    JobResult,
    JobState,
    SecretRef,
    SparkJob,
    SparkJobFailed,
    job_problems,
)
from nsqworker.spark.runner import Runner, runner_for
from nsqworker.spark.session import SessionHolder, holder_for
from nsqworker.spark.session_task import spark_session_task
from nsqworker.spark.task import run_spark_job, spark_task

__all__ = [
    "JobContext",
    "JobResult",
    "JobState",
    "Runner",
    "SecretRef",
    "SessionHolder",
    "SparkJob",
    "SparkJobFailed",
    "holder_for",
    "job_problems",
    "run_spark_job",
    "runner_for",
    "spark_session_task",
    "spark_task",
]
