"""NSQ as a transport: subscriptions over nsqd and nsqlookupd, producers, capabilities.

``Settings(transport="nsq")`` (the default) builds an :class:`NsqTransport` from the
settings' nsqd and lookupd addresses, TLS, AUTH and IDENTIFY options. See
``docs/transports.md`` for how NSQ's concepts map onto the task layer's.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from nsqworker.message import Message
from nsqworker.nsq import protocol
from nsqworker.nsq.capabilities import CAPABILITIES
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.producer import Producer
from nsqworker.nsq.subscription import NsqSubscription

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["CAPABILITIES", "NsqTransport"]


class NsqTransport:
    """NSQ from ``settings``: one connection config shared by every subscription."""

    capabilities = CAPABILITIES
    producer_class = Producer

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config = ConnectionConfig.from_settings(settings)
        self._producers: dict[str, Producer] = {}

    def __repr__(self) -> str:
        return f"<NsqTransport {self.describe()}>"

    def check_topic(self, topic: str) -> str:
        """NSQ's topic rule: 1-64 of ``[.a-zA-Z0-9_-]``, optional ``#ephemeral``."""
        return protocol.check_topic(topic)

    def check_channel(self, channel: str) -> str:
        """NSQ's channel rule (as for topics)."""
        return protocol.check_channel(channel)

    def subscribe(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> NsqSubscription:
        """A subscription on every nsqd of the settings or of lookupd that has ``topic``."""
        return NsqSubscription(
            topic, channel, self.settings, name=name, max_in_flight=max_in_flight,
            connection_config=self.config,
        )  # fmt: skip

    def publisher(self, near: Message | None = None) -> Producer:
        """A producer to the settings' nsqd, else to the nsqd that delivered ``near``."""
        key = "" if self.settings.nsqd_tcp_addresses or near is None else near.address
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = Producer(
                [key] if key else None, settings=self.settings,
                connection_config=self.config, envelope=False,
            )  # fmt: skip
        return producer

    def results_publisher(self, near: Message | None, envelope: bool) -> Producer:
        """The producer of what handlers publish (``publish_to``, ``Publish``): as
        :meth:`publisher`, but wrapping bodies in the trace envelope (with its send
        span's context) when ``envelope`` is True."""
        if not envelope:
            return self.publisher(near)
        key = "" if self.settings.nsqd_tcp_addresses or near is None else near.address
        producer = self._producers.get(key + " envelope")
        if producer is None:
            producer = self._producers[key + " envelope"] = Producer(
                [key] if key else None, settings=self.settings,
                connection_config=self.config, envelope=True,
            )  # fmt: skip
        return producer

    def describe(self) -> dict[str, str]:
        """The nsqd and nsqlookupd addresses of the settings."""
        described = {}
        if self.settings.nsqd_tcp_addresses:
            described["nsqd"] = ",".join(self.settings.nsqd_tcp_addresses)
        if self.settings.lookupd_http_addresses:
            described["lookupd"] = ",".join(self.settings.lookupd_http_addresses)
        return described

    async def close(self) -> None:
        """Close the producers made for dead letters."""
        producers, self._producers = list(self._producers.values()), {}
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)
