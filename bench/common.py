"""Helpers shared by the measuring processes and the runner: loops, clocks, /proc."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

RESULT_MARK = "BENCH_RESULT "
EVENT_MARK = "BENCH_EVENT "
BODY_SIZE = 100
CHANNEL = "bench"


# --- event loops -------------------------------------------------------------------


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """``uvloop.new_event_loop`` for "uvloop", None (the stdlib loop) for "asyncio"."""
    if name == "uvloop":
        module: Any = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = module.new_event_loop
        return factory
    if name == "asyncio":
        return None
    raise ValueError(f"unknown event loop {name!r}: use uvloop or asyncio")


def default_loop() -> str:
    """ "uvloop" when it is installed, else "asyncio"."""
    try:
        importlib.import_module("uvloop")
    except ImportError:
        return "asyncio"
    return "uvloop"


def loop_label(name: str) -> str:
    """``uvloop 0.23.0`` or ``asyncio (CPython 3.11.7)``."""
    if name == "uvloop":
        return f"uvloop {importlib.import_module('uvloop').__version__}"
    return f"asyncio (CPython {sys.version.split()[0]})"


def run_on(loop: str, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new loop of kind ``loop``."""
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(coro)


# --- counting messages --------------------------------------------------------------


class Clock:
    """Counts handled messages; notes when the first and the ``total``-th arrived.

    ``hit()`` is safe from any thread (``next`` on ``itertools.count`` holds the GIL),
    and costs the same in every client measured, so it is part of the "no-op".
    """

    def __init__(self, total: int, on_done: Callable[[], object] = lambda: None) -> None:
        self.total = total
        self.on_done = on_done
        self._counter = itertools.count(1)
        self.count = 0
        self.first = self.last = 0.0
        self.cpu_first = self.cpu_last = 0.0

    def hit(self) -> None:
        n = next(self._counter)
        if n == 1:
            self.first = time.perf_counter()
            self.cpu_first = time.process_time()
        elif n == self.total:
            self.last = time.perf_counter()
            self.cpu_last = time.process_time()
            self.count = n
            self.on_done()

    def result(self, started: float) -> dict[str, Any]:
        """Rate from the first message to the last, and the wall time since ``started``."""
        if not self.last:
            seen = next(self._counter) - 1
            return {"error": f"timed out after {seen} of {self.total} messages"}
        elapsed = self.last - self.first
        return {
            "count": self.total,
            "elapsed": elapsed,
            "rate": (self.total - 1) / elapsed if elapsed > 0 else 0.0,
            "wall": self.last - started,
            # CPU seconds of this process (all threads) per second of the window:
            # near 1.0 means the client itself is the bottleneck.
            "cpu": (self.cpu_last - self.cpu_first) / elapsed if elapsed > 0 else 0.0,
        }


# --- /proc --------------------------------------------------------------------------


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in kB, from ``/proc/<pid>/status``."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values


def memory_fields(pid: int | str = "self") -> dict[str, float]:
    """``rss_mb`` and ``peak_rss_mb`` of a process."""
    status = proc_status(pid)
    return {"rss_mb": status["VmRSS"] / 1024, "peak_rss_mb": status["VmHWM"] / 1024}


# --- talking to the runner ----------------------------------------------------------


def emit_event(name: str, **fields: Any) -> None:
    """Tell the runner something happened (e.g. "ready"), while still running."""
    print(EVENT_MARK + json.dumps({"event": name, **fields}), flush=True)


def emit_result(result: dict[str, Any]) -> None:
    """The process's answer; the last line it prints."""
    result.setdefault("pid", os.getpid())
    print(RESULT_MARK + json.dumps(result), flush=True)
