"""Schedules on NATS JetStream: the next leader's copy of a tick (a crash between publish
and record) is dropped by the stream's Nats-Msg-Id deduplication."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from nsqworker.schedules.cron import Schedule
from nsqworker.schedules.firing import Scheduled
from nsqworker.schedules.runner import make_publisher
from nsqworker.settings import Settings

TICK = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)


async def stored(url: str, subject: str) -> list[dict[str, Any]]:
    import nats

    client = await nats.connect(url)
    try:
        js = client.jetstream()
        stream = await js.find_stream_name_by_subject(subject)
        info = await js.stream_info(stream)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            message = await js.get_msg(stream, seq)
            found.append(json.loads(message.data or b"{}"))
        return found
    finally:
        await client.close()


async def test_the_next_leaders_copy_of_a_tick_is_dropped_by_the_stream(nats_server: Any) -> None:
    subject = f"ticks.{uuid.uuid4().hex[:8]}"
    settings = Settings(transport="nats", nats_servers=[nats_server.url])
    task = Scheduled("app.tick", subject, Schedule.of("* * * * * *"))

    old, close_old = make_publisher(settings, [task], "dedup")  # the leader that dies
    await old(task, TICK)
    await close_old()
    new, close_new = make_publisher(settings, [task], "dedup")  # its successor, elsewhere
    await new(task, TICK)  # recorded by nobody: fired again, same scheduled_for
    await new(task, TICK + timedelta(seconds=1))
    await close_new()

    assert await stored(nats_server.url, subject) == [
        {"task": "app.tick", "scheduled_for": "2026-11-26T08:00:00Z"},
        {"task": "app.tick", "scheduled_for": "2026-11-26T08:00:01Z"},
    ]
