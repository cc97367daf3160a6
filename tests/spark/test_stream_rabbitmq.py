"""The ``rabbitmq-stream`` Spark source against a real RabbitMQ and real Spark: exactly
once into Parquet across a kill -9 of the driver mid-batch."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from nsqworker.settings import Settings
from nsqworker.streams.client import Endpoint
from tests.spark.streaming_cases import Driver, wait_for_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


async def publish(uri: str, stream: str, bodies: list[bytes], create: bool = False) -> None:
    from rstream import AMQPMessage, Producer

    e = Endpoint.from_settings(Settings(rabbitmq_stream_uri=uri))
    async with Producer(host=e.host, port=e.port, vhost=e.vhost, username=e.username,
                        password=e.password) as producer:  # fmt: skip
        if create:
            await producer.create_stream(stream)
        for at in range(0, len(bodies), 500):
            await producer.send_batch(stream, [AMQPMessage(body=b) for b in bodies[at : at + 500]])


def bodies(start: int, stop: int) -> list[bytes]:
    return [b"click-%05d" % i for i in range(start, stop)]


def test_exactly_once_across_a_kill_mid_batch(rabbitmq: str, tmp_path: Path) -> None:
    """10,000 published; the query's driver is kill -9'd (with its JVM) while a batch is
    planned and not committed; restarted from the checkpoint (the batch replayed, later
    ones at most 2,000 rows); 5,000 more: 15,000 rows, each offset and body once."""
    stream = f"spark_{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(rabbitmq, stream, bodies(0, 10_000), create=True))
    options = {"stream": stream, "maxRecordsPerBatch": "2000", "numPartitions": "2"}
    driver = Driver(tmp_path, "rabbitmq-stream", options,
                    {"NSQWORKER_RABBITMQ_STREAM_URI": rabbitmq})  # fmt: skip
    try:
        driver.start()
        driver.kill_mid_batch()
        driver.start()
        rows = wait_for_rows(driver, 10_000)
        asyncio.run(publish(rabbitmq, stream, bodies(10_000, 15_000)))
        rows = wait_for_rows(driver, 15_000)
    finally:
        driver.stop()
    check_exactly_once(rows, stream, 15_000)


def check_exactly_once(rows: list[dict[str, Any]], stream: str, count: int) -> None:
    assert len(rows) == count, f"{len(rows)} rows, not {count}"
    assert sorted(r["body"] for r in rows) == bodies(0, count)
    offsets = [r["offset"] for r in rows]
    assert len(set(offsets)) == count
    assert {r["topic"] for r in rows} == {stream}
    assert all(r["id"] == str(r["offset"]) and r["attempts"] == 1 for r in rows)
    assert all(r["timestamp"] is not None and r["headers"] == [] for r in rows)
    by_offset = sorted(rows, key=lambda r: r["offset"])
    assert [r["body"] for r in by_offset] == bodies(0, count)  # offsets in publish order
