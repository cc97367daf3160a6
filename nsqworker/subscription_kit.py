"""What the transports' subscriptions share, written once.

Part of the transports' kit (with :mod:`nsqworker.reconnect`): modules the layout test
lets every transport import. :class:`SubscriptionKit` gives a subscription its names and
window, the receiver it hands deliveries to, the clock of ``Message.received_at``, timers
on its loop, its readiness, its background tasks and its error counts;
:class:`ErrorCounts` are those counts (a connection's, shared by the subscriptions on
it); :class:`NoDeliveryDeadline` is the keep-alive side of a broker whose deliveries have
no deadline (a RabbitMQ stream, a core NATS request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from nsqworker.errors import ConfigurationError
from nsqworker.message import Message
from nsqworker.reconnect import reconnect_delay
from nsqworker.transport import Flow, Receiver, Timer

__all__ = ["ErrorCounts", "NoDeliveryDeadline", "SubscriptionKit"]

_monotonic = time.monotonic


class ErrorCounts(dict[str, int]):
    """Connection failures and broker errors by reason (``SubscriptionStats.errors``):
    a plain dict to read, counted with :meth:`count`."""

    def count(self, reason: str) -> None:
        """One more ``reason``."""
        self[reason] = self.get(reason, 0) + 1


class SubscriptionKit:
    """A subscription's shared parts. The subclass defines :attr:`subscribed`, calls
    :meth:`_starting` first in ``start``, keeps ``_flow`` (the receiver's last
    :class:`~nsqworker.transport.Flow`) in ``set_flow`` and sets ``_stopping`` when it
    stops.

    ``errors`` are the counts its ``stats()`` shows: its connection's, so that the
    connection's own failures and the subscription's (:meth:`_count_error`) are one dict.
    """

    _log = logging.getLogger("nsqworker")
    """Where the kit's lines go: each transport sets its own logger."""

    def __init__(
        self, topic: str, channel: str, *, name: str, window: int, errors: ErrorCounts
    ) -> None:
        self.topic = topic
        self.channel = channel
        self.name = name
        self.window = window
        """How many deliveries the receiver lets be unsettled (``set_flow``)."""
        self._errors = errors
        self._flow = Flow.OPEN
        self._receiver: Receiver | None = None
        self._deliver: Callable[[Message], bool] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.topic}/{self.channel} window={self.window}>"

    # --- the receiver ------------------------------------------------------------

    def bind(self, receiver: Receiver) -> None:
        """Hand deliveries to ``receiver`` from now on, on the running loop: what
        ``start`` does before it subscribes (a test or a benchmark that feeds the
        subscription without a broker calls it alone)."""
        self._receiver = receiver
        self._deliver = receiver.deliver
        self._loop = asyncio.get_running_loop()

    def _starting(self, receiver: Receiver) -> bool:
        """The first ``start``: bind ``receiver`` and say True; False for any later call
        (started already: nothing to do)."""
        if self._started:
            return False
        self._started = True
        self.bind(receiver)
        return True

    # --- state -------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        """True while the subscription receives (the transport says when)."""
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        """Subscribed and not stopping."""
        return self.subscribed and not self._stopping

    def _allowed(self) -> int:
        """How many deliveries the flow lets be unsettled: the window, one while
        probing, none while paused or stopping."""
        if self._stopping or self._flow is Flow.PAUSED:
            return 0
        return 1 if self._flow is Flow.PROBE else self.window

    # --- time ----------------------------------------------------------------------

    def clock(self) -> float:
        """Monotonic seconds: the clock of ``received_at``."""
        return _monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """``callback`` after ``delay`` seconds, on the subscription's loop."""
        return (self._loop or asyncio.get_running_loop()).call_later(delay, callback)

    # --- background tasks and errors ---------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, referenced until it ends (the loop keeps
        only a weak reference to a task)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _first_attempt(
        self, attempt: Callable[[], Awaitable[None]], done: Callable[[], bool],
        delays: tuple[float, float], what: str,
    ) -> None:  # fmt: skip
        """``await attempt()`` (subscribing, binding...): a ``ConfigurationError`` (the
        broker refused a setting) is raised; any other failure is logged and ``attempt``
        is retried in the background (:meth:`_retry_until`)."""
        try:
            await attempt()
        except ConfigurationError:
            raise
        except Exception as exc:
            self._log.warning("%s: %s not ready (%s); retrying", self.name, what, exc)
            self._spawn(self._retry_until(attempt, done, delays, what))

    async def _retry_until(
        self, attempt: Callable[[], Awaitable[None]], done: Callable[[], bool],
        delays: tuple[float, float], what: str,
    ) -> None:  # fmt: skip
        """``attempt()`` until ``done()`` or the subscription stops, each after a
        reconnect delay (``delays``: base and cap; exponential, with jitter)."""
        failures = 0
        while not done() and not self._stopping:
            failures += 1
            delay = reconnect_delay(failures, *delays)
            await asyncio.sleep(delay)
            try:
                await attempt()
            except Exception as exc:
                self._log.warning("%s: %s not ready (%s); retrying", self.name, what, exc)

    def _cancel_tasks(self) -> None:
        """Cancel every background task (at close)."""
        for task in list(self._tasks):
            task.cancel()

    def _count_error(self, reason: str) -> None:
        """One more ``reason`` in the errors :meth:`_error_counts` shows."""
        self._errors.count(reason)

    def _error_counts(self) -> dict[str, int]:
        """A copy of the error counts, for ``stats()``."""
        return dict(self._errors)


class NoDeliveryDeadline:
    """The keep-alive side of a broker whose deliveries have no deadline: nothing to
    extend, no interval, no longest hold (a handler may run as long as it needs)."""

    def keep_alive(self, msg: Message) -> None:
        """Nothing to extend."""

    def keep_alive_interval(self, msg: Message) -> float | None:
        """None: nothing to keep alive."""
        return None

    def max_hold(self, msg: Message) -> float | None:
        """None: no limit on the broker's side."""
        return None
