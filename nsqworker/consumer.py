"""A consumer without tasks: a callback on a topic and channel, with the task layer's
policy, on the transport the settings name (tests, tools, the RPC client's replies).

``Consumer(topic, channel, callback, settings)`` is a
:class:`~nsqworker.dispatch.Dispatcher` over a new subscription; options left None take
the ``settings`` defaults. A worker's task runner builds the same for its task, with
telemetry, through the same :func:`open_subscription`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.dispatch import Callback, Dispatcher, Policy, RejectHook
from nsqworker.transport import Subscription, Transport, create_transport

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["Consumer", "open_subscription"]


def open_subscription(
    transport: Transport,
    topic: str,
    channel: str,
    *,
    max_in_flight: int,
    name: str | None = None,
    requests: bool = False,
) -> Subscription:
    """A new subscription of ``transport`` to ``topic`` on ``channel``, both names
    checked first (a clear error naming what is wrong). ``requests``: the transport's
    request/reply subscription where it has one (``@rpc`` on NATS), else the plain one.
    ``name`` defaults to ``topic/channel``."""
    topic, channel = transport.check_topic(topic), transport.check_channel(channel)
    subscribe = transport.subscribe
    if requests:
        subscribe = getattr(transport, "subscribe_requests", subscribe)
    return subscribe(topic, channel, name=name or f"{topic}/{channel}", max_in_flight=max_in_flight)


class Consumer(Dispatcher):
    """A dispatcher over a new subscription of the settings' transport: consume
    ``topic`` on ``channel`` with ``callback`` (no task, no telemetry; tests, tools).

    Options left None take the ``settings`` defaults. ``on_reject(msg, reason)`` runs
    before each reject (``on_give_up`` is its deprecated old name, as ``requeue_delay``
    is ``retry_delay``'s).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        callback: Callback,
        settings: Settings,
        *,
        max_in_flight: int | None = None,
        max_attempts: int | None = None,
        retry_delay: float | None = None,
        on_reject: RejectHook | None = None,
        name: str | None = None,
        on_give_up: RejectHook | None = None,
        requeue_delay: float | None = None,
    ) -> None:
        policy = Policy.from_settings(
            settings,
            max_in_flight=max_in_flight,
            max_attempts=max_attempts,
            retry_delay=retry_delay if retry_delay is not None else requeue_delay,
        )
        self.transport = create_transport(settings)
        sub = open_subscription(
            self.transport, topic, channel, name=name, max_in_flight=policy.max_in_flight
        )
        super().__init__(
            sub,
            callback,
            policy,
            capabilities=self.transport.capabilities,
            on_reject=on_reject if on_reject is not None else on_give_up,
            name=name,
        )

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Drain and close (see :meth:`Dispatcher.stop`), then close the transport this
        consumer made (its publishers and, on NATS, its connection)."""
        await super().stop(drain_timeout)
        await self.transport.close()
