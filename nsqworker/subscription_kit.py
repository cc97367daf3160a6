"""What the transports' subscriptions share, written once.

Part of the transports' kit (with :mod:`nsqworker.reconnect`): modules the layout test
lets every transport import. :class:`SubscriptionKit` gives a subscription the clock of
``Message.received_at``, timers on its loop, its readiness and its background tasks;
:class:`NoDeliveryDeadline` is the keep-alive side of a broker whose deliveries have no
deadline (a RabbitMQ stream, a core NATS request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from nsqworker.message import Message
from nsqworker.transport import Timer

__all__ = ["NoDeliveryDeadline", "SubscriptionKit"]

_monotonic = time.monotonic


class SubscriptionKit:
    """A subscription's shared parts. The subclass defines :attr:`subscribed`, sets
    ``_loop`` when it starts and ``_stopping`` when it stops, and makes ``_tasks`` (the
    background tasks :meth:`_spawn` keeps referenced until they end) in its ``__init__``.
    """

    _loop: asyncio.AbstractEventLoop | None
    _stopping: bool
    _tasks: set[asyncio.Task[Any]]

    @property
    def subscribed(self) -> bool:
        """True while the subscription receives (the transport says when)."""
        raise NotImplementedError

    @property
    def ready(self) -> bool:
        """Subscribed and not stopping."""
        return self.subscribed and not self._stopping

    def clock(self) -> float:
        """Monotonic seconds: the clock of ``received_at``."""
        return _monotonic()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        """``callback`` after ``delay`` seconds, on the subscription's loop."""
        return (self._loop or asyncio.get_running_loop()).call_later(delay, callback)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, referenced until it ends (the loop keeps
        only a weak reference to a task)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


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
