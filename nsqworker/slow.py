"""Slow-handler detection, pure: which running messages just passed the slow threshold.

A handler's age counts from when it started, not from receipt (a message that waited
for a slot is not a slow handler): an async handler's start is recorded when it first
suspends; a sync handler's comes from its thread pool, which keeps it anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from nsqworker.message import Message

__all__ = ["newly_slow"]


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
