"""Spark jobs from messages (docs/spark.md).

::

    from nsqworker import Message
    from nsqworker.spark import SparkJob, spark_task

    @spark_task("reports", channel="spark", max_attempts=3)
    def daily_report(msg: Message) -> SparkJob:
        return SparkJob(app="jobs/daily_report.py", args=["--day", msg.json()["day"]])

The runner is chosen by ``Settings.spark_runner``: ``local`` (spark-submit of the
installed pyspark, the default) or ``kubernetes`` (a SparkApplication).
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
from nsqworker.spark.task import run_spark_job, spark_task

__all__ = [
    "JobContext",
    "JobResult",
    "JobState",
    "Runner",
    "SecretRef",
    "SparkJob",
    "SparkJobFailed",
    "job_problems",
    "run_spark_job",
    "runner_for",
    "spark_task",
]
