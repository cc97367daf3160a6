"""Schedules on NSQ with nsqlookupd only: ticks go to an nsqd that lookupd's /nodes
lists (no message to answer near, no nsqd_tcp_addresses), checked like discovery."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from nsqworker.errors import NoConnection
from nsqworker.schedules.cron import Schedule
from nsqworker.schedules.firing import Scheduled
from nsqworker.schedules.runner import make_publisher
from nsqworker.settings import Settings
from nsqworker.testing import wait_for

TICK = datetime(2026, 11, 26, 8, 0, 0, tzinfo=UTC)
TASK = Scheduled("app.tick", "ticks_lookupd", Schedule.of("* * * * * *"))


def published(cluster: Any) -> int:
    return sum(
        int((n.topic_stats(TASK.topic) or {}).get("message_count", 0)) for n in cluster.nsqds
    )


def listed(cluster: Any) -> int:
    url = f"{cluster.lookupd_http_addresses[0]}/nodes"
    return len(httpx.get(url, timeout=5, trust_env=False).json().get("producers") or [])


def test_ticks_reach_an_nsqd_that_lookupd_lists(nsq_cluster: Any) -> None:
    wait_for(lambda: listed(nsq_cluster) == 2, 15)  # both nsqd registered
    settings = Settings(lookupd_http_addresses=nsq_cluster.lookupd_http_addresses)

    async def fire() -> None:
        publish, close = make_publisher(settings, [TASK], "lookupd")
        try:
            await publish(TASK, TICK)
        finally:
            await close()

    asyncio.run(fire())
    wait_for(lambda: published(nsq_cluster) == 1, 10)


def test_a_listed_nsqd_outside_lookupd_allowed_nsqd_is_not_used(nsq_cluster: Any) -> None:
    wait_for(lambda: listed(nsq_cluster) == 2, 15)
    settings = Settings(
        lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
        lookupd_allowed_nsqd=["10.9.9.9:*"],
    )

    async def fire() -> None:
        publish, close = make_publisher(settings, [TASK], "lookupd")
        try:
            await publish(TASK, TICK)
        finally:
            await close()

    with pytest.raises(NoConnection, match="not matched by lookupd_allowed_nsqd"):
        asyncio.run(fire())
    assert published(nsq_cluster) == 0
