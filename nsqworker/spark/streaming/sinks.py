"""``writeStream.format(...)`` to each broker: at least once, deduplicated where the
broker can.

Each Spark task publishes its rows' ``body`` column (binary or string) with the
workers' producers, and returns once the broker confirmed every message; a batch that
fails is retried by Spark, so a message may be published twice. The brokers that
deduplicate drop those copies, since each row's id depends only on the batch, the task's
partition and the row's place in it (a replayed batch reads the same rows from an
exactly-once source):

============== ================================================ ======================
format         dedup id                                         a replayed batch
============== ================================================ ======================
rabbitmq-      publishing id ``(batch + 1) << 24 | row`` under  stored once
stream         the reference ``<producerName>-p<partition>``
nats           ``Nats-Msg-Id: <producerName>-<batch>-<partition> stored once within the
               -<row>``                                         stream's duplicate window
nsq            none                                             published again
============== ================================================ ======================

Options: ``stream`` / ``subject`` / ``topic`` (where to publish), ``producerName``
(default ``spark-<target>``; keep it when the query restarts, change it for a new
query).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.spark.streaming.options import check_sink_options

if TYPE_CHECKING:
    import pyarrow as pa

    from nsqworker.settings import Settings

__all__ = ["BrokerStreamWriter", "Published"]

log = get_logger("nsqworker.spark.streaming")
CHUNK = 1000
"""Rows published (and confirmed) at a time."""
ROW_BITS = 24
"""Bits of a RabbitMQ publishing id for the row within a task's batch."""
_TARGET = {"rabbitmq-stream": "stream", "nats": "subject", "nsq": "topic"}


@dataclass(frozen=True)
class Published(WriterCommitMessage):
    """What a task published: its partition and the row count."""

    partition: int
    rows: int


class BrokerStreamWriter(DataSourceStreamArrowWriter):
    """The sink of ``format`` (``rabbitmq-stream``, ``nats`` or ``nsq``)."""

    def __init__(self, format: str, options: Mapping[str, str], settings: Settings) -> None:
        check_sink_options(options, format)  # credentials, unknown (misspelt) options
        lowered = {k.lower(): str(v) for k, v in options.items()}
        key = _TARGET[format]
        target = lowered.get(key) or (lowered.get("topic") if format == "rabbitmq-stream" else None)
        if not target:
            raise ConfigurationError(f"{format} sink: set the option {key!r}")
        self.format, self.target, self.settings = format, target, settings
        self.name = lowered.get("producername") or f"spark-{target}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        batch_id = int(
            (context.getLocalProperty("streaming.sql.batchId") if context else None) or 0
        )
        bodies = [_bytes(body) for batch in iterator for body in _column(batch, "body")]
        if bodies:
            asyncio.run(self._publish(bodies, batch_id, partition))
        return Published(partition, len(bodies))

    async def _publish(self, bodies: list[bytes], batch_id: int, partition: int) -> None:
        if len(bodies) >= 1 << ROW_BITS:
            raise ConfigurationError(
                f"{self.format} sink: {len(bodies)} rows in one task; at most {1 << ROW_BITS}"
            )
        if self.format == "rabbitmq-stream":
            await self._rabbitmq(bodies, batch_id, partition)
        elif self.format == "nats":
            await self._nats(bodies, batch_id, partition)
        else:
            await self._nsq(bodies)

    async def _rabbitmq(self, bodies: list[bytes], batch_id: int, partition: int) -> None:
        from nsqworker.streams.producer import StreamProducer

        base = (batch_id + 1) << ROW_BITS
        reference = f"{self.name}-p{partition}"
        async with StreamProducer(settings=self.settings, reference=reference) as producer:
            for at in range(0, len(bodies), CHUNK):
                chunk = bodies[at : at + CHUNK]
                ids = list(range(base + at, base + at + len(chunk)))
                await producer.send(self.target, chunk, publishing_ids=ids)

    async def _nats(self, bodies: list[bytes], batch_id: int, partition: int) -> None:
        from nsqworker.nats.producer import NatsProducer

        prefix = f"{self.name}-{batch_id}-{partition}"
        async with NatsProducer(settings=self.settings) as producer:
            for at in range(0, len(bodies), CHUNK):
                await asyncio.gather(*(
                    producer.publish(self.target, body, msg_id=f"{prefix}-{at + i}")
                    for i, body in enumerate(bodies[at : at + CHUNK])
                ))  # fmt: skip

    async def _nsq(self, bodies: list[bytes]) -> None:
        from nsqworker.nsq.producer import Producer

        async with Producer(settings=self.settings) as producer:
            for at in range(0, len(bodies), CHUNK):
                await producer.publish_many(self.target, bodies[at : at + CHUNK])

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Published))
        log.debug("sink batch committed", format=self.format, target=self.target,
                  batch=batchId, rows=rows)  # fmt: skip

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("sink batch failed; Spark runs it again", format=self.format,
                    target=self.target, batch=batchId)  # fmt: skip


def _column(batch: pa.RecordBatch, name: str) -> list[Any]:
    if name not in batch.schema.names:
        raise ConfigurationError(f"the sink publishes the column {name!r}; the query has none")
    values: list[Any] = batch.column(name).to_pylist()
    return values


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if value is None:
        raise ConfigurationError("a row's body is null; a broker message needs a body")
    raise ConfigurationError(f"a body of type {type(value).__name__}; use binary or string")
