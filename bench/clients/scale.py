"""Scale: one Worker with many tasks, and one task over many nsqd.

``many_tasks``: one async no-op task per topic in ``topics`` (each pre-loaded with
``per_task`` messages), all on one nsqd. Reports the time from ``Worker.start()`` to
every task subscribed, the rate over all tasks, and each task's own rate.

``many_nsqd``: one task with ``max_in_flight`` over every nsqd in ``addresses`` (each
pre-loaded with ``per_nsqd`` messages). Reports the time to drain them all, each
nsqd's share of the messages handled when half of them were, and when each was
drained.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from typing import Any

from bench.common import CHANNEL, loop_label, memory_fields, run_on


def many_tasks(params: dict[str, Any]) -> dict[str, Any]:
    loop = params.get("loop", "uvloop")
    return {**run_on(loop, _many_tasks(params)), **memory_fields(), "loop": loop_label(loop)}


async def _many_tasks(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.message import Message
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    settings = Settings(nsqd_tcp_addresses=[params["address"]], log_level="warning")
    configure_logging(settings.log_level, "console")
    topics, per_task = params["topics"], params["per_task"]
    total = len(topics) * per_task
    counts: Counter[str] = Counter()
    finished_at: dict[str, float] = {}
    first: list[float] = []
    done = asyncio.Event()
    registry = Registry()
    for topic in topics:

        async def handle(msg: Message) -> None:
            topic = msg.topic
            counts[topic] += 1
            if not first:
                first.append(time.perf_counter())
            if counts[topic] == per_task:
                finished_at[topic] = time.perf_counter()
                if len(finished_at) == len(topics):
                    done.set()

        registry.task(topic, channel=CHANNEL, name=topic, max_in_flight=params["max_in_flight"])(
            handle
        )
    started = time.perf_counter()
    async with Worker(registry, settings) as worker:
        while not worker.ready:
            await asyncio.sleep(0.005)
        ready = time.perf_counter() - started
        try:
            await asyncio.wait_for(done.wait(), params["timeout"])
        except TimeoutError:
            return {"error": f"handled {sum(counts.values())} of {total} messages in time"}
    elapsed = max(finished_at.values()) - first[0]
    task_rates = sorted(per_task / (at - first[0]) for at in finished_at.values())
    return {
        "ready_s": ready,
        "rate": (total - 1) / elapsed,
        "task_rate_min": task_rates[0],
        "task_rate_median": statistics.median(task_rates),
        "task_rate_max": task_rates[-1],
    }


def many_nsqd(params: dict[str, Any]) -> dict[str, Any]:
    loop = params.get("loop", "uvloop")
    return {**run_on(loop, _many_nsqd(params)), **memory_fields(), "loop": loop_label(loop)}


async def _many_nsqd(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.message import Message
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    addresses, per_nsqd = params["addresses"], params["per_nsqd"]
    settings = Settings(nsqd_tcp_addresses=addresses, log_level="warning")
    configure_logging(settings.log_level, "console")
    total = len(addresses) * per_nsqd
    counts: Counter[str] = Counter()
    at_half: dict[str, int] = {}
    drained_at: dict[str, float] = {}
    done = asyncio.Event()
    registry = Registry()
    started = time.perf_counter()

    @registry.task(params["topic"], channel=CHANNEL, max_in_flight=params["max_in_flight"])
    async def handle(msg: Message) -> None:
        address = msg.nsqd_address
        counts[address] += 1
        handled = counts.total()
        if handled == total // 2:
            at_half.update(counts)
        if counts[address] == per_nsqd:
            drained_at[address] = time.perf_counter() - started
        if handled == total:
            done.set()

    async with Worker(registry, settings):
        try:
            await asyncio.wait_for(done.wait(), params["timeout"])
        except TimeoutError:
            return {"error": f"handled {counts.total()} of {total} messages in time: {counts}"}
        elapsed = time.perf_counter() - started
    shares = [at_half.get(a, 0) / (total // 2) for a in addresses]
    return {
        "elapsed": elapsed,
        "rate": total / elapsed,
        "share_min": min(shares),
        "share_max": max(shares),
        "shares": shares,
        "drained_at": [drained_at[a] for a in addresses],
    }
