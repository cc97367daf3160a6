"""Publishing to NATS JetStream: every call returns once the stream stored the message.

``NatsProducer`` is what ``Producer(settings=...)`` gives when ``settings.transport`` is
``nats``; it has the same methods. A subject that no stream holds yet gets the stream a
worker would create (:func:`~nsqworker.nats.jetstream.ensure_stream`), so a message
published before the first worker starts is kept. ``publish_many`` sends every message
before awaiting the acknowledgements (pipelined), and fails if any was not stored.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from nsqworker.errors import (
    LocalProtocolError,
    MessageTooLarge,
    NoConnection,
    PublishError,
)
from nsqworker.message import to_bytes
from nsqworker.nats.acks import JetStreamAcks
from nsqworker.nats.capabilities import CAPABILITIES
from nsqworker.nats.client import NatsConnection
from nsqworker.nats.jetstream import DELAY_TOKEN, check_subject, ensure_schedules, ensure_stream
from nsqworker.producing import ProducerBase, PublishCall

if TYPE_CHECKING:
    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = ["NatsProducer"]

Body = Any
PIPELINE = 1000
"""Publishes awaiting their acknowledgement at once in ``publish_many``."""


class NatsProducer(ProducerBase):
    """Publishes to JetStream with acknowledgements; ``async with NatsProducer(...)``.

    ``servers`` defaults to ``settings.nats_servers``; ``timeout`` (seconds) bounds each
    acknowledgement. A given ``connection`` (the worker's) is shared, not closed.
    """

    capabilities = CAPABILITIES

    def __init__(
        self,
        servers: list[str] | str | None = None,
        *,
        settings: Settings | None = None,
        timeout: float = 5.0,
        connection: NatsConnection | None = None,
    ) -> None:
        super().__init__(timeout)
        from nsqworker.settings.nats import NatsSettings as _Settings

        if settings is None:
            settings = _Settings(transport="nats")
        if servers is not None:
            servers = [servers] if isinstance(servers, str) else list(servers)
            checked = _Settings(transport="nats", nats_servers=servers).nats_servers
            settings = settings.model_copy(update={"nats_servers": checked})
        self.settings = settings
        self._owns = connection is None
        self.connection = connection or NatsConnection(settings, name="nsqworker-producer")
        self._streams: set[str] = set()
        self._scheduled: set[str] = set()
        self._acks = JetStreamAcks()

    @property
    def max_message_size(self) -> int | None:
        """The largest message the server takes: its ``max_payload`` (from INFO), or
        None before the first connect. Dead letters are cut to fit it."""
        client = self.connection.client
        return None if client is None else int(client.max_payload)

    def __repr__(self) -> str:
        return f"<NatsProducer {','.join(self.connection.servers)}>"

    async def connect(self, timeout: float | None = None) -> None:
        """Connect now (optional: the first publish connects)."""
        await asyncio.wait_for(self.connection.get(), timeout or self.timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Close the connection if this producer made it."""
        if self._owns:
            await asyncio.wait_for(self.connection.close(), timeout)
            self._acks.fail_all(NoConnection("the producer was closed"))

    async def publish(
        self,
        topic: str,
        body: Body,
        delay: float | None = None,
        timeout: float | None = None,
        *,
        msg_id: str | None = None,
    ) -> None:
        """Publish one message; returns once its stream stored it. With ``delay``
        (seconds), the stream holds it as a schedule and the server publishes it to
        ``topic`` then (JetStream message schedules, nats-server 2.12+). ``msg_id`` is
        sent as ``Nats-Msg-Id``: the stream stores a message with an id it saw within
        its duplicate window (2 minutes by default) only once.

        Raises:
            ConfigurationError: no stream can hold the subject (or, with ``delay``, its
                schedules: see docs/nats.md).
            InvalidName, MessageTooLarge: refused before sending.
            PublishError: the server refused it; NoConnection: no server reachable.
        """
        check_subject(topic)
        if delay is not None and (
            isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0
        ):
            raise LocalProtocolError(f"delay must be seconds >= 0, got {delay!r}")
        data = to_bytes(body)
        later = delay is not None and delay > 0
        call = PublishCall(topic, [data], "DPUB" if later else "PUB",
                           round(delay * 1000) if later and delay else None)  # fmt: skip
        with self.instrumentation(call):
            if later:
                assert delay is not None
                await self._publish_later(topic, data, delay, timeout or self.timeout)
            else:
                headers = None if msg_id is None else {"Nats-Msg-Id": msg_id}
                await self._publish(topic, data, timeout or self.timeout, headers)
            call.published, call.nsqd_address = 1, self.connection.address

    async def _publish_later(self, subject: str, body: bytes, delay: float, timeout: float) -> None:
        """A schedule that the server turns into ``body`` on ``subject`` after ``delay``."""
        js = await self.connection.jetstream()
        if subject not in self._scheduled:
            stream = await ensure_stream(js, subject, self.settings)
            await ensure_schedules(js, stream, subject)
            self._scheduled.add(subject)
        at = datetime.now(UTC) + timedelta(seconds=delay)
        headers = {
            "Nats-Schedule": "@at " + at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "Nats-Schedule-Target": subject,
        }
        schedule = f"{subject}.{DELAY_TOKEN}.{uuid.uuid4().hex}"
        await self._publish(schedule, body, timeout, headers)

    async def publish_many(
        self, topic: str, bodies: Iterable[Body], timeout: float | None = None
    ) -> None:
        """Publish several messages, pipelined; returns once all were stored. Not atomic:
        on an error the others may be stored (the error says how many failed)."""
        check_subject(topic)
        items = [to_bytes(b) for b in bodies]
        if not items:
            raise LocalProtocolError("publish_many needs at least one message")
        wait = timeout or self.timeout
        call = PublishCall(topic, items, "MPUB")
        with self.instrumentation(call):
            await self._publish(topic, items[0], wait)  # sets the stream up once
            call.nsqd_address = self.connection.address
            failed = await self._pipelined(topic, items[1:], wait)
            call.published = len(items) - len(failed)
            if failed:
                error = failed[0]
                error.add_note(f"{len(failed)} of {len(items)} messages were not stored")
                raise error

    async def _pipelined(
        self, subject: str, bodies: list[bytes], timeout: float
    ) -> list[BaseException]:
        """Send ``bodies`` with up to :data:`PIPELINE` acknowledgements outstanding (no
        task per message); what failed, as :meth:`_publish` would raise it."""
        client = self.connection.client
        if client is None or client.is_closed:
            client = await self.connection.get()
        window: deque[asyncio.Future[bytes]] = deque()
        failed: list[BaseException] = []

        async def settle(future: asyncio.Future[bytes]) -> None:
            try:
                await future
            except Exception as exc:
                failed.append(self._mapped(exc, subject, 0, timeout))

        for body in bodies:
            try:
                window.append(await self._acks.send(client, subject, body, timeout))
            except Exception as exc:
                failed.append(self._mapped(exc, subject, len(body), timeout))
            if len(window) >= PIPELINE:
                await settle(window.popleft())
        while window:
            await settle(window.popleft())
        return failed

    def _mapped(self, exc: Exception, subject: str, size: int, timeout: float) -> Exception:
        """What a publish raises for nats-py's ``exc``."""
        from nats.errors import MaxPayloadError, NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.errors import APIError, NoStreamResponseError

        if isinstance(exc, NoRespondersError | NoStreamResponseError):
            return NoConnection(f"no JetStream stream answered for {subject!r}")
        if isinstance(exc, MaxPayloadError):
            client = self.connection.client
            error = MessageTooLarge(size, client.max_payload if client else 0)
            error.args = (
                f"message of {size} bytes for {subject!r} is over the NATS server's"
                f" max_payload ({error.limit} bytes); split or shrink it",
            )
            return error
        if isinstance(exc, NatsTimeout):
            return TimeoutError(
                f"no acknowledgement for {subject!r} within {timeout:g}s (it may be stored)"
            )
        if isinstance(exc, APIError):
            return PublishError(
                f"JETSTREAM_{exc.err_code}",
                f"refused the message for {subject!r}: {exc.description}",
            )
        return exc

    async def _publish(
        self, subject: str, body: bytes, timeout: float, headers: dict[str, str] | None = None
    ) -> None:
        from nats.errors import MaxPayloadError, NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.errors import APIError, NoStreamResponseError

        client = self.connection.client
        if client is None or client.is_closed:
            client = await self.connection.get()
        acks = self._acks
        try:
            await (await acks.send(client, subject, body, timeout, headers))
        except (NoRespondersError, NoStreamResponseError):
            if subject in self._streams:
                raise NoConnection(f"no JetStream stream answered for {subject!r}") from None
            await ensure_stream(await self.connection.jetstream(), subject, self.settings)
            self._streams.add(subject)
            deadline = asyncio.get_running_loop().time() + timeout
            while True:  # a new replicated stream answers once it has elected its leader
                try:
                    await (await acks.send(client, subject, body, timeout, headers))
                    break
                except (NoRespondersError, NoStreamResponseError):
                    if asyncio.get_running_loop().time() > deadline:
                        raise NoConnection(f"stream for {subject!r} does not answer") from None
                    await asyncio.sleep(0.05)
                except (NatsTimeout, APIError) as exc:
                    raise self._mapped(exc, subject, len(body), timeout) from None
        except (MaxPayloadError, NatsTimeout, APIError) as exc:
            raise self._mapped(exc, subject, len(body), timeout) from None
