"""``max_tasks_per_child`` is exact: a process starts at most that many messages over all
its tasks, hands back what reaches it afterwards (unstarted, no delay, no backoff), and
stops; on the memory transport, whose deliveries all arrive in one burst."""

from __future__ import annotations

import asyncio

from nsqworker.memory import MemoryTransport
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.worker import Worker


async def test_a_process_starts_exactly_max_tasks_per_child_messages_then_stops() -> None:
    started: list[bytes] = []
    reg = Registry()

    @reg.task("recycle_a", channel="c", max_in_flight=50)
    async def a(msg: Message) -> None:
        started.append(msg.body)

    @reg.task("recycle_b", channel="c", max_in_flight=50)
    def b(msg: Message) -> None:
        started.append(msg.body)

    broker = MemoryTransport()
    settings = Settings(transport="memory", health_port=0, max_tasks_per_child=7)
    worker = Worker(reg, settings, transport=broker)
    await broker.publish_many("recycle_a", [f"a{i}".encode() for i in range(10)])
    await broker.publish_many("recycle_b", [f"b{i}".encode() for i in range(10)])
    await asyncio.wait_for(worker.run(), 20)  # returns once the limit is reached and drained
    assert len(started) == 7 and len(set(started)) == 7
    assert worker.recycle == "started 7 messages (max_tasks_per_child 7)"
    acked = broker.finished("recycle_a", "c") + broker.finished("recycle_b", "c")
    assert len(acked) == 7
    handed_back = broker.retried("recycle_a", "c") + broker.retried("recycle_b", "c")
    assert all(r.delay == 0 for r in handed_back)  # given back at once, for the next process
    # Nothing lost: the 13 not started wait for the next process.
    assert broker.pending("recycle_a", "c") + broker.pending("recycle_b", "c") == 13
