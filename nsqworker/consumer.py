"""A consumer without tasks: a callback on a topic and channel, with the task layer's
policy, on the transport the settings name (tests, tools, the RPC client's replies).

``Consumer(topic, channel, callback, settings)`` is a
:class:`~nsqworker.dispatch.Dispatcher` over a new subscription; options left None take
the ``settings`` defaults. A ``Worker`` builds the same for each task, with telemetry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.dispatch import Callback, Dispatcher, GiveUpHook, Policy
from nsqworker.transport import create_transport

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["Consumer"]


class Consumer(Dispatcher):
    """A dispatcher over a new subscription of the settings' transport: consume
    ``topic`` on ``channel`` with ``callback`` (no task, no telemetry; tests, tools).

    Options left None take the ``settings`` defaults.
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
        requeue_delay: float | None = None,
        on_give_up: GiveUpHook | None = None,
        name: str | None = None,
    ) -> None:
        policy = Policy.from_settings(
            settings,
            max_in_flight=max_in_flight,
            max_attempts=max_attempts,
            requeue_delay=requeue_delay,
        )
        self.transport = create_transport(settings)
        caps = self.transport.capabilities
        topic = self.transport.check_topic(topic)
        channel = self.transport.check_channel(channel)
        name = name or f"{topic}/{channel}"
        sub = self.transport.subscribe(
            topic, channel, name=name, max_in_flight=policy.max_in_flight
        )
        super().__init__(
            sub,
            callback,
            policy,
            on_give_up=on_give_up,
            name=name,
            max_retry_delay=caps.max_retry_delay,
            keep_alive=caps.keep_alive,
        )

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Drain and close (see :meth:`Dispatcher.stop`), then close the transport this
        consumer made (its publishers and, on NATS, its connection)."""
        await super().stop(drain_timeout)
        await self.transport.close()
