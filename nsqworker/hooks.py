"""Hooks around each message: before, after, on error and on dead letter.

Register them on a :class:`~nsqworker.Registry` (every task of it) or per task::

    tasks = Registry()

    @tasks.before
    def remember(msg: Message) -> None: ...

    @tasks.after
    async def audit(msg: Message, outcome: Outcome | None, error: BaseException | None,
                    duration: float) -> None: ...

    @tasks.on_error
    def report(msg: Message, error: BaseException) -> None: ...

    @tasks.task("clicks", channel="archive", hooks=[Metrics()])   # an object with any of
    async def archive(msg: Message) -> None: ...                   # before/after/on_error

The chain, in order, for each message: the framework's span starts; ``before`` hooks
(registry's, then the task's); the handler; ``on_error`` hooks if it raised; the
outcome is decided (finish, retry, reject); ``after`` hooks; the span ends with the
outcome. A dead letter runs its own chain: the ``dead_letter_topic`` publish, the task's
``on_dead_letter``, then ``on_dead_letter`` hooks of the registry and the task (if one
raises, the message is retried, never lost).

Where they run: ``before`` and ``on_error`` in the handler's own context (on the event
loop for ``async def`` handlers, in the handler's thread for plain ones, so a hook sees
the handler's span and context variables; an ``async def`` hook of a plain handler is run
on the loop and waited for). ``after`` runs on the loop once the outcome is decided; an
``async def`` after-hook runs as its own task and does not hold the message back. A hook
that raises is logged once, with its traceback, and changes nothing: the message is
settled as the handler's outcome says. A task with no hooks pays nothing for them.

A handler past its time limit reaches ``on_error`` with the ``TaskTimeout``: an async one
once cancelled (in its Task), a sync one at the limit, on the loop (its thread is busy).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nsqworker.message import Message, Outcome

__all__ = [
    "AfterHook",
    "BeforeHook",
    "DeadLetterHook",
    "ErrorHook",
    "Hooks",
    "call",
    "hooks_of",
    "is_async_callable",
    "run_after",
    "run_on_error",
    "with_hooks",
]

BeforeHook = Callable[[Message], "Awaitable[None] | None"]
AfterHook = Callable[[Message, "Outcome | None", "BaseException | None", float], Any]
ErrorHook = Callable[[Message, BaseException], "Awaitable[None] | None"]
DeadLetterHook = Callable[[Message, str], Any]
"""``hook(msg, reason)``: a plain function (run in a thread) or ``async def``."""


def is_async_callable(func: object) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - async callable objects count too
    )


@dataclass(frozen=True)
class Hooks:
    """Hooks of a registry or a task, in the order they run."""

    before: tuple[BeforeHook, ...] = ()
    after: tuple[AfterHook, ...] = ()
    on_error: tuple[ErrorHook, ...] = ()
    on_dead_letter: tuple[DeadLetterHook, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.before or self.after or self.on_error or self.on_dead_letter)

    def __add__(self, other: Hooks) -> Hooks:
        return Hooks(
            self.before + other.before,
            self.after + other.after,
            self.on_error + other.on_error,
            self.on_dead_letter + other.on_dead_letter,
        )


def hooks_of(items: Iterable[object], where: str) -> Hooks:
    """The hooks of objects with any of ``before``, ``after``, ``on_error`` and
    ``on_dead_letter`` methods (as ``@task(hooks=[...])`` takes them)."""
    found: dict[str, list[Any]] = {name: [] for name in Hooks.__dataclass_fields__}
    for item in items:
        methods = [(n, getattr(item, n, None)) for n in found]
        if not any(callable(m) for _, m in methods):
            raise TypeError(
                f"{where}: hook {item!r} has none of the methods before, after, on_error, "
                "on_dead_letter"
            )
        for name, method in methods:
            if callable(method):
                found[name].append(method)
    return Hooks(**{name: tuple(hooks) for name, hooks in found.items()})


def _failed(hook: object, exc: BaseException, msg: Message) -> None:
    from nsqworker.logging import get_logger  # not at import: `import nsqworker` stays light

    name = getattr(hook, "__qualname__", None) or repr(hook)
    get_logger("nsqworker.hooks").error(
        "hook failed; the message is settled as usual", hook=name, id=msg.id, exc_info=exc
    )


async def _call_async(hook: Callable[..., Any], msg: Message, *args: Any) -> None:
    try:
        result = hook(msg, *args)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        _failed(hook, exc, msg)


def _call_in_thread(
    hook: Callable[..., Any], loop: asyncio.AbstractEventLoop, msg: Message, *args: Any
) -> None:
    try:
        result = hook(msg, *args)
        if inspect.isawaitable(result):
            asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
    except Exception as exc:
        _failed(hook, exc, msg)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def with_hooks(
    func: Callable[[Message], Any],
    hooks: Hooks,
    is_async: bool,
    loop: asyncio.AbstractEventLoop,
) -> Callable[[Message], Any]:
    """``func`` with the ``before`` and ``on_error`` hooks around it (see the module)."""
    before, on_error = hooks.before, hooks.on_error
    if not before and not on_error:
        return func
    if is_async:

        async def hooked_async(msg: Message) -> Any:
            for first in before:
                await _call_async(first, msg)
            try:
                return await func(msg)
            except BaseException as exc:
                if not isinstance(exc, asyncio.CancelledError):
                    for hook in on_error:
                        await _call_async(hook, msg, exc)
                raise

        return hooked_async

    def hooked_sync(msg: Message) -> Any:
        for first in before:
            _call_in_thread(first, loop, msg)
        try:
            return func(msg)
        except BaseException as exc:
            for hook in on_error:
                _call_in_thread(hook, loop, msg, exc)
            raise

    return hooked_sync


async def run_on_error(hooks: tuple[ErrorHook, ...], msg: Message, error: BaseException) -> None:
    """The ``on_error`` hooks for an async handler the worker cancelled at its time
    limit (``error`` is the TaskTimeout), in the handler's Task, one after the other."""
    for hook in hooks:
        await _call_async(hook, msg, error)


def run_after(
    hooks: tuple[Callable[..., Any], ...],
    msg: Message,
    *args: Any,
    loop: asyncio.AbstractEventLoop,
) -> None:
    """``after`` hooks (``args``: outcome, error, duration), or the ``on_error`` hooks of
    a sync handler past its time limit (``args``: the TaskTimeout), on the loop: plain
    ones now, ``async def`` ones as tasks."""
    for hook in hooks:
        try:
            result = hook(msg, *args)
            if inspect.isawaitable(result):
                loop.create_task(_logged(hook, result, msg))
        except Exception as exc:
            _failed(hook, exc, msg)


async def _logged(hook: object, awaitable: Awaitable[Any], msg: Message) -> None:
    try:
        await awaitable
    except Exception as exc:
        _failed(hook, exc, msg)


async def call(func: Callable[..., Any], *args: Any) -> Any:
    """Call a user function that may be sync or async: an ``async def`` (or an object
    with an async ``__call__``) is awaited on the loop, a plain one runs in a thread with
    the caller's context variables; an awaitable it returns is awaited too."""
    if is_async_callable(func):
        return await func(*args)
    result = await asyncio.to_thread(func, *args)
    if inspect.isawaitable(result):
        result = await result
    return result
