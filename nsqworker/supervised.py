"""A worker process as the supervisor sees it, and how its exit reads in a log line."""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from nsqworker.watchdog import rss_bytes

__all__ = ["Child", "describe_exit"]


@dataclass(eq=False)
class Child:
    """One running worker process, as the supervisor sees it."""

    index: int
    key: int
    process: BaseProcess
    conn: Connection
    started: float
    last_seen: float
    snapshot: dict[str, Any] = field(default_factory=dict)
    pinged: bool = False
    killed: str = ""  # why the supervisor SIGKILLed it, if it did
    recycling: str = ""  # why it was asked to stop to be replaced (restart at once), if so

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    @property
    def ready(self) -> bool:
        return bool(self.snapshot.get("ready"))

    def status(self, now: float) -> dict[str, Any]:
        """This child for ``/status``: pid, uptime, memory, messages in flight."""
        tasks = (self.snapshot.get("tasks") or {}).values()
        return {
            "worker": self.index + 1, "pid": self.pid, "ready": self.ready,
            "uptime_s": round(now - self.started, 1), "memory_bytes": rss_bytes(self.pid),
            "in_flight": sum(int(t.get("in_flight") or 0) for t in tasks),
        }  # fmt: skip

    def state(self, stopping: bool = False) -> dict[str, Any]:
        """This child for ``/readyz``: starting (no stats yet), stopping (draining, as a
        whole run or to be replaced), or the tasks not subscribed."""
        state: dict[str, Any] = {"worker": self.index + 1, "pid": self.pid, "ready": self.ready}
        if not self.snapshot:
            state["starting"] = True
        elif stopping or self.recycling:
            state["stopping"] = True
        elif not self.ready:
            tasks = (self.snapshot.get("tasks") or {}).values()
            state["waiting_for"] = [str(t.get("name")) for t in tasks if not t.get("ready")]
        stalled = {
            str(t.get("name")): int(t.get("backoff_stalls") or 0)
            for t in (self.snapshot.get("tasks") or {}).values()
            if t.get("backoff_stalls")
        }
        if stalled:
            state["backoff_stalls"] = stalled  # each logged at error, then reopened
        return state


def _workers(count: int) -> str:
    return f"{count} worker{'s' * (count != 1)}"


def describe_exit(code: int | None) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` for a process's ``exitcode``."""
    if code is None:
        return "still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"
