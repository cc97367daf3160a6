"""The columns every broker source yields, and Arrow batches of them.

=========== ======================= ==================================================
column      type                    RabbitMQ Streams / NATS JetStream / NSQ
=========== ======================= ==================================================
topic       string                  the stream / the stream / the topic
key         string                  AMQP ``subject`` property / the subject / null
body        binary                  the message's body, as published
offset      bigint                  the stream offset / the stream sequence / null
id          string                  the offset / ``Nats-Msg-Id`` or the sequence / the
                                    message id nsqd gave
timestamp   timestamp               when the broker stored it
attempts    int                     ``x-attempts`` or 1 / 1 / nsqd's attempts
headers     map<string,string>      application properties / headers / empty
=========== ======================= ==================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SCHEMA_DDL", "Rows", "arrow_schema"]

SCHEMA_DDL = (
    "topic string, key string, body binary, offset bigint, id string, "
    "timestamp timestamp, attempts int, headers map<string,string>"
)
"""The sources' schema as Spark DDL (what ``DataSource.schema`` returns)."""


def arrow_schema() -> pa.Schema:
    """The same schema in Arrow (timestamps in microseconds, UTC, as Spark's)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("topic", pa.string()),
            ("key", pa.string()),
            ("body", pa.binary()),
            ("offset", pa.int64()),
            ("id", pa.string()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("attempts", pa.int32()),
            ("headers", pa.map_(pa.string(), pa.string())),
        ]
    )


class Rows:
    """Columns filled a row at a time (:meth:`add`, :meth:`add_plain`) or an Arrow array
    of bodies at a time (:meth:`add_bodies`), handed out as one ``pyarrow.RecordBatch``
    in the order they were added."""

    __slots__ = (
        "_batches", "_bytes", "_count", "_segments", "attempts", "bodies", "headers", "ids",
        "keys", "offsets", "stamps", "topic",
    )  # fmt: skip

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self._batches: list[pa.RecordBatch] = []
        self._segments: list[tuple[pa.Array, int, int]] = []  # bodies, first offset, stamp
        self._count = 0
        self._bytes = 0
        self._rows()

    def _rows(self) -> None:
        self.keys: list[str | None] = []
        self.bodies: list[bytes] = []
        self.offsets: list[int | None] = []
        self.ids: list[str | None] = []
        self.stamps: list[int] = []  # microseconds since the epoch
        self.attempts: list[int] = []
        self.headers: list[Mapping[str, str] | None] = []

    def __len__(self) -> int:
        return self._count

    @property
    def body_bytes(self) -> int:
        """The bodies' bytes so far (to bound a batch's size, not only its rows)."""
        return self._bytes

    def add(
        self,
        body: bytes,
        offset: int | None,
        id: str | None,
        stamp_us: int,
        *,
        key: str | None = None,
        attempts: int = 1,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """One row."""
        if self._segments:
            self._flush_segments()
        self.bodies.append(body)
        self.offsets.append(offset)
        self.ids.append(id)
        self.stamps.append(stamp_us)
        self.keys.append(key)
        self.attempts.append(attempts)
        self.headers.append(headers)
        self._count += 1
        self._bytes += len(body)

    def add_plain(self, bodies: list[bytes], first_offset: int, stamp_us: int) -> None:
        """Rows of consecutive offsets from ``first_offset`` with no key, headers or
        retries (a stream chunk's usual records), added a list at a time."""
        if self._segments:
            self._flush_segments()
        n = len(bodies)
        offsets = range(first_offset, first_offset + n)
        self.bodies += bodies
        self.offsets += offsets
        self.ids += map(str, offsets)
        self.stamps += [stamp_us] * n
        self.keys += [None] * n
        self.attempts += [1] * n
        self.headers += [None] * n
        self._count += n
        self._bytes += sum(map(len, bodies))

    def add_bodies(self, bodies: pa.Array, first_offset: int, stamp_us: int) -> None:
        """Like :meth:`add_plain`, with the bodies already an Arrow binary array: the
        other columns are built for the whole batch by Arrow, not a row at a time."""
        if self.bodies:
            self._flush_rows()
        self._segments.append((bodies, first_offset, stamp_us))
        self._count += len(bodies)
        if len(bodies):
            import pyarrow.compute as pc

            self._bytes += pc.sum(pc.binary_length(bodies)).as_py()

    def batch(self) -> pa.RecordBatch:
        """The rows so far as a RecordBatch; the buffer is emptied."""
        import pyarrow as pa

        self._flush_rows()
        self._flush_segments()
        batches, self._batches, self._count, self._bytes = self._batches, [], 0, 0
        if len(batches) == 1:
            return batches[0]
        table = pa.Table.from_batches(batches, schema=arrow_schema()).combine_chunks()
        combined = table.to_batches()
        return combined[0] if combined else pa.RecordBatch.from_pylist([], arrow_schema())

    def _flush_rows(self) -> None:
        if not self.bodies:
            return
        import pyarrow as pa

        schema = arrow_schema()
        n = len(self.bodies)
        columns: list[Any] = [
            pa.array([self.topic] * n, pa.string()),
            pa.array(self.keys, pa.string()),
            pa.array(self.bodies, pa.binary()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.ids, pa.string()),
            pa.array(self.stamps, pa.int64()).cast(schema.field("timestamp").type),
            pa.array(self.attempts, pa.int32()),
            self._headers(pa),
        ]
        self._batches.append(pa.RecordBatch.from_arrays(columns, schema=schema))
        self._rows()

    def _flush_segments(self) -> None:
        if not self._segments:
            return
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = arrow_schema()
        counts = np.array([len(b) for b, _, _ in self._segments], np.int64)
        firsts = np.array([f for _, f, _ in self._segments], np.int64)
        stamps = np.array([s for _, _, s in self._segments], np.int64)
        n = int(counts.sum())
        begins = np.cumsum(counts) - counts  # each segment's first row in the batch
        offsets = pa.array(np.repeat(firsts - begins, counts) + np.arange(n, dtype=np.int64))
        bodies = pa.concat_arrays([b for b, _, _ in self._segments])
        columns: list[Any] = [
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.nulls(n, pa.string()),
            bodies.cast(pa.binary()),
            offsets,
            pc.cast(offsets, pa.string()),
            pa.array(np.repeat(stamps, counts)).cast(schema.field("timestamp").type),
            pa.repeat(pa.scalar(1, pa.int32()), n),
            pa.MapArray.from_arrays(
                pa.array(np.zeros(n + 1, np.int32)),
                pa.array([], pa.string()),
                pa.array([], pa.string()),
            ),
        ]
        self._batches.append(pa.RecordBatch.from_arrays(columns, schema=schema))
        self._segments = []

    def _headers(self, pa: Any) -> pa.MapArray:
        offsets = [0]
        keys: list[str] = []
        values: list[str] = []
        for entry in self.headers:
            if entry:
                keys += entry.keys()
                values += entry.values()
            offsets.append(len(keys))
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            pa.array(keys, pa.string()),
            pa.array(values, pa.string()),
        )
