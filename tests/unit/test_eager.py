"""nsqworker.eager.Starter: a coroutine's first step runs in the call, as the Task that
carries it on, in its own Context; on Python 3.11 through a spare Task, on 3.12 through
asyncio's eager start."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from nsqworker.eager import Starter

pytestmark = pytest.mark.both_loops  # the standard loop too: users may run either

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


async def test_a_first_step_that_finishes_gives_its_value_inside_a_task() -> None:
    starter = Starter(asyncio.get_running_loop())
    seen: list[Any] = []

    async def quick(n: int) -> int:
        seen.append(asyncio.current_task())
        async with asyncio.timeout(1):  # raises outside a Task
            return n * 2

    assert [starter.start(quick(n), contextvars.copy_context()) for n in range(3)] == [
        (True, 0),
        (True, 2),
        (True, 4),
    ]
    assert None not in seen
    assert asyncio.current_task() is not None  # ours is current again
    starter.close()


async def test_a_coroutine_that_suspends_is_carried_on_by_its_first_steps_task() -> None:
    starter = Starter(asyncio.get_running_loop())
    tasks: dict[str, list[Any]] = {}

    async def slow(name: str) -> str:
        VAR.set(name)
        tasks[name] = [asyncio.current_task()]
        async with asyncio.timeout(5):
            await asyncio.sleep(0.01)
        tasks[name].append(asyncio.current_task())
        return f"{name}:{VAR.get()}"

    started = [starter.start(slow(name), contextvars.copy_context()) for name in "abc"]
    assert [done for done, _ in started] == [False] * 3
    results = await asyncio.gather(*(task for _, task in started))
    assert results == ["a:a", "b:b", "c:c"]
    assert VAR.get() == "unset"  # each ran in its own Context
    for name, (first, rest) in tasks.items():
        assert first is rest is not None, name
    assert len({id(t[0]) for t in tasks.values()}) == 3
    starter.close()


async def test_a_timeout_set_in_the_first_step_cancels_the_right_task() -> None:
    starter = Starter(asyncio.get_running_loop())

    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.02):
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
        return "not timed out"

    done, task = starter.start(bounded(), contextvars.copy_context())
    bystander = asyncio.ensure_future(asyncio.sleep(0.1, "untouched"))
    assert not done
    assert await task == "timed out"
    assert await bystander == "untouched"
    starter.close()


async def test_errors_raise_in_the_call_and_a_self_cancelled_first_step_is_cancelled() -> None:
    starter = Starter(asyncio.get_running_loop())

    async def broken() -> None:
        raise ValueError("bad")

    cleaned: list[str] = []

    async def cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(1)
        finally:
            cleaned.append("its finally ran")  # the cancel reached the coroutine itself

    with pytest.raises(ValueError, match="bad"):
        starter.start(broken(), contextvars.copy_context())
    done, task = starter.start(cancels_itself(), contextvars.copy_context())
    assert not done
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["its finally ran"]
    assert starter.start(asyncio.sleep(0, "next"), contextvars.copy_context())[0] is False
    starter.close()


async def test_a_start_from_inside_a_first_step_gets_a_task_of_its_own() -> None:
    starter = Starter(asyncio.get_running_loop())
    inner: list[Any] = []

    async def child() -> str:
        await asyncio.sleep(0)
        return "child"

    async def parent() -> str:
        inner.append(starter.start(child(), contextvars.copy_context()))
        await asyncio.sleep(0)
        return "parent"

    done, task = starter.start(parent(), contextvars.copy_context())
    assert not done and await task == "parent"
    child_done, child_task = inner[0]
    assert not child_done and child_task is not task and await child_task == "child"
    starter.close()
