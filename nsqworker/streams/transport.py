"""RabbitMQ Streams as a transport: the task layer over append-only logs.

``Settings(transport="rabbitmq-stream")`` builds a :class:`StreamTransport`: one pair of
rstream clients per worker process (:mod:`nsqworker.streams.client`), a
:class:`StreamSubscription` per task, and a :class:`StreamProducer` for dead letters,
retries and handlers. docs/rabbitmq-streams.md maps the concepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.message import Message
from nsqworker.streams.capabilities import CAPABILITIES
from nsqworker.streams.client import StreamConnections, check_stream
from nsqworker.streams.producer import StreamProducer
from nsqworker.streams.subscription import StreamSubscription

if TYPE_CHECKING:
    from nsqworker.settings.streams import StreamSettings as Settings

__all__ = ["CAPABILITIES", "StreamTransport"]


class StreamTransport:
    """RabbitMQ Streams from ``settings``: shared connections and producer."""

    capabilities = CAPABILITIES
    producer_class = StreamProducer

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.connections = StreamConnections(settings)
        self.producer = StreamProducer(settings=settings, connections=self.connections)

    def __repr__(self) -> str:
        return f"<StreamTransport {self.connections.endpoint.address}>"

    def check_topic(self, topic: str) -> str:
        """A RabbitMQ stream name."""
        return check_stream(topic)

    def check_channel(self, channel: str) -> str:
        """A consumer (offset reference) name."""
        return check_stream(channel, "channel")

    def subscribe(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> StreamSubscription:
        """``channel``'s single active consumer on ``topic`` and on its retry stream."""
        return StreamSubscription(
            topic, channel, self.connections, self.producer, self.settings,
            name=name, max_in_flight=max_in_flight,
        )  # fmt: skip

    def publisher(self, near: Message | None = None) -> StreamProducer:
        """The transport's producer."""
        return self.producer

    def describe(self) -> dict[str, str]:
        """The RabbitMQ address and vhost (never the password)."""
        endpoint = self.connections.endpoint
        return {"rabbitmq": endpoint.address, "vhost": endpoint.vhost}

    async def close(self) -> None:
        """Close the connections."""
        await self.connections.close()
