"""``spark.readStream.format("rabbitmq-stream")``: a RabbitMQ stream as a Spark source.

Offsets are the stream's offsets: a batch is the range ``[start, end)``, split into
``numPartitions`` ranges read by Spark's Python workers, each over its own connection
(subscribe at ``start``, keep the records below ``end``). A stream never changes what
an offset holds, so a batch replayed after a crash reads the same records: with a
checkpointed sink (Parquet, Delta...) each message lands exactly once.

Offsets that hold no message are skipped: the chunks RabbitMQ writes to track consumer
offsets, a deduplicating publisher's gaps. When retention has removed the start of a
range, the read starts at the first retained offset and says so in a warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from nsqworker.logging import get_logger
from nsqworker.spark.streaming.columns import SCHEMA_DDL, Rows
from nsqworker.spark.streaming.options import SourceOptions, load_settings
from nsqworker.spark.streaming.sinks import BrokerStreamWriter
from nsqworker.spark.streaming.stream_wire import StreamReadConnection
from nsqworker.streams import amqp
from nsqworker.streams.client import check_stream

if TYPE_CHECKING:
    import pyarrow as pa

    from nsqworker.settings import Settings

__all__ = ["RabbitStreamReader", "RabbitStreamSource", "StreamRange", "split_range"]

log = get_logger("nsqworker.spark.streaming")
FORMAT = "rabbitmq-stream"
BATCH_ROWS = 65536
"""Rows per Arrow batch handed to Spark (at most)."""
BATCH_BYTES = 64 << 20
"""Body bytes per Arrow batch handed to Spark (at most, give or take a chunk)."""


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """Offsets ``[start, end)`` of ``stream``: one Spark task's share of a batch."""

    stream: str
    start: int
    end: int


def split_range(stream: str, start: int, end: int, parts: int) -> list[StreamRange]:
    """``[start, end)`` in up to ``parts`` contiguous ranges of near-equal size."""
    total = end - start
    if total <= 0:
        return []
    parts = max(1, min(parts, total))
    step, extra = divmod(total, parts)
    out, at = [], start
    for i in range(parts):
        size = step + (1 if i < extra else 0)
        out.append(StreamRange(stream, at, at + size))
        at += size
    return out


class RabbitStreamSource(DataSource):
    """The ``rabbitmq-stream`` format: options ``stream``, ``startingOffsets``
    (``earliest``, ``latest`` or an offset), ``maxRecordsPerBatch``, ``numPartitions``;
    the connection from the workers' settings (``NSQWORKER_RABBITMQ_STREAM_URI``, TLS)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> RabbitStreamReader:
        options = SourceOptions.parse(self.options, FORMAT, ("stream", "topic"))
        check_stream(options.topic, "stream")
        return RabbitStreamReader(options, load_settings())

    def streamWriter(self, schema: Any, overwrite: bool) -> BrokerStreamWriter:
        """The sink (:mod:`nsqworker.spark.streaming.sinks`)."""
        return BrokerStreamWriter(FORMAT, self.options, load_settings())


class RabbitStreamReader(DataSourceStreamReader):
    """Plans batches on the driver (StreamStats) and reads ranges in the workers."""

    def __init__(self, options: SourceOptions, settings: Settings) -> None:
        self.options = options
        self.settings = settings
        self._planned: int | None = None
        self._connection: StreamReadConnection | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_connection"] = None  # a socket stays on the driver
        return state

    def _offsets(self) -> tuple[int, int]:
        """``(first, end)`` of the stream over the driver's connection (reopened once
        when it was lost)."""
        for attempt in (1, 2):
            try:
                if self._connection is None:
                    self._connection = StreamReadConnection(self.settings)
                return self._connection.offsets(self.options.topic)
            except Exception:
                self._drop_connection()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _drop_connection(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def initialOffset(self) -> dict[str, int]:
        first, end = self._offsets()
        starting = self.options.starting
        if starting == "earliest":
            offset = first
        elif starting == "latest":
            offset = end
        else:
            offset = int(starting)
        return {"offset": offset}

    def latestOffset(self) -> dict[str, int]:
        # pyspark 4.1 has no admission control for Python sources: the cap counts from
        # the last batch planned, unknown until the first one after a (re)start.
        _, end = self._offsets()
        cap = self.options.max_per_batch
        if cap and self._planned is not None:
            end = min(end, self._planned + cap)
        return {"offset": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[StreamRange]:
        self._planned = int(end["offset"])
        return split_range(
            self.options.topic, int(start["offset"]), int(end["offset"]), self.options.partitions
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        return read_range(self.settings, partition)

    def commit(self, end: dict[str, int]) -> None:
        if self._planned is None:
            self._planned = int(end["offset"])

    def stop(self) -> None:
        self._drop_connection()


def read_range(settings: Settings, part: StreamRange) -> Iterator[pa.RecordBatch]:
    """The messages at offsets ``[part.start, part.end)`` as Arrow batches."""
    rows = Rows(part.stream)
    with StreamReadConnection(settings) as connection:
        first_seen = True
        for chunk in connection.chunks(part.stream, part.start):
            base = chunk.first_offset
            if first_seen and base > part.start:
                _warn_if_removed(connection, part, base)
            first_seen = False
            if base >= part.end:
                break
            stamp = chunk.timestamp_ms * 1000
            skip = max(part.start - base, 0)
            stop = min(chunk.count, part.end - base)
            bodies = chunk.plain_bodies() if stop > skip else None
            if bodies is not None:  # one data section each: no Python object per record
                rows.add_bodies(bodies.slice(skip, stop - skip), base + skip, stamp)
            elif stop > skip:
                _add_records(rows, chunk.records[skip:stop], base + skip, stamp)
            if len(rows) >= BATCH_ROWS or rows.body_bytes >= BATCH_BYTES:
                yield rows.batch()
            if base + chunk.count >= part.end:
                break
    if len(rows):
        yield rows.batch()


def _warn_if_removed(connection: StreamReadConnection, part: StreamRange, base: int) -> None:
    """The range starts before the first chunk delivered: retention removed offsets when
    they are below the stream's first (else they held no messages: tracking chunks)."""
    first = connection.first_offset(part.stream)
    if part.start < first:
        log.warning(
            "offsets removed by retention: reading from the first retained",
            stream=part.stream, missing_from=part.start, missing_to=first - 1,
        )  # fmt: skip


def _add_records(rows: Rows, records: list[bytes], first: int, stamp: int) -> None:
    decoded = [amqp.decode(r) for r in records]
    if all(type(d) is bytes for d in decoded):
        rows.add_plain(decoded, first, stamp)  # type: ignore[arg-type]
    else:
        for index, item in enumerate(decoded, first):
            _add(rows, item, index, stamp)


def _add(rows: Rows, decoded: bytes | amqp.Decoded, offset: int, stamp: int) -> None:
    if type(decoded) is bytes:
        rows.add(decoded, offset, str(offset), stamp)
        return
    assert isinstance(decoded, amqp.Decoded)
    headers = {_text(k): _text(v) for k, v in decoded.properties.items()}
    if decoded.error is not None:
        headers["x-undecodable"] = decoded.error
    count = decoded.properties.get(b"x-attempts", decoded.properties.get("x-attempts"))
    attempts = count if type(count) is int and count > 1 else 1
    rows.add(decoded.body, offset, str(offset), stamp, attempts=attempts, headers=headers)


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)
