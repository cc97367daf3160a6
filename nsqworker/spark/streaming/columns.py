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
    """Columns filled a row at a time, handed out as one ``pyarrow.RecordBatch``."""

    __slots__ = ("attempts", "bodies", "headers", "ids", "keys", "offsets", "stamps", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.keys: list[str | None] = []
        self.bodies: list[bytes] = []
        self.offsets: list[int | None] = []
        self.ids: list[str | None] = []
        self.stamps: list[int] = []  # microseconds since the epoch
        self.attempts: list[int] = []
        self.headers: list[Mapping[str, str] | None] = []

    def __len__(self) -> int:
        return len(self.bodies)

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
        self.bodies.append(body)
        self.offsets.append(offset)
        self.ids.append(id)
        self.stamps.append(stamp_us)
        self.keys.append(key)
        self.attempts.append(attempts)
        self.headers.append(headers)

    def add_plain(self, bodies: list[bytes], first_offset: int, stamp_us: int) -> None:
        """Rows of consecutive offsets from ``first_offset`` with no key, headers or
        retries (a stream chunk's usual records), added a list at a time."""
        n = len(bodies)
        offsets = range(first_offset, first_offset + n)
        self.bodies += bodies
        self.offsets += offsets
        self.ids += map(str, offsets)
        self.stamps += [stamp_us] * n
        self.keys += [None] * n
        self.attempts += [1] * n
        self.headers += [None] * n

    def batch(self) -> pa.RecordBatch:
        """The rows so far as a RecordBatch; the buffer is emptied."""
        import pyarrow as pa

        schema = arrow_schema()
        n = len(self.bodies)
        headers = self._headers(pa)
        columns: list[Any] = [
            pa.array([self.topic] * n, pa.string()),
            pa.array(self.keys, pa.string()),
            pa.array(self.bodies, pa.binary()),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.ids, pa.string()),
            pa.array(self.stamps, pa.int64()).cast(schema.field("timestamp").type),
            pa.array(self.attempts, pa.int32()),
            headers,
        ]
        self.__init__(self.topic)  # type: ignore[misc]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

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
