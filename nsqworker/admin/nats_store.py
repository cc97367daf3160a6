"""Dead letters on NATS JetStream: read from the stream by sequence, without a consumer.

A read asks the stream that holds the dead-letter subject for its messages on that
subject one after the other (``STREAM.MSG.GET`` with ``next_by_subj``): no consumer is
created, nothing is acknowledged, and the workers' consumers of the stream see nothing.
A dead letter's id is its stream sequence; a removal deletes that sequence
(``STREAM.MSG.DELETE``), answered by the server before it counts as done.

A replay's publish carries ``Nats-Msg-Id: nsqworker-replay:<stream>:<sequence>``, so
the destination stream stores a dead letter once within its duplicate window (two
minutes by default), whether two replays ran at once or one ran again after a crash
between its publish and its removal. Reserved subjects (``$...``, ``_INBOX...``) are
never read: they are no task's dead-letter subject.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nsqworker.admin.stores import Stored
from nsqworker.errors import ConfigurationError, PublishError
from nsqworker.nats.client import NatsConnection
from nsqworker.nats.jetstream import check_subject
from nsqworker.nats.producer import NatsProducer

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["NatsStore", "replay_id"]

NO_MESSAGE = frozenset({10037, 10057})
"""JetStream's error codes for a sequence that holds no message (already deleted)."""


def replay_id(stream: str | None, item: Stored) -> str:
    """The ``Nats-Msg-Id`` of the replay of ``item``: the same for every replay of it."""
    return f"nsqworker-replay:{stream}:{item.id}"


class NatsStore:
    """A dead-letter subject on JetStream; see the module docstring."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.notes: list[str] = []  # nothing to say: a read here is complete
        self.topic = check_subject(topic)
        if topic.startswith(("$", "_INBOX")):
            raise ConfigurationError(
                f"{topic!r} is a reserved NATS subject, not a dead-letter subject: the tools"
                " read only the subjects tasks dead-letter to"
            )
        self.connection = NatsConnection(settings, name="nsqworker-dead-letters")
        self.stream: str | None = None
        self._producer: NatsProducer | None = None

    async def __aenter__(self) -> NatsStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _stream(self) -> str | None:
        from nats.js.errors import NotFoundError

        js = await self.connection.jetstream()
        if self.settings.nats_stream is not None:
            return self.settings.nats_stream
        try:
            return await js.find_stream_name_by_subject(self.topic)
        except NotFoundError:
            return None  # no stream holds the subject: nothing was dead-lettered there

    async def read(self, limit: int | None = None) -> list[Stored]:
        """The subject's messages in stream order (the order they were stored)."""
        from nats.js.errors import NotFoundError

        self.stream = await self._stream()
        if self.stream is None:
            return []
        js = await self.connection.jetstream()
        found: list[Stored] = []
        seq = 1
        while limit is None or len(found) < limit:
            try:
                msg = await js.get_msg(self.stream, seq, subject=self.topic, next=True)
            except NotFoundError:
                break
            if msg.seq is None:
                break
            found.append(Stored(str(msg.seq), msg.data or b"", msg.time))
            seq = msg.seq + 1
        return found

    async def remove(self, item: Stored) -> None:
        """Delete the message at the dead letter's sequence."""
        from nats.js.errors import APIError

        if self.stream is None:
            raise ConfigurationError("read the dead letters before removing one")
        js = await self.connection.jetstream()
        try:
            deleted = await js.delete_msg(self.stream, int(item.id))
        except APIError as exc:
            if exc.err_code in NO_MESSAGE:  # another replay or purge removed it meanwhile
                return
            raise PublishError(f"JETSTREAM_{exc.err_code}", str(exc.description)) from None
        if not deleted:
            raise PublishError("JETSTREAM", f"the server did not delete sequence {item.id}")

    @property
    def failed_removals(self) -> dict[str, str]:
        """None: each removal was answered before :meth:`remove` returned."""
        return {}

    async def publish(self, item: Stored, topic: str, body: bytes) -> None:
        """Publish on the store's connection, with the dead letter's ``Nats-Msg-Id``."""
        if self._producer is None:
            self._producer = NatsProducer(settings=self.settings, connection=self.connection)
        await self._producer.publish(topic, body, msg_id=replay_id(self.stream, item))

    async def close(self) -> None:
        """Close the connection (after flushing)."""
        await self.connection.close()
