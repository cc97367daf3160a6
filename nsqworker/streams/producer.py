"""Publishing to RabbitMQ Streams: AMQP 1.0 messages, each call returns once confirmed.

Messages are AMQP 1.0 (a data section, and application properties when given), the
format every stream client reads. One publisher reference per producer (``nsqworker-
<client_id>-<pid>-<n>``) with rstream's publishing ids, which the broker deduplicates
per reference; ``publish_many`` sends one batch and awaits every confirmation.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from nsqworker.errors import (
    ConfigurationError,
    LocalProtocolError,
    MessageTooLarge,
    NoConnection,
    PublishError,
)
from nsqworker.message import to_bytes
from nsqworker.producing import ProducerBase, PublishCall
from nsqworker.streams.capabilities import CAPABILITIES
from nsqworker.streams.client import ENVELOPE, FRAME_MAX, StreamConnections, check_stream
from nsqworker.streams.errors import reason

if TYPE_CHECKING:
    from nsqworker.settings.streams import StreamSettings as Settings

__all__ = ["StreamProducer"]

_numbers = itertools.count(1)
BATCH_BYTES = FRAME_MAX // 2
"""Bytes of concurrent publishes sent together in one frame at most (well inside it)."""
BATCH_COUNT = 5000
"""Concurrent publishes sent together in one frame at most."""


class StreamProducer(ProducerBase):
    """Publishes to RabbitMQ streams (created when missing) and awaits confirmations."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        timeout: float = 5.0,
        connections: StreamConnections | None = None,
        reference: str | None = None,
    ) -> None:
        super().__init__(timeout)
        if settings is None:
            from nsqworker.settings.streams import StreamSettings as _Settings

            settings = _Settings(transport="rabbitmq-stream")
        self.settings = settings
        self._owns = connections is None
        self.connections = connections or StreamConnections(settings)
        self.reference = (
            reference or f"nsqworker-{settings.client_id}-{os.getpid()}-{next(_numbers)}"
        )
        """The publisher reference; the broker deduplicates publishing ids per reference
        and stream. Give one explicitly to share it across processes (schedules do)."""
        self._queues: dict[str, list[tuple[bytes, asyncio.Future[None]]]] = {}
        self._flushing: set[asyncio.Task[None]] = set()

    @property
    def max_message_size(self) -> int:
        """The largest body a message may have: the frame size less its envelope
        (dead letters are cut to fit it)."""
        return FRAME_MAX - ENVELOPE

    def __repr__(self) -> str:
        return f"<StreamProducer {self.connections.endpoint.address}>"

    async def connect(self, timeout: float | None = None) -> None:
        """Connect now (optional: the first publish connects)."""
        await asyncio.wait_for(self.connections.producer(), timeout or self.timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Close the connections if this producer made them."""
        if self._owns:
            await asyncio.wait_for(self.connections.close(), timeout)

    async def publish(
        self, topic: str, body: Any, delay: float | None = None, timeout: float | None = None
    ) -> None:
        """Publish one message to the stream ``topic``; returns once confirmed.

        Raises:
            ConfigurationError: ``delay`` given (streams have no delayed delivery).
            InvalidName, MessageTooLarge: refused before sending.
            PublishError: not confirmed; NoConnection: RabbitMQ unreachable.
        """
        if delay:
            raise ConfigurationError(
                "a delayed publish is not supported on RabbitMQ streams (an append-only log"
                " has no delayed delivery); publish now, or let the handler Retry(delay=...)"
            )
        call = PublishCall(topic, [to_bytes(body)], "PUB")
        with self.instrumentation(call):
            await self._together(topic, call.bodies[0], timeout)
            call.published, call.nsqd_address = 1, self.connections.endpoint.address

    async def _together(self, stream: str, body: bytes, timeout: float | None) -> None:
        """Send ``body`` in the next batch to ``stream``: publishes made while one is
        being sent go together in one frame (rstream tracks each ``send_batch`` call's
        confirmations in a list it walks on every confirmation: a thousand calls at once
        were a thousand times slower than one batch of a thousand)."""
        check_stream(stream)
        if len(body) > self.max_message_size:
            await self.send(stream, [body], timeout=timeout)  # raises MessageTooLarge
        queue = self._queues.get(stream)
        if queue is not None:  # a send is on its way: go with the next one
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queue.append((body, future))
            await future
            return
        queue = self._queues[stream] = []
        try:
            await self.send(stream, [body], timeout=timeout)
        finally:
            if queue:  # what came meanwhile goes on in a task of its own
                task = asyncio.ensure_future(self._flush(stream, queue, timeout))
                self._flushing.add(task)
                task.add_done_callback(self._flushing.discard)
            else:
                del self._queues[stream]

    async def _flush(self, stream: str, queue: list[Any], timeout: float | None) -> None:
        """Send what ``queue`` holds, batch after batch, until it is empty."""
        try:
            while queue:
                size, count = 0, 0
                for body, _ in queue:
                    size += len(body) + ENVELOPE // 8
                    if count and (size > BATCH_BYTES or count >= BATCH_COUNT):
                        break
                    count += 1
                batch = queue[:count]
                del queue[:count]
                try:
                    await self.send(stream, [body for body, _ in batch], timeout=timeout)
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for _, future in batch:
                        if not future.done():
                            future.set_result(None)
        finally:
            del self._queues[stream]
            for _, future in queue:  # only when cancelled
                if not future.done():
                    future.set_exception(NoConnection("the producer was closed"))

    async def publish_many(
        self, topic: str, bodies: Iterable[Any], timeout: float | None = None
    ) -> None:
        """Publish several messages in one batch; returns once all are confirmed."""
        items = [to_bytes(b) for b in bodies]
        if not items:
            raise LocalProtocolError("publish_many needs at least one message")
        call = PublishCall(topic, items, "MPUB")
        with self.instrumentation(call):
            await self.send(topic, items, timeout=timeout)
            call.published, call.nsqd_address = len(items), self.connections.endpoint.address

    async def send(
        self,
        stream: str,
        bodies: list[bytes],
        properties: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        publishing_ids: list[int] | None = None,
    ) -> None:
        """Send ``bodies`` (with the same application ``properties``) and await every
        confirmation (the transport's retries use this too). ``publishing_ids``, one per
        body and ascending: the broker stores a body only if its id is above the last one
        stored for this reference on the stream (a deduplicated body is confirmed too)."""
        from rstream import AMQPMessage, ConfirmationStatus

        check_stream(stream)
        for body in bodies:
            if len(body) > self.max_message_size:
                error = MessageTooLarge(len(body), self.max_message_size)
                error.args = (
                    f"message of {len(body)} bytes for stream {stream!r} does not fit the"
                    f" negotiated frame size ({FRAME_MAX} bytes with its envelope); split it",
                )
                raise error
        await self.connections.ensure_stream(stream)
        producer = await self.connections.producer()
        loop = asyncio.get_running_loop()
        outcomes: dict[int, bool] = {}
        waiting: dict[int, asyncio.Future[bool]] = {}

        def confirmed(status: ConfirmationStatus) -> None:
            future = waiting.pop(status.message_id, None)
            if future is None:
                outcomes[status.message_id] = status.is_confirmed
            elif not future.done():
                future.set_result(status.is_confirmed)

        props = dict(properties) if properties else None
        none: list[int | None] = [None] * len(bodies)
        ids_given: list[int | None] = list(publishing_ids) if publishing_ids else none
        if len(ids_given) != len(bodies):
            raise LocalProtocolError("publishing_ids needs one id per body")
        batch = [AMQPMessage(body=body, application_properties=props) for body in bodies]
        for message, pid in zip(batch, ids_given, strict=True):
            message.publishing_id = pid  # rstream's keyword for it breaks the tuple's __new__
        from rstream.exceptions import ServerError

        try:
            ids = await producer.send_batch(
                stream, batch, publisher_name=self.reference, on_publish_confirm=confirmed
            )
        except ServerError as exc:  # e.g. the stream was deleted meanwhile
            self.connections.forget(stream)
            raise PublishError(
                f"E_{type(exc).__name__.upper()}",
                f"RabbitMQ refused the publish to {stream!r}: {reason(exc)}",
            ) from None
        except (OSError, ConnectionError) as exc:
            if (unresolved := await self.connections.unresolved(stream, exc)) is not None:
                raise unresolved from None
            raise NoConnection(f"RabbitMQ streams: {reason(exc)}") from None
        for publishing_id in ids:
            if publishing_id not in outcomes:
                waiting[publishing_id] = loop.create_future()
        try:
            async with asyncio.timeout(timeout or self.timeout):
                results = [outcomes.pop(i, None) for i in ids]
                late = await asyncio.gather(*waiting.values()) if waiting else []
        except TimeoutError:
            raise TimeoutError(
                f"{len(waiting)} of {len(ids)} messages for stream {stream!r} not confirmed"
                f" within {timeout or self.timeout:g}s (they may be stored)"
            ) from None
        failed = results.count(False) + list(late).count(False)
        if failed:
            raise PublishError(
                "E_NOT_CONFIRMED", f"{failed} of {len(ids)} messages for {stream!r} refused"
            )
