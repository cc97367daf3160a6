"""NATS JetStream as a transport: durable pull consumers, JetStream publishing.

``Settings(transport="nats")`` builds a :class:`NatsTransport`: one NATS connection per
worker process (:mod:`nsqworker.nats.client`), a :class:`NatsSubscription` per task and
a :class:`NatsProducer` for dead letters and handlers. docs/nats.md maps the concepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.message import Message
from nsqworker.nats.capabilities import CAPABILITIES
from nsqworker.nats.client import NatsConnection
from nsqworker.nats.jetstream import check_channel, check_subject
from nsqworker.nats.producer import NatsProducer
from nsqworker.nats.requests import NatsRequestSubscription
from nsqworker.nats.subscription import NatsSubscription

if TYPE_CHECKING:
    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = ["CAPABILITIES", "NatsTransport"]


class NatsTransport:
    """NATS from ``settings``: one connection shared by every subscription and publisher."""

    capabilities = CAPABILITIES
    producer_class = NatsProducer

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connection = NatsConnection(settings, name=f"nsqworker {settings.client_id}")
        self._producer: NatsProducer | None = None

    def __repr__(self) -> str:
        return f"<NatsTransport {self.describe()}>"

    def check_topic(self, topic: str) -> str:
        """A subject without wildcards or spaces."""
        return check_subject(topic)

    def check_channel(self, channel: str) -> str:
        """A JetStream consumer name."""
        return check_channel(channel)

    def subscribe(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> NatsSubscription:
        """The channel's durable consumer on the stream holding ``topic``."""
        return NatsSubscription(
            topic, channel, self.connection, self.settings, name=name, max_in_flight=max_in_flight
        )

    def subscribe_requests(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> NatsRequestSubscription:
        """NATS requests to ``topic`` (core NATS, queue group ``channel``), for ``@rpc``."""
        return NatsRequestSubscription(
            topic, channel, self.connection, name=name, max_in_flight=max_in_flight
        )

    def publisher(self, near: Message | None = None) -> NatsProducer:
        """A producer on the worker's connection (``near`` is the same cluster)."""
        if self._producer is None:
            self._producer = NatsProducer(settings=self.settings, connection=self.connection)
        return self._producer

    def describe(self) -> dict[str, str]:
        """The NATS servers of the settings."""
        return {"nats": ",".join(self.connection.servers)}

    async def close(self) -> None:
        """Flush and close the connection."""
        await self.connection.close()
