"""A Spark task whose job always fails (tests/cluster, the kubernetes-native runner)."""

from __future__ import annotations

from nsqworker import Message
from nsqworker.spark import SparkJob, spark_task


@spark_task(
    "doomed", channel="spark", max_attempts=2, retry_delay=0.5, dead_letter_topic="doomed.dead"
)
def doomed(msg: Message) -> SparkJob:
    """The failing job of the test image (``/opt/pipeline/jobs/fail.py``)."""
    return SparkJob(app="local:///opt/pipeline/jobs/fail.py", name="doomed", timeout=300)
