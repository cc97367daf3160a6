"""The three sinks against real brokers and real Spark: a RabbitMQ stream's 1,000
bodies published to each broker twice, the second time from a fresh checkpoint (batch 0
again, with the same dedup ids): RabbitMQ Streams and JetStream store each once (their
deduplication), NSQ gets each twice (at least once, no deduplication)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import Settings
from nsqworker.spark.streaming.jetstream import SequenceRange, read_sequences, stream_state
from nsqworker.spark.streaming.rabbitmq import StreamRange, read_range
from nsqworker.spark.streaming.stream_wire import StreamReadConnection
from nsqworker.testing import NsqdProcess
from tests.spark import session_cases as cases
from tests.spark.streaming_cases import bodies, driver_env, publish_rabbitmq

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]
APP = Path(__file__).parent / "apps" / "sink_query.py"


def test_each_sink_publishes_and_deduplicates_where_the_broker_can(
    rabbitmq: str, nats_server: Any, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    cases.need_java()
    name = f"sink{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_rabbitmq(rabbitmq, name, bodies(0, 1_000), create=True))
    asyncio.run(make_nats_stream(nats_server.url, name))
    nsqd.create_channel(name, "check")
    sinks = [
        ("rabbitmq-stream", {"stream": f"{name}_out"}),
        ("nats", {"subject": f"{name}.out"}),
        ("nsq", {"topic": name}),
    ]
    env = driver_env({
        "NSQWORKER_RABBITMQ_STREAM_URI": rabbitmq,
        "NSQWORKER_NATS_SERVERS": nats_server.url,
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
    })  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(APP), name, json.dumps(sinks), str(tmp_path)],
        env=env, capture_output=True, timeout=360, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]

    settings = Settings(rabbitmq_stream_uri=rabbitmq, nats_servers=[nats_server.url])
    with StreamReadConnection(settings) as connection:
        first, end = connection.offsets(f"{name}_out")
    out = [r["body"] for b in read_range(settings, StreamRange(f"{name}_out", first, end))
           for r in b.to_pylist()]  # fmt: skip
    assert sorted(out) == bodies(0, 1_000)  # the second run's copies were dropped

    first, end, subjects = asyncio.run(stream_state(settings, name))
    out = [r["body"] for b in read_sequences(settings, SequenceRange(name, subjects, first, end))
           for r in b.to_pylist()]  # fmt: skip
    assert sorted(out) == bodies(0, 1_000)

    stats = nsqd.channel_stats(name, "check") or {}
    assert stats.get("depth") == 2_000  # NSQ: at least once, no deduplication
    assert Counter(nsqd_bodies(nsqd, name)) == Counter(bodies(0, 1_000) * 2)


async def make_nats_stream(url: str, name: str) -> None:
    import nats

    client = await nats.connect(url)
    try:
        await client.jetstream().add_stream(name=name, subjects=[f"{name}.*"])
    finally:
        await client.close()


def nsqd_bodies(nsqd: NsqdProcess, topic: str) -> list[bytes]:
    from nsqworker.spark.streaming.nsq_held import HeldConsumer
    from tests.spark.streaming_cases import wait

    settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
    consumer = HeldConsumer(settings, [nsqd.tcp_address], topic, "check", hold=2_500)
    try:
        wait(lambda: consumer.received >= 2_000, 30, "2,000 NSQ messages")
        return [m.body for m in consumer.messages(0, consumer.received)]
    finally:
        consumer.finish(consumer.received)
        consumer.close()
