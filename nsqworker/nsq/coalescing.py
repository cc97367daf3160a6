"""Publishes made while others are in flight go to nsqd together, as one MPUB.

nsqd answers every PUB with a write of its own, so a connection carries at most what
nsqd can answer one by one (``make bench`` measures it: a bare socket writing 1,000
PUBs at once), and a PUB each costs the producer a command and an answer to match. A
:class:`Coalescer` gathers the ``publish()`` calls to one topic made in one turn of the
event loop while the producer already has calls in flight (``asyncio.gather``, many
tasks, many ``SyncProducer`` threads) and sends them when the turn ends: one MPUB, or a
PUB for a lone call. Nothing waits to fill a batch: a producer with nothing in flight
sends its call at once, as a PUB (the producer decides; this module only batches).

Each call keeps its own outcome. The batch's answer settles every call in it; when it
is not OK, each call is told what to do:

- the connection was lost (or nsqd failed to store the batch): send again
  (:class:`Resend` naming the nsqd to avoid), as a lone publish would be;
- nsqd refused the MPUB (``E_BAD_MESSAGE``...): nothing of it was stored (an MPUB is
  atomic), so each call sends its message alone (:class:`Resend` with no nsqd to
  avoid), and only the one at fault fails, with nsqd's own error;
- no answer in time: each call's ``TimeoutError``.

A call cancelled before its turn ends is not sent. Order within a topic is kept: the
producer sends a topic's batch before a DPUB, an MPUB or a traced call to it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from nsqworker.errors import NSQDError, RemoteProtocolError
from nsqworker.nsq import protocol
from nsqworker.nsq.pool import Node
from nsqworker.nsq.publishing import SIZE, split_batches

__all__ = ["Batch", "Coalescer", "Resend"]


class Resend(Exception):
    """Internal: a batched call is to send its message again on its own (to any nsqd
    but ``avoid`` when given), within ``deadline`` (loop time)."""

    def __init__(self, avoid: Node | None, deadline: float) -> None:
        super().__init__("send alone")
        self.avoid = avoid
        self.deadline = deadline


class Batch:
    """The calls to one topic, with one timeout, made in one turn of the loop."""

    __slots__ = ("bodies", "futures", "line", "timeout", "topic")

    def __init__(self, topic: str, line: bytes, timeout: float) -> None:
        self.topic = topic
        self.line = line  # b"PUB topic\n"
        self.timeout = timeout
        self.bodies: list[bytes] = []
        self.futures: list[asyncio.Future[None]] = []


Check = Callable[[Exception, Node, str, bool], None]
"""The producer's ``_check_retry``: raises what a failure means unless it may be retried."""


class Coalescer:
    """A producer's batches of the current loop turn, sent when the turn ends.

    ``choose`` hands out the next live nsqd (or None); ``check`` tells a retryable
    failure from a final one; ``body_limit`` is nsqd's ``--max-body-size`` as known.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        choose: Callable[[Node | None], Node | None],
        check: Check,
        body_limit: Callable[[], int],
    ) -> None:
        self._loop = loop
        self._choose = choose
        self._check = check
        self._body_limit = body_limit
        self._batches: dict[tuple[str, float], Batch] = {}
        self._scheduled = False

    def add(self, topic: str, line: bytes, body: bytes, timeout: float) -> asyncio.Future[None]:
        """Join the turn's batch for ``topic``; the future settles with the batch's
        answer (or raises :class:`Resend`). ``body`` is checked already."""
        key = (topic, timeout)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = Batch(topic, line, timeout)
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon(self._end_of_turn)
        future: asyncio.Future[None] = self._loop.create_future()
        batch.bodies.append(body)
        batch.futures.append(future)
        return future

    def send_topic(self, topic: str) -> None:
        """Send ``topic``'s batches now: something else for it is about to be sent."""
        if self._batches:
            for key in [k for k in self._batches if k[0] == topic]:
                self._send(self._batches.pop(key))

    def send_all(self) -> None:
        """Send every batch now (the producer closes)."""
        batches, self._batches = self._batches, {}
        for batch in batches.values():
            self._send(batch)

    def _end_of_turn(self) -> None:
        self._scheduled = False
        self.send_all()

    def _send(self, batch: Batch) -> None:
        bodies, futures = batch.bodies, batch.futures
        if any(f.done() for f in futures):  # cancelled before the turn ended: not sent
            kept = [(b, f) for b, f in zip(bodies, futures, strict=True) if not f.done()]
            bodies, futures = [b for b, _ in kept], [f for _, f in kept]
        if not futures:
            return
        deadline = self._loop.time() + batch.timeout
        node = self._choose(None)
        conn = None if node is None else node.conn
        if node is None or conn is None:
            _settle(futures, Resend(None, deadline))  # each waits for a connection itself
            return
        start = 0
        for part in split_batches(bodies, self._body_limit()):
            waiting = futures[start : start + len(part)]
            start += len(part)
            if len(part) == 1:
                operation = "PUB"
                command = batch.line + SIZE.pack(len(part[0])) + part[0]
            else:
                operation = "MPUB"
                command = protocol.mpub_line(b"M" + batch.line, part)
            try:
                answer = conn.submit(command, batch.timeout)
            except Exception as exc:  # lost since chosen: ConnectionClosed
                self._failed(exc, node, operation, waiting, deadline)
                continue
            answer.add_done_callback(
                functools.partial(self._answered, node, operation, waiting, deadline)
            )

    def _answered(
        self,
        node: Node,
        operation: str,
        futures: list[asyncio.Future[None]],
        deadline: float,
        answer: asyncio.Future[bytes],
    ) -> None:
        exc = answer.exception()
        if exc is None:
            result = answer.result()
            if result == protocol.OK:
                for future in futures:
                    if not future.done():
                        future.set_result(None)
                return
            exc = RemoteProtocolError(f"nsqd {node.address} answered {operation} with {result!r}")
        assert isinstance(exc, Exception)
        self._failed(exc, node, operation, futures, deadline)

    def _failed(
        self,
        exc: Exception,
        node: Node,
        operation: str,
        futures: list[asyncio.Future[None]],
        deadline: float,
    ) -> None:
        outcome: Exception
        try:
            self._check(exc, node, operation, False)
            outcome = Resend(node, deadline)
        except NSQDError as refused:
            # An MPUB is atomic: refused, none of it was stored; alone, only the message
            # at fault fails. A lone PUB's refusal is its own.
            outcome = Resend(None, deadline) if operation == "MPUB" else refused
        except Exception as final:
            outcome = final
        _settle(futures, outcome)


def _settle(futures: list[asyncio.Future[None]], outcome: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(outcome)
