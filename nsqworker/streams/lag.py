"""How many messages of a stream a consumer has not handled yet, asked of RabbitMQ.

:func:`stream_lags` opens a connection of its own from ``rabbitmq_stream_uri`` (TLS for
``rabbitmq-stream+tls``; the password is sent in the SASL exchange and never logged or
put in an error), and for each ``(stream, consumer name)`` asks:

* StreamStats (:mod:`nsqworker.streams.stats`): the first and the last committed chunk;
* the end: the offset after the last committed record, from the committed chunk's
  header (a subscription at its id with credit for one chunk, then unsubscribed);
* QueryOffset under the consumer's name: the offset it stored (none stored: the whole
  stream is ahead of it, from its first retained offset).

The lag is ``end - (stored + 1)``, never below 0 (:func:`lag_of`). Offsets number
every record of the stream, the chunks RabbitMQ writes to track stored offsets included
(one offset each; consumers never see them), so while a consumer is behind the lag may
be over by one per offset store written after its own position (its own last store,
and those of the topic's other channels). A consumer that has handled everything reads
0 exactly: the end is that of the last chunk of messages, not of the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import TYPE_CHECKING

from nsqworker.errors import NoConnection, NSQWorkerError
from nsqworker.settings.core import tls_context
from nsqworker.streams.client import Endpoint
from nsqworker.streams.stats import (
    CLOSE,
    DELIVER,
    HEARTBEAT,
    MAX_FRAME,
    NO_OFFSET,
    OFFSET_TYPE_LAST,
    OK,
    OPEN,
    PEER_PROPERTIES,
    QUERY_OFFSET,
    RESPONSE_BIT,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    STREAM_DOES_NOT_EXIST,
    STREAM_STATS,
    SUBSCRIBE,
    TUNE,
    UNSUBSCRIBE,
    Frame,
    FrameBuffer,
    Response,
    StatsProtocolError,
    decode_deliver_header,
    decode_query_offset,
    decode_response,
    decode_stream_stats,
    encode_close,
    encode_open,
    encode_peer_properties,
    encode_query_offset,
    encode_sasl_authenticate,
    encode_sasl_handshake,
    encode_stream_stats,
    encode_subscribe,
    encode_tune,
    encode_unsubscribe,
)

if TYPE_CHECKING:
    from nsqworker.settings.streams import StreamSettings as Settings

__all__ = ["LagError", "StreamMissing", "lag_of", "stream_lags"]

TIMEOUT = 5.0
"""Seconds for the whole reading (connect, handshake, every stream)."""
SUBSCRIPTION_ID = 0
DELIVER_WAIT = 2.0
"""Seconds to wait for the last chunk of messages once subscribed to it."""
FRAME_LIMIT = 64 * 1024 * 1024
"""The largest frame read: a chunk is delivered whole, whatever the frame size asked."""


class LagError(NSQWorkerError):
    """A stream's lag could not be read (the stream is missing, access was refused...)."""


class StreamMissing(LagError):
    """The stream does not exist."""


def lag_of(first: int, end: int, stored: int | None) -> int:
    """Records from the consumer's next offset (``stored + 1``, or ``first`` with nothing
    stored or a stored offset retention has removed) to ``end`` (exclusive)."""
    start = first if stored is None else max(stored + 1, first)
    return max(end - start, 0)


async def stream_lags(
    settings: Settings, pairs: list[tuple[str, str]], timeout: float = TIMEOUT
) -> dict[tuple[str, str], int | LagError]:
    """The lag of each ``(stream, consumer name)``, or the :class:`LagError` saying why
    it is not known, over one connection opened and closed here.

    Raises:
        NoConnection: RabbitMQ could not be reached, refused the login or the vhost, or
            did not answer within ``timeout`` seconds (the message names the user and
            vhost, never the password).
    """
    endpoint = Endpoint.from_settings(settings)
    where = f"RabbitMQ Streams at {endpoint.address} (user {endpoint.username!r}, vhost {endpoint.vhost!r})"
    try:
        async with asyncio.timeout(timeout):
            connection = await _Connection.open(settings, endpoint)
            try:
                result: dict[tuple[str, str], int | LagError] = {}
                for pair in pairs:
                    try:
                        result[pair] = await connection.lag(*pair)
                    except LagError as exc:
                        result[pair] = exc
                return result
            finally:
                await connection.close()
    except TimeoutError as exc:
        raise NoConnection(f"{where}: no answer in {timeout:g}s") from exc
    except (OSError, StatsProtocolError, LagError) as exc:
        raise NoConnection(f"{where}: {exc}") from exc


