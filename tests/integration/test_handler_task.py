"""An async handler runs in its own asyncio Task from its first line, against a real
nsqd: asyncio.timeout, TaskGroup, current_task() and httpx (anyio) work before the
handler's first suspension, the Task and the contextvars Context of the first step are
those of the rest, and a handler's own timeout cancels the right Task."""

from __future__ import annotations

import asyncio
import contextvars

import httpx

from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess, wait_until
from nsqworker.worker import Worker

BODY: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("body", default=None)


def settings(nsqd: NsqdProcess) -> Settings:
    return Settings(nsqd_tcp_addresses=[nsqd.tcp_address], health_port=0)


async def test_task_bound_asyncio_and_httpx_work_from_the_handlers_first_line(
    nsqd: NsqdProcess,
) -> None:
    registry = Registry()
    seen: list[tuple[bytes, int, bool]] = []

    @registry.task("first_line", channel="c")
    async def handle(msg: Message) -> None:
        assert BODY.get() is None, "another message's context"
        BODY.set(msg.body)
        task = asyncio.current_task()
        async with asyncio.timeout(5):  # RuntimeError outside a Task
            async with httpx.AsyncClient(trust_env=False) as client:  # anyio needs a Task
                status = (await client.get(f"{nsqd.http_address}/ping")).status_code
        async with asyncio.TaskGroup() as group:
            group.create_task(asyncio.sleep(0))
        assert BODY.get() == msg.body, "the context changed across a suspension"
        seen.append((msg.body, status, task is asyncio.current_task() is not None))

    nsqd.create_channel("first_line", "c")
    async with Worker(registry, settings(nsqd)):
        for i in range(5):
            nsqd.publish("first_line", f"m{i}")
        await wait_until(lambda: len(seen) == 5, timeout=10, message=lambda: f"{seen}")
    assert sorted(seen) == [(b"m%d" % i, 200, True) for i in range(5)]


async def test_a_handler_that_never_awaits_and_one_that_times_out_itself(
    nsqd: NsqdProcess,
) -> None:
    registry = Registry()
    outcomes: list[str] = []

    @registry.task("no_await", channel="c")
    async def quick(msg: Message) -> None:
        assert asyncio.current_task() is not None
        outcomes.append("quick")

    @registry.task("own_timeout", channel="c", max_attempts=1)
    async def bounded(msg: Message) -> None:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(10)
        except TimeoutError:
            outcomes.append("timed out")

    for topic in ("no_await", "own_timeout"):
        nsqd.create_channel(topic, "c")
    async with Worker(registry, settings(nsqd)) as worker:
        nsqd.publish("no_await", "x")
        nsqd.publish("own_timeout", "y")
        await wait_until(lambda: len(outcomes) == 2, timeout=10, message=lambda: f"{outcomes}")
        finished = lambda: sum(t.finished for t in worker.stats().tasks.values())  # noqa: E731
        await wait_until(lambda: finished() == 2, timeout=5, message="both finished")
    assert sorted(outcomes) == ["quick", "timed out"]
