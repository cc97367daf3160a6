"""The seam between the dead-letter tools and each broker: a :class:`Store` reads what
lies on a dead-letter topic without settling it, removes one message, and names the
publisher a replay goes through.

One module per broker (:mod:`.nsq_store`, :mod:`.nats_store`, :mod:`.streams_store`),
chosen by ``settings.transport`` (:func:`nsqworker.admin.dead_letters.open_store`). A
store is used once: ``async with open_store(settings, topic) as store``, :meth:`Store.read`, then any
:meth:`Store.publish` and :meth:`Store.remove`; leaving the block hands back what was
read and not removed (on NSQ, where reading takes the messages).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = ["QUIET", "Store", "Stored"]

QUIET = 1.0
"""Seconds without a new message after which a read of an NSQ channel or a RabbitMQ
stream is taken to be complete (neither broker tells a client where the end is)."""


@dataclass(frozen=True)
class Stored:
    """One message of a dead-letter topic as the broker keeps it: ``id`` (stable across
    reads: nsqd's message id, a JetStream sequence, a stream offset), the raw ``data``,
    ``stored_at`` (when the broker took it: when the dead letter was written) and
    ``where`` (the nsqd address on NSQ; empty elsewhere)."""

    id: str
    data: bytes
    stored_at: datetime | None
    where: str = ""


class Store(Protocol):
    """A dead-letter topic on one broker; see the module docstring."""

    topic: str
    notes: list[str]
    """What the reader should know about the read (a listing nsqd cut short)."""

    async def read(self, limit: int | None = None) -> list[Stored]:
        """Every message on the topic, oldest first (the first ``limit``)."""

    async def remove(self, item: Stored) -> None:
        """Remove ``item`` for good; raises when the broker did not take the removal."""

    @property
    def failed_removals(self) -> dict[str, str]:
        """Removals the broker turned down after :meth:`remove` returned (NSQ answers a
        FIN only when it fails), id -> why; complete once the store is closed."""

    async def publish(self, item: Stored, topic: str, body: bytes) -> None:
        """Publish ``body``, the replay of ``item``, to ``topic``; returns once the broker
        acknowledged it. Where the broker de-duplicates (NATS's ``Nats-Msg-Id``, a
        stream's publishing id), the id comes from ``item``, so publishing the same dead
        letter twice stores it once."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None:
        """Hand back what was read and not removed; close the connections."""
