"""A blocking :class:`~nsqworker.nsq.producer.Producer` for threads: Flask, Django, scripts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.loop_thread import BlockingClient, LoopThread
from nsqworker.nsq.producer import Body, Producer
from nsqworker.transport import other_producer

if TYPE_CHECKING:
    from nsqworker.settings.nsq import NsqSettings as Settings

__all__ = ["SyncProducer"]


class SyncProducer(BlockingClient):
    """A blocking :class:`Producer` for threads: Flask, Django, scripts.

    It runs its own event loop in a daemon thread, started here; the methods hand
    coroutines to that loop and wait for them, so any number of threads may call them
    at once (their publishes are pipelined together). ``close()`` stops the loop; it
    also runs at interpreter exit if forgotten. Same arguments and semantics
    (at-least-once, failover) as :class:`Producer`. Never call it from its own loop.
    Under a pre-forking server (gunicorn ``--preload``) create it in each worker: a
    thread does not survive ``fork()``.
    """

    def __init__(
        self,
        nsqd_tcp_addresses: list[str] | str | None = None,
        *,
        settings: Settings | None = None,
        connection_config: ConnectionConfig | None = None,
        timeout: float = 5.0,
        envelope: bool | None = None,
        max_message_size: int | None = None,
        max_body_size: int | None = None,
    ) -> None:
        other: Any = None
        if nsqd_tcp_addresses is None:
            if settings is None:
                from nsqworker.settings.nsq import NsqSettings as _Settings

                settings = _Settings()  # from the environment and .env
            # Settings of another transport: its producer (NatsProducer...), as before.
            other = other_producer(settings, timeout)
        self._producer = (
            other
            if other is not None
            else Producer(
                nsqd_tcp_addresses,
                settings=settings,
                connection_config=connection_config,
                timeout=timeout,
                envelope=envelope,
                max_message_size=max_message_size,
                max_body_size=max_body_size,
            )
        )
        self.timeout = timeout
        self._runner = LoopThread("SyncProducer", "Producer", "the producer", self.close)
        self._runner.loop.call_soon_threadsafe(self._producer.start)
        self._call = self._runner.call

    def __repr__(self) -> str:
        return f"<SyncProducer {self._producer!r}>"

    @property
    def loop_thread(self) -> LoopThread:
        """The event loop the calls run on, and its daemon thread."""
        return self._runner

    @property
    def producer(self) -> Producer:
        """The async producer underneath (it lives on this object's loop)."""
        return self._producer

    def connect(self, timeout: float | None = None) -> None:
        """Wait until one nsqd is connected (optional: publishes connect on demand)."""
        self._call(self._producer.connect(timeout))

    def publish(
        self, topic: str, body: Body, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message (DPUB when ``delay`` seconds are given); see Producer."""
        self._call(self._producer.publish(topic, body, delay, timeout))

    def publish_json(
        self, topic: str, obj: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish ``obj`` as compact JSON; see :meth:`Producer.publish_json`."""
        self._call(self._producer.publish_json(topic, obj, delay, timeout))

    def publish_many(
        self, topic: str, bodies: Iterable[Body], timeout: float | None = None
    ) -> None:
        """Publish with MPUB, split when too big (then not atomic); see Producer."""
        self._call(self._producer.publish_many(topic, list(bodies), timeout))

    def close(self, timeout: float = 5.0) -> None:
        """Close the connections, stop the loop and join its thread. Idempotent."""
        self._runner.close(self._producer.close(timeout), timeout)
