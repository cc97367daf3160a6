"""What RabbitMQ Streams does natively, as the task layer and telemetry read it (one object,
shared by the transport and the producer)."""

from __future__ import annotations

from nsqworker.transport import Capabilities

__all__ = ["CAPABILITIES"]

CAPABILITIES = Capabilities(
    name="rabbitmq-stream",
    system="rabbitmq",
    attribute_prefix="messaging.rabbitmq",
    max_retry_delay=30 * 86400.0,  # also the longest x-not-before a retry is held
    keep_alive=False,  # no delivery deadline
    max_hold=None,
    headers=False,
    delayed_publish=False,
    reply_address=False,
)
