"""Negative checks: "nothing more arrives" proved by watching for a stated time.

A test that sleeps, then asserts that something did not happen, passes on a machine too
slow for the thing to have happened yet. These helpers watch the condition for the whole
window after a positive sync point (a count the test waited for), fail the moment it
breaks (saying when), and take the window from one place: :func:`window` scales it by
``NSQWORKER_TEST_SLACK`` (default 1; a loaded machine's CI may raise it), the one slack
factor of a test run (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

__all__ = ["SLACK_ENV", "holds", "holds_async", "slack", "window"]

SLACK_ENV = "NSQWORKER_TEST_SLACK"
"""Environment variable: the factor every stated window and wall-clock bound of the tests
is multiplied by (a number >= 1)."""


def slack() -> float:
    """The run's slack factor: ``$NSQWORKER_TEST_SLACK``, at least 1 (1 when unset or not
    a number)."""
    try:
        return max(1.0, float(os.environ.get(SLACK_ENV, "1")))
    except ValueError:
        return 1.0


def window(seconds: float) -> float:
    """``seconds`` times the run's :func:`slack`."""
    return seconds * slack()


class _Watch:
    """One watch: :meth:`over` checks the condition once, raises if it broke, and says
    whether the window has passed."""

    def __init__(self, condition: Callable[[], object], seconds: float, message: str) -> None:
        self.condition, self.message = condition, message
        self.start = time.monotonic()
        self.end = self.start + window(seconds)

    def over(self) -> bool:
        if not self.condition():
            took = time.monotonic() - self.start
            raise AssertionError(f"{self.message} (after {took:.2f}s)")
        return time.monotonic() >= self.end


def holds(
    condition: Callable[[], object], seconds: float, message: str, interval: float = 0.05
) -> None:
    """Check ``condition`` stays true for :func:`window` (``seconds``); AssertionError
    naming ``message`` and when it broke otherwise."""
    watch = _Watch(condition, seconds, message)
    while not watch.over():
        time.sleep(interval)


async def holds_async(
    condition: Callable[[], object], seconds: float, message: str, interval: float = 0.05
) -> None:
    """:func:`holds` for async tests: the loop keeps running while it watches."""
    watch = _Watch(condition, seconds, message)
    while not watch.over():
        await asyncio.sleep(interval)
