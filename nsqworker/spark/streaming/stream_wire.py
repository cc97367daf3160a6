"""A blocking RabbitMQ stream connection for Spark: the stream's offsets and a range
of its chunks.

Spark calls a source's methods from plain threads and Python workers, so this speaks
the few requests it needs (:mod:`nsqworker.streams.stats` encodes and decodes them)
over an ordinary socket, TLS for ``rabbitmq-stream+tls``. The password is sent in the
SASL exchange only; errors name the user, vhost and address, never the password.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from nsqworker.errors import NoConnection, NSQWorkerError
from nsqworker.settings.core import tls_context
from nsqworker.spark.streaming.chunks import Chunk, decode_chunk
from nsqworker.streams.client import Endpoint
from nsqworker.streams.stats import (
    CLOSE,
    DELIVER,
    HEARTBEAT,
    OFFSET_TYPE_LAST,
    OFFSET_TYPE_OFFSET,
    OK,
    OPEN,
    PEER_PROPERTIES,
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
    decode_response,
    decode_stream_stats,
    encode_close,
    encode_credit,
    encode_open,
    encode_peer_properties,
    encode_sasl_authenticate,
    encode_sasl_handshake,
    encode_stream_stats,
    encode_subscribe,
    encode_tune,
    encode_unsubscribe,
)

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["StreamError", "StreamReadConnection"]

FRAME_LIMIT = 64 * 1024 * 1024
"""The largest frame read: a chunk is delivered whole, whatever frame size was asked."""
ASKED_FRAME = 1024 * 1024
CREDIT = 8
"""Chunks RabbitMQ may send ahead of the reader."""


class StreamError(NSQWorkerError):
    """The stream is missing, access was refused, or its data could not be read."""


class StreamReadConnection:
    """One authenticated connection; one request at a time, one subscription."""

    def __init__(self, settings: Settings, timeout: float = 30.0) -> None:
        self.endpoint = Endpoint.from_settings(settings)
        self.timeout = timeout
        self.where = (
            f"RabbitMQ Streams at {self.endpoint.address} (user {self.endpoint.username!r},"
            f" vhost {self.endpoint.vhost!r})"
        )
        self._frames = FrameBuffer(FRAME_LIMIT)
        self._pending: list[Frame] = []
        self._ids = itertools.count(1)
        try:
            raw = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout)
        except OSError as exc:
            raise NoConnection(f"{self.where}: {exc}") from exc
        if self.endpoint.tls:
            raw = tls_context(settings).wrap_socket(raw, server_hostname=self.endpoint.host)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = raw
        try:
            self._handshake(settings.client_id)
        except BaseException:
            self._sock.close()
            raise

    def __enter__(self) -> StreamReadConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handshake(self, client_id: str) -> None:
        properties = {"product": "nsqworker", "connection_name": f"nsqworker-spark {client_id}"}
        e = self.endpoint
        for key, request in (
            (PEER_PROPERTIES, encode_peer_properties(next(self._ids), properties)),
            (SASL_HANDSHAKE, encode_sasl_handshake(next(self._ids))),
            (SASL_AUTHENTICATE, encode_sasl_authenticate(next(self._ids), e.username, e.password)),
        ):
            answer = self._call(key, request)
            if answer.code != OK:
                raise NoConnection(f"{self.where}: login refused: {answer.reason}")
        tune = self._next(lambda f: f.key == TUNE)
        frame_max = int.from_bytes(tune.payload[:4]) if len(tune.payload) >= 8 else 0
        self._sock.sendall(encode_tune(min(frame_max or ASKED_FRAME, ASKED_FRAME), 0))
        answer = self._call(OPEN, encode_open(next(self._ids), e.vhost))
        if answer.code != OK:
            raise NoConnection(f"{self.where}: vhost refused: {answer.reason}")

    def _stats(self, stream: str) -> dict[str, int]:
        answer = self._call(STREAM_STATS, encode_stream_stats(next(self._ids), stream))
        if answer.code == STREAM_DOES_NOT_EXIST:
            raise StreamError(f"stream {stream!r} does not exist ({self.where})")
        if answer.code != OK:
            raise StreamError(f"stream {stream!r}: {answer.reason}")
        return decode_stream_stats(answer.rest)

    def first_offset(self, stream: str) -> int:
        """The first offset retention has kept (0 for an empty stream)."""
        return max(self._stats(stream).get("first_chunk_id", 0), 0)

    def offsets(self, stream: str) -> tuple[int, int]:
        """``(first, end)``: the first retained offset and the offset after the last
        record of the last chunk of messages; ``(0, 0)`` for an empty stream.

        Raises:
            StreamError: the stream does not exist or cannot be read.
        """
        stats = self._stats(stream)
        if stats.get("committed_chunk_id", -1) < 0:
            return 0, 0
        first = max(stats.get("first_chunk_id", 0), 0)
        last = None
        for chunk in self._chunks(stream, OFFSET_TYPE_LAST, 0, credit=1):
            last = chunk
            break
        if last is None:  # only offset tracking chunks: nothing to read
            return first, first
        return first, last.first_offset + last.count

    def chunks(self, stream: str, start: int) -> Iterator[Chunk]:
        """The stream's chunks from the one holding ``start`` (or the first retained
        one), for as long as the caller iterates; unsubscribes when it stops."""
        return self._chunks(stream, OFFSET_TYPE_OFFSET, start, credit=CREDIT)

    def _chunks(self, stream: str, kind: int, offset: int, credit: int) -> Iterator[Chunk]:
        request = encode_subscribe(next(self._ids), 0, stream, kind, offset, credit)
        answer = self._call(SUBSCRIBE, request)
        if answer.code == STREAM_DOES_NOT_EXIST:
            raise StreamError(f"stream {stream!r} does not exist ({self.where})")
        if answer.code != OK:
            raise StreamError(f"stream {stream!r}: subscription refused: {answer.reason}")
        try:
            while True:
                frame = self._next(lambda f: f.key == DELIVER)
                self._sock.sendall(encode_credit(0, 1))
                yield decode_chunk(frame.payload, frame.version)
        finally:
            self._call(UNSUBSCRIBE, encode_unsubscribe(next(self._ids), 0))
            self._pending = [f for f in self._pending if f.key != DELIVER]

    def _call(self, key: int, request: bytes) -> Response:
        correlation_id = int.from_bytes(request[8:12])
        self._sock.sendall(request)
        frame = self._next(
            lambda f: (
                f.key == key | RESPONSE_BIT and decode_response(f).correlation_id == correlation_id
            )
        )
        return decode_response(frame)

    def _next(self, wanted: Callable[[Frame], bool]) -> Frame:
        while True:
            for i, frame in enumerate(self._pending):
                if wanted(frame):
                    del self._pending[i]
                    return frame
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                raise StreamError(f"{self.where}: no answer in {self.timeout:g}s") from None
            except OSError as exc:
                raise StreamError(f"{self.where}: {exc}") from exc
            if not data:
                raise StreamError(f"{self.where}: the connection was closed")
            try:
                frames = self._frames.feed(data)
            except StatsProtocolError as exc:
                raise StreamError(f"{self.where}: {exc}") from exc
            self._pending += [f for f in frames if f.key != HEARTBEAT]

    def close(self) -> None:
        """Close politely (a second at most), then the socket."""
        try:
            self._sock.settimeout(1.0)
            self._call(CLOSE, encode_close(next(self._ids)))
        except (StreamError, OSError):
            pass
        finally:
            self._sock.close()
