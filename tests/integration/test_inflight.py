"""What is in flight, against a real nsqd: ``Worker.inflight()`` (what /inflight serves)
lists running handlers with their age and their asyncio task or thread, and a handler
running past ``slow_handler_after`` is logged at warning, once per message."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

pytestmark = pytest.mark.integration


async def test_running_handlers_are_listed_and_a_slow_one_logged_once(
    nsqd: NsqdProcess, log_lines: Callable[[], list[dict[str, Any]]]
) -> None:
    release_async = asyncio.Event()
    release_sync = threading.Event()
    reg = Registry()

    @reg.task("inflight_a", channel="c")
    async def waits(msg: Message) -> None:
        await release_async.wait()

    @reg.task("inflight_s", channel="c")
    def blocks(msg: Message) -> None:
        release_sync.wait(30)

    settings = Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], slow_handler_after=0.4, health_port=0
    )
    async with Worker(reg, settings) as worker:
        nsqd.publish("inflight_a", b"a")
        nsqd.publish("inflight_s", b"s")

        def both_old() -> list[dict[str, Any]]:
            rows = worker.inflight()
            return rows if len(rows) == 2 and all(r["age_s"] > 0.8 for r in rows) else []

        rows = await wait_until(both_old, 10, lambda: f"in flight: {worker.inflight()}")
        by_task = {row["task"]: row for row in rows}
        assert by_task[waits.spec.name]["handler"].startswith("task ")
        assert by_task[blocks.spec.name]["handler"].startswith("thread nsqworker-blocks-")
        assert {row["state"] for row in rows} == {"running"} and {r["attempts"] for r in rows} == {
            1
        }
        assert worker.stats().inflight == rows or len(worker.stats().inflight) == 2
        await asyncio.sleep(0.6)  # more sweeps: still one warning per message
        release_async.set()
        release_sync.set()
        await wait_until(lambda: not worker.inflight(), 10, "all done")
    slow = [line for line in log_lines() if line["event"] == "handler still running"]
    assert sorted(line["task"] for line in slow) == sorted([waits.spec.name, blocks.spec.name])
    assert all(line["threshold_s"] == 0.4 for line in slow)
