"""Process health: a watchdog thread that notices when a worker's event loop stops turning.

The loop stamps a clock every ``interval`` seconds; the thread checks the stamp. When
the loop has not turned for ``timeout`` seconds (a handler doing blocking I/O or CPU
work on the loop), the watchdog logs, once per block, where the loop thread is stuck,
naming the task whose handler is on the stack, and :attr:`LoopWatchdog.blocked` turns
true until the loop turns again. Nothing is interrupted: Python cannot stop a running
frame safely, and the supervisor kills a worker that stays hung (its ``hung_timeout``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from types import CodeType, FrameType
from typing import Any

from nsqworker.logging import get_logger

__all__ = ["LoopWatchdog", "blocking_frame", "over_memory", "rss_bytes"]

log = get_logger("nsqworker.watchdog")


def rss_bytes(pid: int) -> int | None:
    """Resident memory of process ``pid`` in bytes (Linux /proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def over_memory(pid: int, limit_mib: int) -> float | None:
    """The MiB of resident memory of ``pid`` when more than ``limit_mib`` (0 = no limit),
    else None."""
    rss = rss_bytes(pid) if limit_mib > 0 else None
    return rss / 2**20 if rss is not None and rss > limit_mib * 2**20 else None


def blocking_frame(frame: FrameType | None, handlers: Mapping[CodeType, str]) -> str:
    """Who blocks, from the loop thread's innermost ``frame``: ``task <name>
    (<module>.<function>)`` when a handler is on the stack, else the innermost function."""
    innermost = frame
    while frame is not None:
        name = handlers.get(frame.f_code)
        if name is not None:
            code = frame.f_code
            module = frame.f_globals.get("__name__", "?")
            return f"task {name} ({module}.{code.co_name}, line {frame.f_lineno})"
        frame = frame.f_back
    if innermost is None:
        return "unknown code"
    code = innermost.f_code
    return f"{code.co_name} ({code.co_filename}:{innermost.f_lineno})"


class LoopWatchdog:
    """Watch ``loop`` from a daemon thread; see the module docstring.

    ``handlers`` maps handler code objects to task names, so the log names the task.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
        handlers: Mapping[CodeType, str] | None = None,
    ) -> None:
        self.timeout = timeout
        self.interval = min(max(timeout / 4, 0.05), 1.0)
        self.blocked = False
        self.blocks = 0
        """How many times the loop was seen blocked past ``timeout``."""
        self.culprit = ""
        """Who blocked the loop the last time (see :func:`blocking_frame`)."""
        self._loop = loop
        self._handlers = dict(handlers or {})
        self._stamp = self._since = time.monotonic()
        self._thread_id: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def start_for(cls, tasks: Iterable[Any], timeout: float) -> LoopWatchdog:
        """Watch the running loop for the handlers of ``tasks`` (TaskSpecs); started."""
        handlers = {t.func.__code__: t.name for t in tasks if hasattr(t.func, "__code__")}
        watchdog = cls(asyncio.get_running_loop(), timeout, handlers)
        watchdog.start()
        return watchdog

    def start(self) -> None:
        """Start stamping (call on the loop's thread) and watching."""
        self._thread_id = threading.get_ident()
        self._tick()
        self._thread = threading.Thread(target=self._watch, name="nsqworker-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; safe to call twice."""
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._stamp = time.monotonic()
        if not self._stop.is_set():
            self._timer = self._loop.call_later(self.interval, self._tick)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            stalled = time.monotonic() - self._stamp - self.interval
            if stalled >= self.timeout and not self.blocked:
                self._since = self._stamp
                self.blocked = True
                self.blocks += 1
                self._report(stalled)
            elif stalled < self.timeout and self.blocked:
                self.blocked = False
                took = round(self._stamp - self._since, 1)
                log.warning(f"event loop turns again after about {took} s", blocked_by=self.culprit)

    def _report(self, stalled: float) -> None:
        frame = sys._current_frames().get(self._thread_id or 0)
        self.culprit = blocking_frame(frame, self._handlers)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
        log.error(
            f"event loop blocked for {stalled:.1f} s by {self.culprit}: "
            "async handlers must not block; run blocking code in a sync handler "
            "(a thread) or with asyncio.to_thread",
            blocked_by=self.culprit,
            stack=stack,
        )
