"""The thread pool that runs sync handlers off the event loop, in batches."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections import deque
from collections.abc import Callable
from time import perf_counter
from typing import Any

from opentelemetry import context as otel_context

from nsqworker.logging import get_logger
from nsqworker.message import Message

__all__ = ["GROW_CHECK", "ThreadPool", "awaitable_returned", "run_traced"]

log = get_logger("nsqworker.worker")

GROW_CHECK = 0.02
"""How long every sync thread must have been inside one handler call, while jobs wait,
before the pool adds threads. Well above the GIL's 5 ms switch interval, so a thread
that is only waiting for the GIL does not count as blocked."""


def run_traced(token: Any, func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)`` with the token's span current (token None: a plain call)."""
    if token is None:
        return func(*args)
    attached = otel_context.attach(token[1])
    try:
        return func(*args)
    finally:
        otel_context.detach(attached)


# (message, context, telemetry token)
_Job = tuple[Message, contextvars.Context, Any]


class ThreadPool:
    """Runs one sync handler in up to ``size`` threads, started as work needs them.

    Jobs submitted during one loop iteration are handed over as one batch to a
    shared deque, and only idle threads are signalled, so a burst of fast messages
    costs one wake-up, not one per message. Results come back through another deque
    and the loop is woken once per batch to settle them all. The pool starts with one
    thread and grows only when jobs wait while every thread has been inside one handler
    call for ``GROW_CHECK`` seconds (all blocked), at most doubling per check, so fast
    handlers keep few threads and blocking ones get up to ``size``.

    A thread :meth:`abandon`-ed (its handler past its time limit, left running) no
    longer counts: a new one takes its place, and it exits once its handler returns.
    """

    def __init__(
        self,
        func: Callable[[Message], Any],
        finish: Callable[
            [Message, contextvars.Context, Any, BaseException | None, float, Any], None
        ],
        loop: asyncio.AbstractEventLoop,
        size: int,
        name: str,
    ) -> None:
        self._func = func
        self._finish = finish
        self._loop = loop
        self._size = size
        self._name = name
        self._submitted: list[_Job] = []
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._idle = 0
        self._done: deque[tuple[_Job, BaseException | None, float, Any]] = deque()
        self._threads: list[threading.Thread] = []
        self._submit_scheduled = False
        self._flush_scheduled = False
        self._check_armed = False
        self._closed = False
        self._busy_since: list[float] = []  # per thread: when its current job began, or 0
        self._current: list[Message | None] = []  # per thread: the message it runs
        self._abandoned: set[int] = set()  # indexes of threads left to their handler

    def submit(self, msg: Message, ctx: contextvars.Context, token: Any) -> None:
        """Queue a job; the batch goes to the threads at the end of this iteration."""
        self._submitted.append((msg, ctx, token))
        if not self._submit_scheduled:
            self._submit_scheduled = True
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._submit_scheduled = False
        batch, self._submitted = self._submitted, []
        self._jobs.extend(batch)
        with self._cond:
            if self._idle:
                self._cond.notify(min(len(batch), self._idle))
        if not self._check_armed and self._active() < self._size:
            if not self._active():
                self._spawn(1)
            self._check_armed = True
            self._loop.call_later(GROW_CHECK, self._grow)

    def _grow(self) -> None:
        self._check_armed = False
        waiting, threads = len(self._jobs), self._active()
        if waiting and not self._closed and threads < self._size:
            since = perf_counter() - GROW_CHECK
            abandoned = self._abandoned
            busy = (b for i, b in enumerate(self._busy_since) if i not in abandoned)
            if all(0 < began <= since for began in busy):  # all blocked
                self._spawn(min(waiting, threads, self._size - threads))
            self._check_armed = True
            self._loop.call_later(GROW_CHECK, self._grow)

    def _spawn(self, count: int) -> None:
        for _ in range(count):
            index = len(self._threads)
            self._busy_since.append(0.0)
            self._current.append(None)
            name = f"{self._name}-{index + 1}"
            thread = threading.Thread(target=self._work, args=(index,), name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def _next_job(self) -> _Job | None:
        """The next job, waiting while there is none; None once the pool is closed."""
        jobs, cond = self._jobs, self._cond
        with cond:
            # Checked under the lock that _hand_over notifies under: no lost wake-ups.
            while not jobs:
                if self._closed:
                    return None
                self._idle += 1
                cond.wait()
                self._idle -= 1
        try:
            return jobs.popleft()
        except IndexError:  # another thread took it; look again
            return self._next_job()

    def _work(self, index: int) -> None:
        jobs, append, func = self._jobs, self._done.append, self._func
        wake, flush = self._loop.call_soon_threadsafe, self._flush
        busy, current = self._busy_since, self._current
        while True:
            job: _Job | None
            try:
                job = jobs.popleft()
            except IndexError:
                job = self._next_job()
            if job is None:
                return
            start = busy[index] = perf_counter()
            current[index] = job[0]
            error: BaseException | None = None
            result = None
            try:
                if job[2] is None:
                    result = job[1].run(func, job[0])
                else:
                    result = job[1].run(run_traced, job[2], func, job[0])
                if result is not None and inspect.isawaitable(result):
                    error, result = awaitable_returned(result), None
            except BaseException as exc:
                error = exc
            busy[index] = 0.0
            current[index] = None
            append((job, error, perf_counter() - start, result))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                try:
                    wake(flush)
                except RuntimeError:  # the loop is closed: nobody waits for results
                    return
            if index in self._abandoned:  # replaced while it ran: it ends here
                return

    def _flush(self) -> None:
        self._flush_scheduled = False  # before draining, so no result waits unseen
        done, finish = self._done, self._finish
        while done:
            job, error, duration, result = done.popleft()
            try:
                finish(*job, error, duration, result)
            except Exception:  # one bad result must not strand the rest of the batch
                log.exception("settling a sync handler's result failed", id=job[0].id)

    def running(self) -> dict[Message, str]:
        """The message each busy thread runs now, with the thread's name."""
        return {
            msg: thread.name
            for msg, thread in zip(list(self._current), list(self._threads), strict=False)
            if msg is not None
        }

    def running_for(self) -> dict[Message, float]:
        """Seconds each busy thread's message has run so far (its handler's own time)."""
        now = perf_counter()
        return {
            msg: now - since
            for msg, since in zip(list(self._current), list(self._busy_since), strict=False)
            if msg is not None and since
        }

    def _active(self) -> int:
        """Threads started and not abandoned."""
        return len(self._threads) - len(self._abandoned)

    def abandon(self, msg: Message) -> bool:
        """Leave the thread running ``msg`` to its handler, and start another in its
        place (call on the loop); False if no thread runs ``msg``. The abandoned thread
        still hands its result back, then exits."""
        for index, running in enumerate(list(self._current)):
            if running is msg and index not in self._abandoned:
                self._abandoned.add(index)
                if not self._closed:
                    self._spawn(1)
                return True
        return False

    def shutdown(self) -> None:
        """Let every thread exit once the jobs it can see are done."""
        self._closed = True
        with self._cond:
            self._cond.notify_all()

    def started(self) -> int:
        """Threads started so far (the pool grows on demand, up to its size)."""
        return len(self._threads)

    def alive(self) -> int:
        """Threads still running (a handler that outlived the drain, or not yet exited)."""
        return sum(t.is_alive() for t in self._threads)


def awaitable_returned(result: Any) -> TypeError:
    if inspect.iscoroutine(result):
        result.close()
    return TypeError("a sync handler returned an awaitable; declare the handler with async def")
