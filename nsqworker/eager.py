"""Run a handler's coroutine as a Task whose first step runs at once.

A handler must run in an asyncio Task from its first line: ``asyncio.timeout``,
``asyncio.TaskGroup``, ``asyncio.current_task()`` and the libraries built on them
(anyio, hence httpx) need the Task that will also run the rest of it. And a handler
that does not suspend should finish in the call that delivered its message, in the
same read burst, without a loop turn: a Task per message costs more than a typical
handler.

:class:`Starter` gives both. On Python 3.12 and later it is the eager start of
``asyncio.Task``. Python 3.11 has none, so the starter keeps a *spare* Task, waiting,
and runs the first step inline as that Task (asyncio's ``_enter_task``, what a Task's
own step does): a handler that finishes there used no Task of its own, and one that
suspends is carried on by the spare, which was its current task all along (its
timeouts and cancel scopes point at it), in the handler's own contextvars Context. The
next message gets a new spare. (An earlier version ran the first step outside any
Task: asyncio.timeout raised and httpx failed in every handler that used them before
its first suspension.)
"""

from __future__ import annotations

import asyncio
import asyncio.tasks
import contextvars
import sys
import types
from collections.abc import Coroutine, Generator
from typing import Any, Final

__all__ = ["EAGER", "Starter"]

EAGER: Final = sys.version_info >= (3, 12)
"""True where asyncio starts a Task eagerly itself (Python 3.12 and later)."""

# Python 3.11: asyncio's own functions that make a Task current for one of its steps
# (what Task.__step does; 3.12's eager start does it in C). No public way exists.
_enter_task = asyncio.tasks._enter_task
_leave_task = asyncio.tasks._leave_task

Suspended = tuple[Coroutine[Any, Any, Any], Any, contextvars.Context]
"""What a spare Task carries on: the coroutine, what its first step yielded, its Context."""


class Starter:
    """Starts coroutines on ``loop`` as Tasks whose first step runs in the call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._spare: asyncio.Task[Any] | None = None
        self._slot: asyncio.Future[Suspended] | None = None

    def start(
        self, coro: Coroutine[Any, Any, Any], context: contextvars.Context
    ) -> tuple[bool, Any]:
        """Run ``coro``'s first step in ``context``, as a Task: ``(True, its value)`` if
        that finished it, else ``(False, the Task that carries it on)``. What the first
        step raises is raised here."""
        loop = self._loop
        if EAGER:
            task = asyncio.Task(coro, loop=loop, context=context, eager_start=True)  # type: ignore[call-arg,unused-ignore]
            if task.done() and not task.cancelled():
                return True, task.result()
            return False, task
        spare, slot = self._spare, self._slot
        if spare is None or slot is None or spare.done() or slot.done():
            self._slot = slot = loop.create_future()
            self._spare = spare = loop.create_task(_carry_on(slot))
        outer = asyncio.current_task(loop)  # called from a Task: it steps aside, as on 3.12
        if outer is spare:  # started from a first step running as the spare: not that one
            return False, loop.create_task(coro, context=context)
        if outer is not None:
            _leave_task(loop, outer)
        _enter_task(loop, spare)
        try:
            yielded = context.run(coro.send, None)
        except StopIteration as stop:
            return True, stop.value
        finally:
            _leave_task(loop, spare)
            if outer is not None:
                _enter_task(loop, outer)
        self._spare = self._slot = None  # the spare is this coroutine's Task now
        if slot.cancelled() or spare.cancelling():  # its first step cancelled its Task
            return False, loop.create_task(_cancelled(coro, context))  # the spare is lost
        slot.set_result((coro, yielded, context))
        return False, spare

    def close(self) -> None:
        """Let the spare Task go (it is waiting, with nothing to carry on)."""
        if self._spare is not None:
            self._spare.cancel()
        self._spare = self._slot = None


async def _carry_on(slot: asyncio.Future[Suspended]) -> Any:
    """A spare Task: wait for a coroutine that suspended in its first step, finish it."""
    coro, yielded, context = await slot
    return await _resume(coro, yielded, context)


async def _cancelled(coro: Coroutine[Any, Any, Any], context: contextvars.Context) -> Any:
    """Carry on a coroutine whose first step cancelled its own Task: the cancel first."""
    try:
        yielded = context.run(coro.throw, asyncio.CancelledError())
    except StopIteration as stop:
        return stop.value
    return await _resume(coro, yielded, context)


@types.coroutine
def _resume(
    coro: Coroutine[Any, Any, Any], yielded: Any, context: contextvars.Context
) -> Generator[Any, Any, Any]:
    """Carry on ``coro`` from its first suspension, each step in its own ``context``.

    Re-yielding what it yielded hands the wait to the running Task exactly as if the
    Task had run the first step itself (a future keeps its ``_asyncio_future_blocking``).
    """
    while True:
        try:
            value = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                yielded = context.run(coro.throw, exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = context.run(coro.send, value)
            except StopIteration as stop:
                return stop.value
