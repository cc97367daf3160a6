"""``spark.readStream.format("nsq")``: an NSQ topic's channel as a Spark source, at least
once.

The driver's consumer (:mod:`nsqworker.spark.streaming.nsq_held`) holds what it
receives; a batch is a range of the messages it counted, shipped to one Spark task, and
FINed when Spark commits the batch. After a crash, the replayed batch is empty (its
messages were held by the dead driver) and nsqd delivers them again once its message
timeout passes, with ``attempts`` one higher, in a later batch: rows of the interrupted
batch may appear twice when the sink had committed them; nothing is lost and nothing
is FINed early.

Options: ``topic``, ``channel`` (default ``spark``), ``maxRecordsPerBatch`` (default
1000), ``maxInFlight`` (messages held per nsqd, default 2500, at most nsqd's
``--max-rdy-count``). The nsqd are found as the worker finds them, once at start: those
of ``nsqd_tcp_addresses`` and those ``lookupd_http_addresses`` list for the topic, with
the worker's trust rules (AUTH to an nsqd nsqlookupd listed only over TLS, unless
``lookupd_auth_without_tls``; see :mod:`nsqworker.spark.streaming.nsq_held`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.names import check_channel, check_topic
from nsqworker.spark.streaming.columns import SCHEMA_DDL, Rows
from nsqworker.spark.streaming.nsq_held import HeldConsumer, HeldMessage
from nsqworker.spark.streaming.options import SourceOptions, load_settings
from nsqworker.spark.streaming.sinks import BrokerStreamWriter

if TYPE_CHECKING:
    import pyarrow as pa

    from nsqworker.settings import Settings

__all__ = ["HeldBatch", "NsqSource", "NsqStreamReader"]

log = get_logger("nsqworker.spark.streaming")
FORMAT = "nsq"


@dataclass(frozen=True)
class HeldBatch(InputPartition):
    """A batch's messages, shipped to the Spark task that turns them into rows."""

    topic: str
    messages: tuple[HeldMessage, ...]


class NsqSource(DataSource):
    """The ``nsq`` format (at least once): see the module's docstring for its options."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> NsqStreamReader:
        raw = {k.lower(): str(v) for k, v in self.options.items()}
        options = SourceOptions.parse(
            {k: v for k, v in raw.items() if k not in ("channel", "maxinflight")}
            | {"maxRecordsPerBatch": raw.get("maxrecordsperbatch", "1000")},
            FORMAT, ("topic",),
        )  # fmt: skip
        check_topic(options.topic)
        channel = check_channel(raw.get("channel", "spark"))
        hold = int(raw.get("maxinflight", "2500"))
        if hold < 1:
            raise ConfigurationError(f"{FORMAT}: maxInFlight must be at least 1; got {hold}")
        return NsqStreamReader(options, channel, hold, load_settings())

    def streamWriter(self, schema: Any, overwrite: bool) -> BrokerStreamWriter:
        """The sink (:mod:`nsqworker.spark.streaming.sinks`)."""
        return BrokerStreamWriter(FORMAT, self.options, load_settings())


class NsqStreamReader(DataSourceStreamReader):
    """Counts and holds messages on the driver; a batch is a range of that count."""

    def __init__(self, options: SourceOptions, channel: str, hold: int, settings: Settings) -> None:
        self.options, self.channel, self.hold, self.settings = options, channel, hold, settings
        self.session = uuid.uuid4().hex
        self._consumer: HeldConsumer | None = None
        self._planned = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    @property
    def consumer(self) -> HeldConsumer:
        if self._consumer is None:
            self._consumer = HeldConsumer(  # finds the nsqd as the worker does
                self.settings, None, self.options.topic, self.channel, self.hold
            )
        if self._consumer.error is not None:
            error, self._consumer = self._consumer.error, None
            raise ConnectionError(f"{FORMAT}: lost nsqd ({error}); held messages go back")
        return self._consumer

    def _mine(self, offset: dict[str, Any]) -> int | None:
        """The count in ``offset`` when this process made it, else None."""
        return int(offset["n"]) if offset.get("session") == self.session else None

    def initialOffset(self) -> dict[str, Any]:
        self.consumer  # noqa: B018  (subscribe now: messages arrive while Spark plans)
        return {"session": self.session, "n": 0}

    def latestOffset(self) -> dict[str, Any]:
        received = self.consumer.received
        cap = self.options.max_per_batch
        end = min(received, self._planned + cap) if cap else received
        return {"session": self.session, "n": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[HeldBatch]:
        last = self._mine(end)
        if last is None:
            log.info("nsq batch of a previous driver: its messages were delivered again")
            return []
        first = self._mine(start) or 0
        self._planned = last
        messages = self.consumer.messages(first, last)
        return [HeldBatch(self.options.topic, tuple(messages))] if messages else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, HeldBatch)
        rows = Rows(partition.topic)
        for m in partition.messages:
            rows.add(m.body, None, m.id, m.timestamp_ns // 1000, attempts=m.attempts)
        if len(rows):
            yield rows.batch()

    def commit(self, end: dict[str, Any]) -> None:
        last = self._mine(end)
        if last is not None:
            self.consumer.finish(last)

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
