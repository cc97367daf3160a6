"""What NATS JetStream does natively, as the task layer and telemetry read it (one object,
shared by the transport and the producer)."""

from __future__ import annotations

from nsqworker.transport import Capabilities

__all__ = ["CAPABILITIES"]

CAPABILITIES = Capabilities(
    name="nats",
    system="nats",
    attribute_prefix="messaging.nats",
    max_retry_delay=7 * 86400.0,
    keep_alive=True,  # +WPI restarts ack_wait
    max_hold=None,
    headers=True,
    delayed_publish=True,  # JetStream message schedules (nats-server 2.12+)
    reply_address=False,
    request_reply=True,  # core NATS requests: @rpc answers on their reply subject
)