class _Connection:
    """One authenticated connection; requests are sent one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameBuffer(FRAME_LIMIT)
        self.pending: list[Frame] = []
        self.ids = itertools.count(1)

    @classmethod
    async def open(cls, settings: Settings, endpoint: Endpoint) -> _Connection:
        ssl = tls_context(settings) if endpoint.tls else None
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port, ssl=ssl)
        connection = cls(reader, writer)
        try:
            await connection.handshake(endpoint, settings.client_id)
        except BaseException:
            connection.writer.close()
            raise
        return connection

    async def handshake(self, endpoint: Endpoint, client_id: str) -> None:
        properties = {"product": "nsqworker", "connection_name": f"nsqworker-console {client_id}"}
        for key, request in (
            (PEER_PROPERTIES, encode_peer_properties(next(self.ids), properties)),
            (SASL_HANDSHAKE, encode_sasl_handshake(next(self.ids))),
            (SASL_AUTHENTICATE,
             encode_sasl_authenticate(next(self.ids), endpoint.username, endpoint.password)),
        ):  # fmt: skip
            answer = await self.call(key, request)
            if answer.code != OK:
                raise LagError(f"login refused: {answer.reason}")
        tune = await self.next_frame(lambda f: f.key == TUNE)
        if len(tune.payload) < 8:
            raise StatsProtocolError(f"Tune of {len(tune.payload)} bytes")
        frame_max = int.from_bytes(tune.payload[:4])
        frame_max = min(frame_max or MAX_FRAME, MAX_FRAME)
        self.writer.write(encode_tune(frame_max, 0))
        answer = await self.call(OPEN, encode_open(next(self.ids), endpoint.vhost))
        if answer.code != OK:
            raise LagError(f"vhost {endpoint.vhost!r} refused: {answer.reason}")

    async def lag(self, stream: str, reference: str) -> int:
        """The lag of consumer ``reference`` on ``stream``."""
        answer = await self.call(STREAM_STATS, encode_stream_stats(next(self.ids), stream))
        if answer.code == STREAM_DOES_NOT_EXIST:
            raise StreamMissing(f"stream {stream!r} does not exist")
        if answer.code != OK:
            raise LagError(f"stream {stream!r}: {answer.reason}")
        stats = decode_stream_stats(answer.rest)
        if stats.get("committed_chunk_id", -1) < 0:
            return 0
        first = max(stats.get("first_chunk_id", 0), 0)
        end = await self.end(stream)
        answer = await self.call(
            QUERY_OFFSET, encode_query_offset(next(self.ids), reference, stream)
        )
        if answer.code == NO_OFFSET:
            stored = None
        elif answer.code == OK:
            stored = decode_query_offset(answer.rest)
        else:
            raise LagError(f"offset of {reference!r} on stream {stream!r}: {answer.reason}")
        return lag_of(first, end, stored)

    async def end(self, stream: str) -> int:
        """The offset after the last record of the last committed chunk of messages,
        from its header: a subscription at the last chunk (RabbitMQ passes over the
        chunks it writes to track offsets) with credit for one chunk."""
        subscribe = encode_subscribe(
            next(self.ids), SUBSCRIPTION_ID, stream, OFFSET_TYPE_LAST, 0, 1
        )
        answer = await self.call(SUBSCRIBE, subscribe)
        if answer.code != OK:
            raise LagError(f"stream {stream!r}: subscription refused: {answer.reason}")
        try:
            async with asyncio.timeout(DELIVER_WAIT):
                deliver = await self.next_frame(lambda f: f.key == DELIVER)
        except TimeoutError:
            raise LagError(
                f"stream {stream!r}: no chunk of messages delivered in {DELIVER_WAIT:g}s"
                " (it may hold offset tracking only)"
            ) from None
        finally:
            await self.call(UNSUBSCRIBE, encode_unsubscribe(next(self.ids), SUBSCRIPTION_ID))
            self.pending = [f for f in self.pending if f.key != DELIVER]
        _, first, records = decode_deliver_header(deliver)
        return first + records

    async def call(self, key: int, request: bytes) -> Response:
        """Send ``request`` and wait for its answer."""
        correlation_id = int.from_bytes(request[8:12])
        self.writer.write(request)
        frame = await self.next_frame(
            lambda f: (
                f.key == key | RESPONSE_BIT and decode_response(f).correlation_id == correlation_id
            )
        )
        return decode_response(frame)

    async def next_frame(self, wanted: object) -> Frame:
        """The first frame, kept or read, that ``wanted`` accepts; heartbeats dropped."""
        while True:
            for frame in self.pending:
                if wanted(frame):  # type: ignore[operator]
                    self.pending.remove(frame)
                    return frame
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("RabbitMQ closed the connection")
            self.pending += [f for f in self.frames.feed(data) if f.key != HEARTBEAT]

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1):
                await self.call(CLOSE, encode_close(next(self.ids)))
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
