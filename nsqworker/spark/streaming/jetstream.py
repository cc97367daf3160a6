"""``spark.readStream.format("nats")``: a NATS JetStream stream as a Spark source.

Offsets are the stream's sequences: a batch is ``[start, end)``, split into
``numPartitions`` ranges; each Spark task reads its range with an ephemeral pull
consumer of its own (no acks, starting at the range's first sequence, in memory, gone a
minute after the task). A sequence holds the same message on every read, so a batch
replayed after a crash reads the same rows: exactly once with a checkpointed sink.
Sequences deleted from the stream (``max_age``, ``max_msgs``, a purge) are skipped; a
range that starts before the stream's first sequence starts at it, with a warning.

The connection is the workers' (``nats_servers``, credentials, TLS from ``Settings``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from nsqworker.errors import NSQWorkerError
from nsqworker.logging import get_logger
from nsqworker.nats.client import NatsConnection
from nsqworker.spark.streaming.columns import SCHEMA_DDL, Rows
from nsqworker.spark.streaming.options import SourceOptions, load_settings
from nsqworker.spark.streaming.sinks import BrokerStreamWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from nsqworker.settings import Settings

__all__ = ["NatsSource", "NatsStreamReader", "SequenceRange"]

log = get_logger("nsqworker.spark.streaming")
FORMAT = "nats"
FETCH = 1000
"""Messages asked for in one pull."""
FETCH_WAIT = 2.0
BATCH_ROWS = 16384


class StreamMissing(NSQWorkerError):
    """The JetStream stream does not exist."""


@dataclass(frozen=True)
class SequenceRange(InputPartition):
    """Sequences ``[start, end)`` of ``stream``: one Spark task's share of a batch."""

    stream: str
    subjects: tuple[str, ...]
    start: int
    end: int


