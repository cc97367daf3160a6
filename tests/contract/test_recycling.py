"""``max_tasks_per_child`` on every transport: a worker starts exactly that many
messages, hands back what reaches it afterwards and stops; the next worker takes the
rest. 300 messages, 50 a worker: at least 6 workers, none started more than 50, none
lost or handled twice. (Under ``nsqworker run`` the supervisor starts the next process:
tests/e2e/test_recycling_and_inflight.py.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from nsqworker.message import Message
from nsqworker.task import Registry
from nsqworker.worker import Worker

if TYPE_CHECKING:
    from conftest import Harness  # tests/contract/conftest.py


async def test_each_worker_starts_at_most_max_tasks_per_child(broker: Harness) -> None:
    handled: Counter[bytes] = Counter()
    per_worker: list[int] = []
    reg = Registry()

    @reg.task(broker.topic, channel="recycle", max_in_flight=10, max_attempts=50)
    async def handle(msg: Message) -> None:
        handled[msg.body] += 1
        per_worker[-1] += 1

    bodies = [f"m{i}".encode() for i in range(300)]
    await broker.publish(broker.topic, bodies)
    settings = broker.settings(max_tasks_per_child=50)
    while len(handled) < 300 and len(per_worker) < 20:
        per_worker.append(0)
        worker = Worker(reg, settings, transport=broker.transport())
        if broker.virtual_time:
            async with worker:
                await broker.until(lambda w=worker: w.recycle is not None or len(handled) == 300,
                                   20, "the limit")  # fmt: skip
        else:
            try:
                await asyncio.wait_for(worker.run(), 30)  # returns once 50 are done, drained
            except TimeoutError:  # the last worker: fewer than 50 left
                await worker.stop()
        assert per_worker[-1] <= 50, per_worker
        if len(handled) == 300:
            break
        assert worker.recycle == "started 50 messages (max_tasks_per_child 50)"
    assert len(per_worker) >= 6 and max(per_worker) <= 50, per_worker
    assert set(handled) == set(bodies) and set(handled.values()) == {1}
    # Handed back past the limit (nsqd counts a REQ) is not a handler's retry.
    await broker.until_settled(broker.topic, "recycle", 300, retried=None)
