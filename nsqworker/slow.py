"""Slow-handler detection: which running messages just passed the slow threshold.

:func:`newly_slow` is the pure rule; :class:`SlowWatch` keeps its state for one task (the
dispatcher tells it when an async handler suspends and ends, and asks it to look on each
keep-alive sweep).

A handler's age counts from when it started, not from receipt (a message that waited
for a slot is not a slow handler): an async handler's start is recorded when it first
suspends; a sync handler's comes from its thread pool, which keeps it anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from nsqworker.message import Message

__all__ = ["SlowWatch", "newly_slow"]


class SlowWatch:
    """One task's slow-handler watch: ``report(msg, seconds)`` once per message whose
    handler runs longer than ``threshold()`` seconds.

    ``thread_ages()`` gives the ages of the sync handlers running in threads (their pool
    keeps them anyway, so the sync hot path records nothing); None for async tasks.
    """

    def __init__(
        self,
        report: Callable[[Message, float], None],
        threshold: Callable[[], float],
        thread_ages: Callable[[], dict[Message, float]] | None = None,
    ) -> None:
        self.report = report
        self.threshold = threshold
        self.thread_ages = thread_ages
        self._began: dict[Message, float] = {}
        self._seen: set[Message] = set()

    def began(self, msg: Message, now: float) -> None:
        """An async handler suspended: its age counts from ``now``."""
        self._began[msg] = now

    def ended(self, msg: Message) -> None:
        """An async handler that suspended is done."""
        self._began.pop(msg, None)

    def look(self, now: float, running: list[Message], deferred: Collection[Message]) -> None:
        """Report the handlers of ``running`` that just passed the threshold;
        ``deferred``: those of them handed to a thread."""
        if not running and not self._seen:
            return
        ages = None
        if self.thread_ages is not None:
            ages = self.thread_ages() if deferred else {}
        found = newly_slow(now, running, self._began, ages, deferred, self.threshold(), self._seen)
        for msg, age in found:
            self.report(msg, age)


def newly_slow(
    now: float,
    running: Iterable[Message],
    began: Mapping[Message, float],
    thread_ages: Mapping[Message, float] | None,
    deferred: Collection[Message],
    after: float,
    seen: set[Message],
) -> list[tuple[Message, float]]:
    """``(msg, age)`` for each running message older than ``after`` seconds and not
    reported before; ``seen`` (the reported ones) is updated and pruned to ``running``.

    ``thread_ages``: ages of the sync handlers running in threads (None: no pool); a
    deferred message without one is still queued for a thread, not running."""
    running = list(running)
    seen.intersection_update(running)
    found = []
    for msg in running:
        if msg in began:
            age = now - began[msg]
        elif thread_ages is not None and msg in thread_ages:
            age = thread_ages[msg]
        elif thread_ages is not None and msg in deferred:
            continue  # queued for a thread (one still held past a time limit)
        else:
            age = now - msg.received_at
        if age > after and msg not in seen and not msg.answered:
            seen.add(msg)
            found.append((msg, age))
    return found
