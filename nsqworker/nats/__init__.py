"""NATS JetStream as a transport (``Settings(transport="nats")``); needs the ``nats`` extra.

See docs/nats.md for how topics, channels, retries and dead letters map onto JetStream.
"""

from __future__ import annotations

__all__ = ["NatsProducer", "NatsTransport"]

try:
    import nats as _nats  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("the NATS transport needs nats-py: pip install 'nsq-worker[nats]'") from exc

from nsqworker.nats.producer import NatsProducer
from nsqworker.nats.transport import NatsTransport
