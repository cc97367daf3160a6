"""What NSQ does natively, as the task layer and telemetry read it (one object, shared
by the transport and the producer)."""

from __future__ import annotations

from nsqworker.nsq import protocol
from nsqworker.transport import Capabilities

__all__ = ["CAPABILITIES"]

CAPABILITIES = Capabilities(
    name="nsq",
    system="nsq",
    attribute_prefix="messaging.nsq",
    max_retry_delay=protocol.DEFAULT_MAX_REQ_TIMEOUT_MS / 1000,
    keep_alive=True,
    max_hold=None,  # per connection: nsqd's --max-msg-timeout (Message.max_hold)
    headers=False,
    delayed_publish=True,
    reply_address=True,
)
