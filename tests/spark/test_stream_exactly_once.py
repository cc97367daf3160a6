"""The ``rabbitmq-stream`` and ``nats`` Spark sources against real brokers and real
Spark: exactly once into Parquet across a kill -9 of the driver mid-batch.

One query reads both (their union), so the two sources share the driver's two starts
(about a minute each on a loaded 2-core machine)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.spark.streaming_cases import (
    Driver,
    bodies,
    check_exactly_once,
    publish_nats,
    publish_rabbitmq,
    wait_for_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_exactly_once_across_a_kill_mid_batch(
    rabbitmq: str, nats_server: Any, tmp_path: Path
) -> None:
    """10,000 published to a RabbitMQ stream and to a JetStream stream; the query's
    driver is kill -9'd (with its JVM) while a batch is planned and not committed;
    restarted from the checkpoint (the batch replayed, later ones at most 2,000 rows per
    source); 5,000 more each: 15,000 rows per source, each offset and body once."""
    name = f"spark{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_rabbitmq(rabbitmq, name, bodies(0, 10_000), create=True))
    asyncio.run(publish_nats(nats_server.url, name, bodies(0, 10_000), create=True))
    limits = {"maxRecordsPerBatch": "2000", "numPartitions": "2"}
    sources = [
        ("rabbitmq-stream", {"stream": name, **limits}),
        ("nats", {"stream": name, **limits}),
    ]
    env = {"NSQWORKER_RABBITMQ_STREAM_URI": rabbitmq, "NSQWORKER_NATS_SERVERS": nats_server.url}
    driver = Driver(tmp_path, sources, env)
    try:
        driver.start()
        driver.kill_mid_batch()
        driver.start()
        wait_for_rows(driver, 20_000)
        asyncio.run(publish_rabbitmq(rabbitmq, name, bodies(10_000, 15_000)))
        asyncio.run(publish_nats(nats_server.url, name, bodies(10_000, 15_000)))
        rows = wait_for_rows(driver, 30_000)
    finally:
        driver.stop()
    rabbit = [r for r in rows if r["key"] is None]  # a stream's records have no subject
    jetstream = [r for r in rows if r["key"] == f"{name}.click"]
    assert len(rabbit) + len(jetstream) == len(rows) == 30_000
    for part in (rabbit, jetstream):
        check_exactly_once(part, name, 15_000)
