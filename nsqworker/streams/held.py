"""Retries read ahead and held until they are due (see :mod:`nsqworker.streams.retries`).

A retry stream is read in order, but a retry not due yet must not hold back the ones
behind it: :class:`Holds` keeps it (its offset delivered, not settled, so the stored
offset never passes it) with a timer, and hands it to the window when due; past
:data:`~nsqworker.streams.retries.HOLD_LIMIT` held, the reader waits (in order again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nsqworker.streams.capabilities import CAPABILITIES
from nsqworker.streams.retries import HOLD_LIMIT

if TYPE_CHECKING:
    from nsqworker.streams.offsets import Watermark

__all__ = ["MAX_NOT_BEFORE", "Holds"]

log = logging.getLogger("nsqworker.streams")

MAX_NOT_BEFORE = CAPABILITIES.max_retry_delay
"""The longest a retry is held (the transport's ``max_retry_delay``): a later
``x-not-before`` was not written by nsqworker."""

Item = tuple[Any, "Watermark", Any, int, int]
"""(reader, its watermark then, the record, its offset, its chunk's timestamp in ms)."""


class Holds:
    """The held retries of one subscription; ``take(item)`` hands a due one on, once
    ``wait_for_room()`` returned and ``current(item)`` still holds."""

    def __init__(
        self,
        name: str,
        take: Callable[[Item], None],
        wait_for_room: Callable[[], Awaitable[None]],
        current: Callable[[Item], bool],
    ) -> None:
        self.name = name
        self._take = take
        self._wait_for_room = wait_for_room
        self._current = current
        self.count = 0
        self._room = asyncio.Event()
        self._due: list[Item] = []
        self._due_ready = asyncio.Event()
        self._timers: dict[int, dict[int, asyncio.TimerHandle]] = {}
        self._warned = False

    def held(self, reader: Any) -> int:
        """Retries of ``reader`` held now."""
        return len(self._timers.get(id(reader), {}))

    def wait_until(self, due: Any, where: str) -> float:
        """Seconds to hold a retry with this ``x-not-before`` (ms since the epoch), at
        most :data:`MAX_NOT_BEFORE`: anyone allowed to write to the retry stream could
        otherwise stall every retry of the channel for ever."""
        if type(due) is not int:
            return 0.0
        wait = due / 1000 - time.time()
        if wait > MAX_NOT_BEFORE:
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s: a retry in %s is due in %.0fs, over the bound of %.0fs (not written"
                    " by nsqworker); holding it %.0fs", self.name, where, wait,
                    MAX_NOT_BEFORE, MAX_NOT_BEFORE,
                )  # fmt: skip
            wait = MAX_NOT_BEFORE
        return wait

    async def hold(self, item: Item, wait: float) -> None:
        """Keep ``item`` (its offset delivered, unsettled) until ``wait`` seconds from
        now; past :data:`HOLD_LIMIT` held, wait here for room first. The time spent
        waiting for room counts: the retry is due when it was, not ``wait`` after."""
        due = time.monotonic() + wait
        while self.count >= HOLD_LIMIT:
            self._room.clear()
            await self._room.wait()
        reader, mark, _, offset, _ = item
        mark.delivered(offset)
        loop = asyncio.get_running_loop()
        self._timers.setdefault(id(reader), {})[offset] = loop.call_later(
            max(0.0, due - time.monotonic()), self._make_due, item
        )
        self.count += 1

    def _make_due(self, item: Item) -> None:
        if self._timers.get(id(item[0]), {}).pop(item[3], None) is not None:
            self._release()
            self._due.append(item)
            self._due_ready.set()

    def _release(self) -> None:
        self.count -= 1
        self._room.set()

    def drop(self, reader: Any) -> None:
        """Forget ``reader``'s held retries (their offsets were not stored: they are
        read again by the next active consumer)."""
        for timer in self._timers.pop(id(reader), {}).values():
            timer.cancel()
            self._release()
        self._due = [item for item in self._due if item[0] is not reader]

    async def hand_on_due(self) -> None:
        """Hand each due retry to the window, as room comes (runs until cancelled)."""
        while True:
            await self._due_ready.wait()
            while self._due:
                await self._wait_for_room()
                if not self._due:
                    break
                item = self._due.pop(0)
                if self._current(item):
                    self._take(item)
            self._due_ready.clear()
