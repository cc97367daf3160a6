"""Start a handler's coroutine in its own Task, its first step at once where Python can.

A handler runs in an asyncio Task from its first line: ``asyncio.timeout``,
``asyncio.TaskGroup``, ``asyncio.current_task()`` and the libraries built on them
(anyio, hence httpx) need one. On Python 3.12 and later the Task starts eagerly: its
first step runs in the call, so a handler that does not suspend is finished when
:func:`start_task` returns, in the same read burst, without a loop turn. Python 3.11 has
no eager start, and a step run outside the Task would have no current task (an early
version did that: ``asyncio.timeout`` raised and httpx failed with a TypeError in every
handler that used them before its first suspension), so there the first step waits for
the loop's next turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine
from typing import Any, Final, TypeVar

__all__ = ["EAGER", "start_task"]

T = TypeVar("T")

EAGER: Final = sys.version_info >= (3, 12)
"""True where a Task's first step can run at once (Python 3.12's eager start)."""


def start_task(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, T],
    context: contextvars.Context,
) -> asyncio.Task[T]:
    """A Task running ``coro`` in ``context``; done already if its first step finished
    it (Python 3.12 and later)."""
    if EAGER:
        return asyncio.Task(coro, loop=loop, context=context, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return loop.create_task(coro, context=context)
