"""Memory: a Worker with ``tasks`` async tasks, subscribed, no traffic, until SIGTERM.

It emits ``ready`` once every task is subscribed; the runner then reads its RSS from
``/proc/<pid>/status`` and sends SIGTERM, which the Worker drains and exits on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import CHANNEL, emit_event, loop_label, memory_fields, run_on


def worker(params: dict[str, Any]) -> dict[str, Any]:
    loop = params.get("loop", "uvloop")
    return {**run_on(loop, _worker(params)), "loop": loop_label(loop)}


async def _worker(params: dict[str, Any]) -> dict[str, Any]:
    from nsqworker.logging import configure_logging
    from nsqworker.message import Message
    from nsqworker.settings import Settings
    from nsqworker.task import Registry
    from nsqworker.worker import Worker

    settings = Settings(nsqd_tcp_addresses=[params["address"]], log_level="warning")
    configure_logging(settings.log_level, "console")
    registry = Registry()
    for topic in params["topics"]:

        async def handle(msg: Message) -> None:
            return None

        registry.task(topic, channel=CHANNEL, name=topic)(handle)
    worker = Worker(registry, settings)
    await worker.start()
    while not worker.ready:
        await asyncio.sleep(0.01)
    emit_event("ready", **memory_fields())
    await worker.run()
    return memory_fields()
