"""RabbitMQ Streams as a transport (``Settings(transport="rabbitmq-stream")``); needs the
``rabbitmq`` extra (rstream). See docs/rabbitmq-streams.md."""

from __future__ import annotations

__all__ = ["StreamProducer", "StreamTransport"]

try:
    import rstream as _rstream  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "the RabbitMQ Streams transport needs rstream: pip install 'nsq-worker[rabbitmq]'"
    ) from exc

from nsqworker.streams.producer import StreamProducer
from nsqworker.streams.transport import StreamTransport
