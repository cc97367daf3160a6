"""The rabbitmq-stream source's reading without Spark, against a real RabbitMQ: the
stream's offsets, a range read as Arrow batches across chunks, holes and partitions."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from nsqworker.errors import ConfigurationError
from nsqworker.settings import Settings
from nsqworker.spark.streaming.jetstream import (
    SequenceRange,
    StreamMissing,
    read_sequences,
    stream_state,
)
from nsqworker.spark.streaming.options import SourceOptions
from nsqworker.spark.streaming.rabbitmq import StreamRange, read_range, split_range
from nsqworker.spark.streaming.stream_wire import StreamError, StreamReadConnection
from tests.spark.streaming_cases import bodies, publish_nats, publish_rabbitmq

pytestmark = [pytest.mark.integration]


def test_offsets_and_a_range_read_as_arrow(rabbitmq: str) -> None:
    settings = Settings(rabbitmq_stream_uri=rabbitmq)
    stream = f"wire_{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_rabbitmq(rabbitmq, stream, bodies(0, 1_234), create=True))
    with StreamReadConnection(settings) as connection:
        assert connection.offsets(stream) == (0, 1_234)
        with pytest.raises(StreamError, match="does not exist"):
            connection.offsets(stream + "_missing")
    parts = split_range(stream, 100, 1_234, 3)
    assert [(p.start, p.end) for p in parts] == [(100, 478), (478, 856), (856, 1_234)]
    rows = [row for p in parts for b in read_range(settings, p) for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(100, 1_234))
    assert [r["body"] for r in rows] == bodies(100, 1_234)
    assert rows[0]["topic"] == stream and rows[0]["key"] is None and rows[0]["headers"] == []
    one = list(read_range(settings, StreamRange(stream, 500, 501)))
    assert [r["body"] for b in one for r in b.to_pylist()] == [b"click-00500"]


def test_options_are_checked_and_credentials_refused() -> None:
    parse = SourceOptions.parse
    assert parse({"stream": "s"}, "f", ("stream",)) == SourceOptions("s", "earliest", 0, 2)
    assert parse({"STREAM": "s", "startingoffsets": "42"}, "f", ("stream",)).starting == 42
    with pytest.raises(ConfigurationError, match="set the option 'stream'"):
        parse({}, "f", ("stream",))
    with pytest.raises(ConfigurationError, match="maxRecordsPerBatch must be a whole number"):
        parse({"stream": "s", "maxRecordsPerBatch": "lots"}, "f", ("stream",))
    with pytest.raises(ConfigurationError, match=r"'password'.*environment"):
        parse({"stream": "s", "password": "hunter2"}, "f", ("stream",))


def test_jetstream_sequences_read_as_arrow(nats_server: Any) -> None:
    settings = Settings(nats_servers=[nats_server.url])
    stream = f"wire{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_nats(nats_server.url, stream, bodies(0, 1_500), create=True))
    assert asyncio.run(stream_state(settings, stream)) == (1, 1_501, (f"{stream}.*",))
    with pytest.raises(StreamMissing, match="does not exist"):
        asyncio.run(stream_state(settings, stream + "missing"))
    parts = [SequenceRange(stream, (f"{stream}.*",), a, b) for a, b in ((1, 700), (700, 1_501))]
    rows = [row for p in parts for b in read_sequences(settings, p) for row in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(1, 1_501))
    assert [r["body"] for r in rows] == bodies(0, 1_500)
    assert rows[0]["key"] == f"{stream}.click" and rows[0]["id"] == "1"
    one = SequenceRange(stream, (f"{stream}.*",), 5, 6)
    assert [r["body"] for b in read_sequences(settings, one) for r in b.to_pylist()] == [
        bodies(4, 5)[0]
    ]


def test_nsq_messages_are_held_until_finished(nsqd: Any) -> None:
    """The driver's NSQ consumer holds at most maxInFlight messages, FINs only what it is
    told to, and a closed consumer gives the rest back to nsqd."""
    from nsqworker.spark.streaming.nsq_held import HeldConsumer
    from tests.spark.streaming_cases import wait

    topic = f"held{uuid.uuid4().hex[:8]}"
    nsqd.create_channel(topic, "spark")
    nsqd.mpublish(topic, bodies(0, 100))
    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    consumer = HeldConsumer(settings, [nsqd.tcp_address], topic, "spark", hold=40)
    try:
        wait(lambda: consumer.received == 40, 10, "40 held")
        assert fins(nsqd, topic) == 0
        assert [m.body for m in consumer.messages(0, 40)] == bodies(0, 40)
        assert consumer.finish(25) == 25
        wait(lambda: consumer.received == 65, 10, "25 more once 25 were FINed")
        assert fins(nsqd, topic) == 25
    finally:
        consumer.close()
    wait(
        lambda: nsqd.depth(topic, "spark") == 75,
        10,
        f"the held 40 back in nsqd: {nsqd.channel_stats(topic, 'spark')}",
    )


def fins(nsqd: Any, topic: str) -> int:
    clients = (nsqd.channel_stats(topic, "spark") or {}).get("clients") or []
    return sum(c.get("finish_count", 0) for c in clients)
