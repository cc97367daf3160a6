"""When requests to nsqd time out: one timer for every request waiting for its answer.

nsqd answers a connection's requests in the order they were sent, so a request that
timed out keeps its place in the connection's queue (its answer may still come, and must
not be taken for the next request's); only its future fails.
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["SWEEP_SLACK", "Deadlines", "Request"]

Request = tuple[asyncio.Future[bytes], bool, float | None, float]
"""A request waiting for its answer: (future, is it a publish, timeout or None, deadline)."""
SWEEP_SLACK = 0.001
"""The sweep may run up to the loop's clock resolution early (uvloop counts in whole
milliseconds); what is due within this much counts as due, as a timer would."""


def _expire(future: asyncio.Future[bytes], timeout: float | None) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no answer from nsqd within {timeout} s"))


class Deadlines:
    """The deadlines of one connection's requests.

    ``queue`` holds the requests with a timeout in the order sent, deadlines never
    decreasing: one timer (the sweep), armed for the first, stands for a timer per
    request. A request due before one sent earlier (a shorter timeout) gets a timer of
    its own instead. The connection takes a request off the front of ``queue`` when its
    answer comes.
    """

    __slots__ = ("_loop", "_sweep", "_sweep_at", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.queue: collections.deque[Request] = collections.deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at = 0.0

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def armed(self) -> bool:
        """True while the sweep's timer is set."""
        return self._sweep is not None

    def add(self, request: Request) -> None:
        """Fail ``request``'s future with TimeoutError at its deadline unless answered."""
        queue = self.queue
        deadline = request[3]
        if queue and deadline < queue[-1][3]:
            future, timeout = request[0], request[2]
            timer = self._loop.call_later(deadline - self._loop.time(), _expire, future, timeout)
            future.add_done_callback(lambda _: timer.cancel())
            return
        queue.append(request)
        if self._sweep is None or deadline < self._sweep_at:
            self._arm(deadline)

    def clear(self) -> None:
        """Forget every deadline (the connection failed the requests itself)."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self.queue.clear()

    def _arm(self, when: float) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        self._sweep_at = when
        self._sweep = self._loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        """Fail the requests whose deadline passed; re-arm for the next one."""
        self._sweep = None
        queue = self.queue
        due = self._loop.time() + SWEEP_SLACK
        while queue:
            future, _, timeout, deadline = queue[0]
            if not future.done():  # else cancelled; its answer is still expected
                if deadline > due:
                    self._arm(deadline)
                    return
                future.set_exception(TimeoutError(f"no answer from nsqd within {timeout} s"))
            queue.popleft()
