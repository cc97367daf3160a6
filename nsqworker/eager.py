"""Run a coroutine's first step inline; hand it to a Task only if it suspends.

Python 3.12 has eager tasks; 3.11 does not, and a Task per message costs more than
the handler of a typical message. Callers run the first step with
``context.run(coro.send, None)`` in a copied contextvars Context (the isolation a Task
would give); if it suspends, :func:`finish_in_task` lets a Task created with that same
context carry on from where it stopped.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["finish_in_task", "resume"]


@types.coroutine
def resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Generator[Any, Any, Any]:
    """Carry on a coroutine that already ran its first step and suspended on ``yielded``.

    Re-yielding the same object hands the wait to the Task, exactly as if the Task had
    run the first step itself (the future keeps its ``_asyncio_future_blocking`` flag).
    """
    while True:
        try:
            value = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(value)
            except StopIteration as stop:
                return stop.value


async def finish_in_task(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    """A coroutine for ``loop.create_task`` that finishes a suspended ``coro``."""
    return await resume(coro, yielded)
