"""The three broker sources against real brokers and real Spark, in one streaming query
(their union into Parquet with a checkpoint), so they share the driver's two starts:
10,000 messages each, the driver kill -9'd mid-batch, restarted from the checkpoint,
5,000 more each. ``rabbitmq-stream`` and ``nats`` land each message exactly once;
``nsq`` at least once, duplicates only from the interrupted batch, and nothing FINed
before its batch committed."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nsqworker.testing import NsqdProcess
from tests.spark.streaming_cases import (
    Driver,
    bodies,
    check_exactly_once,
    committed_rows,
    publish_nats,
    publish_rabbitmq,
    wait,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

BATCH = 2000


def test_three_sources_across_a_kill_mid_batch(
    rabbitmq: str, nats_server: Any, nsqd: NsqdProcess, tmp_path: Path
) -> None:
    name = f"spark{uuid.uuid4().hex[:8]}"
    asyncio.run(publish_rabbitmq(rabbitmq, name, bodies(0, 10_000), create=True))
    asyncio.run(publish_nats(nats_server.url, name, bodies(0, 10_000), create=True))
    nsqd.create_channel(name, "spark")
    nsqd.mpublish(name, bodies(0, 10_000))
    limits = {"maxRecordsPerBatch": str(BATCH), "numPartitions": "2"}
    sources = [
        ("rabbitmq-stream", {"stream": name, **limits}),
        ("nats", {"stream": name, **limits}),
        ("nsq", {"topic": name, "channel": "spark", **limits}),
    ]
    env = {
        "NSQWORKER_RABBITMQ_STREAM_URI": rabbitmq,
        "NSQWORKER_NATS_SERVERS": nats_server.url,
        "NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address,
        "NSQWORKER_MSG_TIMEOUT": "5",  # a dead driver's messages come back after it
    }
    driver = Driver(tmp_path, sources, env)
    try:
        driver.start()
        driver.kill_mid_batch()
        # nothing FINed before its batch committed: once nsqd took back what the dead
        # driver held, the messages gone from it are at most the committed NSQ rows
        wait(lambda: nsqd.in_flight(name, "spark") == 0, 90, "the held messages back")
        finished = 10_000 - nsqd.depth(name, "spark")
        committed = [r for r in committed_rows(driver.output) if r["offset"] is None]
        assert finished <= len(committed)
        driver.start()
        wait_complete(driver, name, 10_000)
        asyncio.run(publish_rabbitmq(rabbitmq, name, bodies(10_000, 15_000)))
        asyncio.run(publish_nats(nats_server.url, name, bodies(10_000, 15_000)))
        nsqd.mpublish(name, bodies(10_000, 15_000))
        rows = wait_complete(driver, name, 15_000)
    finally:
        driver.stop()
    parts = split(rows, name)
    assert sum(map(len, parts.values())) == len(rows)
    check_exactly_once(parts["rabbitmq-stream"], name, 15_000)
    check_exactly_once(parts["nats"], name, 15_000)
    check_at_least_once(parts["nsq"], name, 15_000)


def split(rows: list[dict[str, Any]], name: str) -> dict[str, list[dict[str, Any]]]:
    """The rows by source: a stream's have an offset and no key, JetStream's a subject,
    NSQ's no offset."""
    return {
        "rabbitmq-stream": [r for r in rows if r["offset"] is not None and r["key"] is None],
        "nats": [r for r in rows if r["key"] == f"{name}.click"],
        "nsq": [r for r in rows if r["offset"] is None],
    }


def wait_complete(driver: Driver, name: str, count: int) -> list[dict[str, Any]]:
    """The committed rows once each source has ``count`` distinct bodies in them."""
    rows: list[dict[str, Any]] = []

    def complete() -> bool:
        nonlocal rows
        driver.check_alive()
        rows = committed_rows(driver.output)
        return all(len({r["body"] for r in part}) >= count for part in split(rows, name).values())

    wait(complete, 240, f"{count} messages from each source")
    return rows


def check_at_least_once(rows: list[dict[str, Any]], topic: str, count: int) -> None:
    """Every body at least once; the extra copies fewer than a batch, each of a message
    delivered again (attempts 2 or more on one of its copies)."""
    assert {r["topic"] for r in rows} == {topic}
    seen = Counter(r["body"] for r in rows)
    assert sorted(seen) == bodies(0, count)
    twice = {body for body, n in seen.items() if n > 1}
    assert sum(seen[b] - 1 for b in twice) <= BATCH
    again = {r["body"] for r in rows if r["attempts"] >= 2}
    assert twice <= again
