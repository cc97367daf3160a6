"""Schedules on RabbitMQ Streams: a tick published again by the next leader (a crash
between publish and record) is stored once, by the broker's publisher deduplication."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from nsqworker.schedules.cron import Schedule
from nsqworker.schedules.firing import Scheduled
from nsqworker.schedules.runner import make_publisher, stream_ranks
from nsqworker.settings import Settings
from nsqworker.testing import wait_until

TICK = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)


def endpoint(uri: str) -> dict[str, Any]:
    from nsqworker.streams.client import Endpoint

    e = Endpoint.from_settings(Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri))
    return {"host": e.host, "port": e.port, "vhost": e.vhost, "username": e.username,
            "password": e.password}  # fmt: skip


async def read_all(uri: str, stream: str, at_least: int) -> list[dict[str, str]]:
    from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

    seen: list[dict[str, str]] = []
    reader = Consumer(**endpoint(uri))
    await reader.start()

    async def record(msg: Any, ctx: Any) -> None:
        seen.append(json.loads(bytes(msg.body)))

    try:
        await reader.subscribe(
            stream, record, decoder=amqp_decoder,
            offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None),
        )  # fmt: skip
        await wait_until(lambda: len(seen) >= at_least, 20)
        await asyncio.sleep(0.5)  # anything stored after them would have arrived by now
    finally:
        await reader.close()
    return seen


async def test_the_next_leaders_copy_of_a_tick_is_dropped_by_the_broker(rabbitmq: str) -> None:
    stream = f"ticks_{uuid.uuid4().hex[:8]}"
    settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=rabbitmq)
    every = Schedule.of("* * * * * *")
    tasks = [Scheduled("app.b", stream, every), Scheduled("app.a", stream, every)]
    assert stream_ranks(tasks) == {"app.a": 0, "app.b": 1}
    lease = f"dedup-{uuid.uuid4().hex[:8]}"

    old, close_old = make_publisher(settings, tasks, lease)  # the leader that dies
    await old(tasks[1], TICK)
    await old(tasks[0], TICK)
    await close_old()
    new, close_new = make_publisher(settings, tasks, lease)  # its successor, elsewhere
    await new(tasks[1], TICK)  # recorded by nobody: fired again, same scheduled_for
    await new(tasks[0], TICK)
    await new(tasks[1], TICK + timedelta(seconds=1))
    await close_new()

    seen = await read_all(rabbitmq, stream, at_least=3)
    assert seen == [
        {"task": "app.a", "scheduled_for": "2026-11-26T08:00:00Z"},
        {"task": "app.b", "scheduled_for": "2026-11-26T08:00:00Z"},
        {"task": "app.a", "scheduled_for": "2026-11-26T08:00:01Z"},
    ]
