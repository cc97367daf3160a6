"""What the producers of the transports other than NSQ share: ``async with``, JSON
bodies, and the checks of their arguments."""

from __future__ import annotations

import json
from typing import Any, Self

from nsqworker.errors import ConfigurationError

__all__ = ["ProducerBase"]


class ProducerBase:
    """``async with producer:`` connects and closes; :meth:`publish_json` encodes.

    Subclasses implement ``connect``, ``close`` and ``publish``."""

    timeout: float

    def __init__(self, timeout: float) -> None:
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = timeout

    async def connect(self, timeout: float | None = None) -> None:
        """Connect now (optional: the first publish connects)."""
        raise NotImplementedError

    async def close(self, timeout: float = 5.0) -> None:
        """Release the connections the producer made."""
        raise NotImplementedError

    async def publish(
        self, topic: str, body: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message; see the subclass."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def publish_json(
        self, topic: str, obj: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish ``obj`` serialised as compact UTF-8 JSON; see :meth:`publish`."""
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        await self.publish(topic, body, delay=delay, timeout=timeout)
