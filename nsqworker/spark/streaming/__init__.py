"""The brokers as Spark Structured Streaming sources (pyspark 4.1's Python data sources).

>>> from nsqworker.spark.streaming import register
>>> register(spark)                                      # doctest: +SKIP
>>> clicks = spark.readStream.format("rabbitmq-stream").option("stream", "clicks").load()

======================= ============================ =================================
format                  offsets                      guarantee with a checkpointed sink
======================= ============================ =================================
``rabbitmq-stream``     the stream's offsets         exactly once
``nats``                JetStream stream sequences   exactly once
``nsq``                 messages this driver holds   at least once (FIN after the commit)
======================= ============================ =================================

Every source yields the same columns (:mod:`nsqworker.spark.streaming.columns`) and
reads its connection from the workers' settings (``NSQWORKER_*`` in the environment, the
settings file); options that would carry a credential are refused, since Spark shows a
query's options in its plans.
"""

from __future__ import annotations

from typing import Any

from nsqworker.spark.streaming.columns import SCHEMA_DDL

__all__ = ["FORMATS", "SCHEMA_DDL", "register"]

FORMATS = ("rabbitmq-stream", "nats", "nsq")
"""The formats :func:`register` adds."""


def register(spark: Any) -> None:
    """Register every broker format with ``spark`` (a SparkSession, local or Spark
    Connect): ``spark.readStream.format(name)`` then finds them."""
    from nsqworker.spark.streaming.jetstream import NatsSource
    from nsqworker.spark.streaming.nsq_source import NsqSource
    from nsqworker.spark.streaming.rabbitmq import RabbitStreamSource

    for source in (RabbitStreamSource, NatsSource, NsqSource):
        spark.dataSource.register(source)