class NatsSource(DataSource):
    """The ``nats`` format: options ``stream``, ``startingOffsets`` (``earliest``,
    ``latest`` or a sequence), ``maxRecordsPerBatch``, ``numPartitions``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> NatsStreamReader:
        options = SourceOptions.parse(self.options, FORMAT, ("stream",))
        return NatsStreamReader(options, load_settings())

    def streamWriter(self, schema: Any, overwrite: bool) -> BrokerStreamWriter:
        """The sink (:mod:`nsqworker.spark.streaming.sinks`)."""
        return BrokerStreamWriter(FORMAT, self.options, load_settings())


async def _connect(settings: Settings) -> NatsConnection:
    connection = NatsConnection(settings, name="nsqworker-spark")
    await connection.get()
    return connection


async def stream_state(settings: Settings, stream: str) -> tuple[int, int, tuple[str, ...]]:
    """``(first, end, subjects)``: the first sequence kept, the sequence after the last,
    and the subjects the stream stores."""
    from nats.js.errors import NotFoundError

    connection = await _connect(settings)
    try:
        try:
            assert connection.js is not None
            info = await connection.js.stream_info(stream)
        except NotFoundError:
            raise StreamMissing(f"NATS JetStream stream {stream!r} does not exist") from None
        state = info.state
        end = int(state.last_seq) + 1
        first = max(int(state.first_seq), 1) if state.messages else end
        return first, end, tuple(info.config.subjects or ())
    finally:
        await connection.close()


class NatsStreamReader(DataSourceStreamReader):
    """Plans batches on the driver (stream info) and reads ranges in the workers."""

    def __init__(self, options: SourceOptions, settings: Settings) -> None:
        self.options = options
        self.settings = settings
        self._planned: int | None = None
        self._subjects: tuple[str, ...] = ()

    def _state(self) -> tuple[int, int]:
        first, end, self._subjects = asyncio.run(stream_state(self.settings, self.options.topic))
        return first, end

    def initialOffset(self) -> dict[str, int]:
        first, end = self._state()
        starting = self.options.starting
        offset = first if starting == "earliest" else end if starting == "latest" else int(starting)
        return {"sequence": offset}

    def latestOffset(self) -> dict[str, int]:
        _, end = self._state()
        cap = self.options.max_per_batch
        if cap and self._planned is not None:
            end = min(end, self._planned + cap)
        return {"sequence": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[SequenceRange]:
        first, last = int(start["sequence"]), int(end["sequence"])
        self._planned = last
        if last <= first:
            return []
        if not self._subjects:
            self._state()
        parts = max(1, min(self.options.partitions, last - first))
        step, extra = divmod(last - first, parts)
        out, at = [], first
        for i in range(parts):
            size = step + (1 if i < extra else 0)
            out.append(SequenceRange(self.options.topic, self._subjects, at, at + size))
            at += size
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SequenceRange)
        return read_sequences(self.settings, partition)

    def commit(self, end: dict[str, int]) -> None:
        if self._planned is None:
            self._planned = int(end["sequence"])


def read_sequences(settings: Settings, part: SequenceRange) -> Iterator[pa.RecordBatch]:
    """The messages at sequences ``[part.start, part.end)`` as Arrow batches."""
    loop = asyncio.new_event_loop()
    reader = _RangeReader(settings, part)
    try:
        loop.run_until_complete(reader.open())
        while True:
            batch = loop.run_until_complete(reader.next_batch())
            if batch is None:
                return
            yield batch
    finally:
        loop.run_until_complete(reader.close())
        loop.close()


class _RangeReader:
    def __init__(self, settings: Settings, part: SequenceRange) -> None:
        self.settings, self.part = settings, part
        self.connection: NatsConnection | None = None
        self.subscription: Any = None
        self.done = False
        self.first = True

    async def open(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        self.connection = await _connect(self.settings)
        assert self.connection.js is not None
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.part.start,
            ack_policy=AckPolicy.NONE, inactive_threshold=60.0, mem_storage=True,
            num_replicas=1, filter_subjects=list(self.part.subjects) or None,
        )  # fmt: skip
        subject = self.part.subjects[0] if len(self.part.subjects) == 1 else ">"
        if len(self.part.subjects) == 1:
            config.filter_subjects = None
        self.subscription = await self.connection.js.pull_subscribe(
            subject, stream=self.part.stream, config=config
        )

    async def next_batch(self) -> pa.RecordBatch | None:
        from nats.errors import TimeoutError as NatsTimeout

        rows = Rows(self.part.stream)
        while not self.done and len(rows) < BATCH_ROWS:
            try:
                messages = await self.subscription.fetch(FETCH, timeout=FETCH_WAIT)
            except (NatsTimeout, TimeoutError):
                self.done = await self._nothing_pending()
                continue
            for msg in messages:
                if self._add(rows, msg):
                    self.done = True
                    break
        return rows.batch() if len(rows) else None

    def _add(self, rows: Rows, msg: Any) -> bool:
        """Add ``msg`` when it is in the range; True when the range is complete."""
        meta = msg.metadata
        seq = int(meta.sequence.stream)
        if self.first and seq > self.part.start:
            log.info("sequences skipped (deleted from the stream)", stream=self.part.stream,
                     missing_from=self.part.start, missing_to=seq - 1)  # fmt: skip
        self.first = False
        if seq >= self.part.end:
            return True
        headers = dict(msg.headers or {})
        stamp = int(meta.timestamp.timestamp() * 1_000_000)
        rows.add(msg.data, seq, headers.get("Nats-Msg-Id") or str(seq), stamp,
                 key=msg.subject, headers=headers)  # fmt: skip
        # nothing pending after it: the rest of the range was deleted
        return seq == self.part.end - 1 or int(meta.num_pending) == 0

    async def _nothing_pending(self) -> bool:
        info = await self.subscription.consumer_info()
        return int(info.num_pending) == 0

    async def close(self) -> None:
        if self.subscription is not None:
            try:
                await self.subscription.unsubscribe()
            except Exception:
                pass
        if self.connection is not None:
            await self.connection.close()
