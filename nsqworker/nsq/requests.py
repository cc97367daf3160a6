"""The requests a connection sent to nsqd and their answers, in order, and when they
time out (one timer for every request waiting for its answer).

nsqd answers a connection's requests in the order they were sent, so a request that
timed out keeps its place in the queue (its answer may still come, and must not be taken
for the next request's); only its future fails.
"""

from __future__ import annotations

import asyncio
import collections

from nsqworker.errors import ConnectionClosed

__all__ = ["SWEEP_SLACK", "Deadlines", "Request", "Requests"]

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


class Requests:
    """One connection's requests waiting for nsqd's answer: ``pending`` in the order
    sent, and their :class:`Deadlines`. The connection appends to both (its hot path);
    the answers come back through :meth:`next` and :meth:`answer_oks`."""

    __slots__ = ("deadlines", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pending: collections.deque[Request] = collections.deque()
        self.deadlines = Deadlines(loop)

    def __len__(self) -> int:
        return len(self.pending)

    def next(self) -> Request | None:
        """The oldest request, which the answer just received is for; None if none."""
        if not self.pending:
            return None
        request = self.pending.popleft()
        queue = self.deadlines.queue
        if queue and queue[0] is request:
            queue.popleft()
        return request

    def answer_oks(self, count: int, ok: bytes) -> bool:
        """Answer the ``count`` oldest requests with ``ok`` (a read of nothing but OKs, a
        publisher's usual read); False, and nothing answered, if fewer are pending."""
        pending = self.pending
        if count > len(pending):
            return False
        queue = self.deadlines.queue
        for _ in range(count):
            request = pending.popleft()
            if queue and queue[0] is request:
                queue.popleft()
            future = request[0]
            if not future.done():  # a cancelled or timed-out request still owns its answer
                future.set_result(ok)
        return True

    def fail_all(self, reason: ConnectionClosed) -> None:
        """The connection is lost: fail every request waiting with ``reason``."""
        self.deadlines.clear()
        pending = self.pending
        while pending:
            future = pending.popleft()[0]
            if not future.done():
                future.set_exception(ConnectionClosed(reason.reason, reason.error))
