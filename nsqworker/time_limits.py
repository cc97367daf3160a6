"""What a handler past its time limit becomes: the ``timeout_action`` rule, in one place.

``timeout_action`` (a task's option, else the setting of the same name) says what a
time limit reached does (docs/tasks.md, "Time limits"):

* ``retry``: the message is retried like after any failure (an attempt counted, dead
  letter after ``max_attempts``); a sync handler's thread keeps its slot until it
  returns and the worker process asks to be replaced after a drain;
* ``dead_letter``: the message is dead-lettered at the first time limit reached; a sync
  handler's thread is handled as with ``retry``;
* ``abandon``: the message is retried as with ``retry``, but a sync handler's thread is
  left running on its own, its slot given to a new thread, and the process is not
  replaced, while at most ``max_abandoned_threads`` of them run in the process (past
  that: as ``retry``, with a warning). An async handler is cancelled, as with ``retry``.

:func:`timeout_reject` is the pure rule for the message; :class:`AbandonedThreads` counts
the threads left running in one process.
"""

from __future__ import annotations

import threading
from typing import Final, Literal, get_args

from nsqworker.outcomes import Reject, TaskTimeout

__all__ = ["TIMEOUT_ACTIONS", "AbandonedThreads", "TimeoutAction", "timeout_reject"]

TimeoutAction = Literal["retry", "dead_letter", "abandon"]
TIMEOUT_ACTIONS: Final[tuple[str, ...]] = get_args(TimeoutAction)
"""The values of ``timeout_action``, the default first."""


def timeout_reject(
    exc: BaseException, attempts: int, action: str, dead_letter_from: int
) -> Reject | None:
    """The dead letter a handler's failure ``exc`` becomes at once, or None (the usual
    policy decides): a :class:`TaskTimeout` under ``timeout_action`` ``dead_letter``, or on
    delivery ``attempts`` >= ``dead_letter_from`` (``timeout_dead_letter_attempts``, 0 =
    never)."""
    if not isinstance(exc, TaskTimeout):
        return None
    if action == "dead_letter":
        return Reject(f"{exc} on attempt {attempts} (timeout_action dead_letter: not retried)")
    if dead_letter_from and attempts >= dead_letter_from:
        return Reject(
            f"{exc} on attempt {attempts} (timeout_dead_letter_attempts "
            f"{dead_letter_from}: not retried)"
        )
    return None


class AbandonedThreads:
    """The sync handlers' threads one worker process left running past their time limit
    (``timeout_action`` ``abandon``), at most ``limit`` at a time; shared by its tasks."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count = 0
        self._lock = threading.Lock()

    @property
    def count(self) -> int:
        """Threads abandoned and still running."""
        return self._count

    def take(self) -> bool:
        """Count one more abandoned thread; False (nothing counted) when ``limit`` are."""
        with self._lock:
            if self._count >= self.limit:
                return False
            self._count += 1
            return True

    def release(self) -> None:
        """An abandoned thread's handler returned at last."""
        with self._lock:
            self._count = max(self._count - 1, 0)
