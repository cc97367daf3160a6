"""The offset a stream consumer may store: the contiguous low watermark, pure.

A stream is read in offset order, but messages finish in any order (handlers run at
once, and retries leave early). The offset stored on the server must never pass an
unfinished message, or a restart would skip it: :class:`Watermark` keeps the delivered
offsets in order and moves the watermark over the finished ones at the front.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Watermark"]


class Watermark:
    """Delivered offsets in order; ``value`` is the highest offset with every delivered
    offset up to it settled (None before any)."""

    __slots__ = ("_done", "_order", "stored", "value")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        self.value: int | None = None
        self.stored: int | None = None
        """The last value written to the server (set by the owner)."""

    def __len__(self) -> int:
        """Offsets delivered and not yet settled."""
        return len(self._order) - len(self._done)

    def delivered(self, offset: int) -> None:
        """``offset`` was handed out; offsets come in increasing order. It may have been
        :meth:`settled` already (an outcome known while it was being handed out)."""
        order = self._order
        if order and offset <= order[-1]:
            raise ValueError(f"offset {offset} after {order[-1]}: offsets must increase")
        if self._done and offset in self._done and not order:
            self._done.discard(offset)
            self.value = offset
            return
        order.append(offset)

    def passed(self, offset: int) -> None:
        """``offset`` was handed out and settled at once (the handler finished inline):
        :meth:`delivered` then :meth:`settled`, in one step when nothing is pending."""
        if self._order:
            self.delivered(offset)
            self.settled(offset)
        else:
            self.value = offset

    def settled(self, offset: int) -> None:
        """``offset`` is finished (finished, retried elsewhere, or rejected)."""
        order = self._order
        if order and order[0] == offset:
            order.popleft()
            self.value = offset
            done = self._done
            while order and order[0] in done:
                self.value = order.popleft()
                done.discard(self.value)
        else:
            self._done.add(offset)

    @property
    def dirty(self) -> bool:
        """The watermark moved past the last stored value."""
        return self.value is not None and self.value != self.stored
