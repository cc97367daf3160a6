"""The worker's connections to RabbitMQ Streams, from ``rabbitmq_stream_uri``.

One rstream ``Producer`` (publishing, retries, dead letters; its locator connection
creates streams) per transport, created on first use; consuming links of our own
(:mod:`nsqworker.streams.link`) for each subscription; rstream ``Consumer``s for the
operator's tools (dead letters). A refused login or a missing vhost is a
``ConfigurationError`` naming the user and vhost, never the password.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from nsqworker.errors import ConfigurationError, InvalidName, NoConnection
from nsqworker.settings.core import tls_context
from nsqworker.streams.errors import reason, unresolved_host
from nsqworker.streams.wire import BrokerRefused, Chunk
from nsqworker.subscription_kit import ErrorCounts

if TYPE_CHECKING:
    from rstream import Consumer, Producer

    from nsqworker.settings.streams import StreamSettings as Settings
    from nsqworker.streams.link import StreamLink

__all__ = ["FRAME_MAX", "Endpoint", "StreamConnections", "check_stream", "stream_arguments"]

log = logging.getLogger("nsqworker.streams")

FRAME_MAX = 1024 * 1024
"""The frame size we ask for; a body must fit in one (with its AMQP envelope)."""
ENVELOPE = 512
"""Bytes a message's AMQP 1.0 envelope and the publish frame may take beyond its body."""
CREATE_WAIT = 30.0
"""Seconds a stream creation is retried while RabbitMQ's stream coordinator is not
elected yet (just after a restart it answers "internal error" or "not available")."""
_differ_logged: set[tuple[str, str]] = set()
"""Streams found with other arguments than the worker's, logged once per process."""


def check_stream(name: str, what: str = "topic") -> str:
    """A stream name RabbitMQ accepts: 1-255 bytes, no ``amq.`` prefix, printable."""
    if (
        not isinstance(name, str)
        or not name
        or len(name.encode()) > 255
        or name.startswith("amq.")
        or not name.isprintable()
        or any(c.isspace() for c in name)
    ):
        raise InvalidName(
            f"{what} {name!r} is not a RabbitMQ stream name: 1-255 bytes, no spaces,"
            " not starting with 'amq.'"
        )
    return name


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect, read from the URI."""

    host: str
    port: int
    vhost: str
    username: str
    password: str
    tls: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> Endpoint:
        """Parse ``settings.rabbitmq_stream_uri``."""
        url = urlsplit(settings.rabbitmq_stream_uri.get_secret_value())
        path = url.path[1:] if url.path.startswith("/") else url.path
        return cls(
            host=url.hostname or "127.0.0.1",
            port=url.port or 5552,
            vhost=unquote(path) or "/",
            username=unquote(url.username or "guest"),
            password=unquote(url.password or "guest"),
            tls=url.scheme.endswith("+tls"),
        )

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    def options(self, settings: Settings) -> dict[str, Any]:
        """Keyword arguments of rstream's Producer and Consumer."""
        return {
            "host": self.host,
            "port": self.port,
            "vhost": self.vhost,
            "username": self.username,
            "password": self.password,
            "ssl_context": tls_context(settings) if self.tls else None,
            "frame_max": FRAME_MAX,
            "connection_name": f"nsqworker {settings.client_id}",
        }


def stream_arguments(settings: Settings) -> dict[str, Any]:
    """The arguments of a stream the worker creates (``x-max-age`` and friends)."""
    arguments: dict[str, Any] = {}
    if settings.rabbitmq_stream_max_age:
        arguments["max-age"] = f"{int(settings.rabbitmq_stream_max_age)}s"
    if settings.rabbitmq_stream_max_length_bytes:
        arguments["max-length-bytes"] = settings.rabbitmq_stream_max_length_bytes
    if settings.rabbitmq_stream_segment_bytes:
        arguments["stream-max-segment-size-bytes"] = settings.rabbitmq_stream_segment_bytes
    return arguments


class StreamConnections:
    """The transport's rstream Producer and Consumer, started on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.endpoint = Endpoint.from_settings(settings)
        self.producer_client: Producer | None = None
        self.consumers: list[Consumer] = []
        self.errors = ErrorCounts()
        self._lock = asyncio.Lock()
        self._streams: set[str] = set()

    async def producer(self) -> Producer:
        """The started Producer."""
        async with self._lock:
            if self.producer_client is None:
                from rstream import Producer

                client = Producer(**self.endpoint.options(self.settings))
                await self._start(client)
                self.producer_client = client
            return self.producer_client

    async def consumer(self, on_close: Callable[[Any], Awaitable[None]] | None = None) -> Consumer:
        """A new started Consumer (closed by :meth:`close` if its owner did not);
        ``on_close`` is called when its connection is lost."""
        from rstream import Consumer

        client = Consumer(**self.endpoint.options(self.settings), on_close_handler=on_close)
        await self._start(client)
        self.consumers.append(client)
        return client

    async def link(
        self,
        address: tuple[str, int],
        on_chunk: Callable[[Chunk], None],
        on_update: Callable[[int, bool], Awaitable[tuple[int, int]]],
        on_lost: Callable[[str], None],
    ) -> StreamLink:
        """A new consuming connection to ``address`` (see :mod:`nsqworker.streams.link`).

        Raises:
            ConfigurationError: the login or the vhost was refused.
            NoConnection: the broker cannot be reached.
        """
        from nsqworker.streams.link import StreamLink

        settings, e = self.settings, self.endpoint
        where = f"{address[0]}:{address[1]}"
        try:
            return await StreamLink.connect(
                *address, vhost=e.vhost, username=e.username, password=e.password,
                ssl_context=tls_context(settings) if e.tls else None,
                name=f"nsqworker {settings.client_id}", frame_max=FRAME_MAX,
                on_chunk=on_chunk, on_update=on_update, on_lost=on_lost,
            )  # fmt: skip
        except BrokerRefused as exc:
            if exc.code == 8:
                raise ConfigurationError(
                    f"RabbitMQ at {where} refused the login of user {e.username!r}; check"
                    " the user and password of rabbitmq_stream_uri"
                ) from None
            if exc.code == 12:
                raise ConfigurationError(
                    f"RabbitMQ at {where}: vhost {e.vhost!r} does not exist or user"
                    f" {e.username!r} may not use it; check the vhost of rabbitmq_stream_uri"
                ) from None
            raise NoConnection(f"RabbitMQ streams at {where}: {reason(exc)}") from exc
        except (TimeoutError, OSError) as exc:
            raise NoConnection(f"RabbitMQ streams at {where}: {reason(exc)}") from exc

    async def close_consumer(self, client: Consumer) -> None:
        """Close one Consumer."""
        if client in self.consumers:
            self.consumers.remove(client)
        try:
            await asyncio.wait_for(client.close(), 5)
        except Exception:
            log.debug("closing an rstream consumer failed", exc_info=True)

    async def ensure_stream(self, stream: str) -> None:
        """Make sure ``stream`` exists: create it with the settings' arguments when it is
        missing (and ``rabbitmq_stream_create`` is on); one that exists is used as it is,
        whatever its arguments (the difference is logged once, at info).

        Raises:
            ConfigurationError: the stream is missing and may not be created, or RabbitMQ
                refused to create it (the error names RabbitMQ's reason).
        """
        if stream in self._streams:
            return
        arguments = stream_arguments(self.settings)
        where = f"RabbitMQ at {self.endpoint.address} (vhost {self.endpoint.vhost!r})"
        try:
            # The locator connection, asked directly: rstream's Producer.create_stream and
            # stream_exists close it after each call when it publishes to no stream yet,
            # and its Client.close() sleeps 0.2 s: that was half the time of a first
            # publish (docs/rabbitmq-streams.md, "Speed").
            locator = await (await self.producer()).default_client
            if not self.settings.rabbitmq_stream_create:
                if not await locator.stream_exists(stream):
                    raise ConfigurationError(
                        f"stream {stream!r} does not exist on {where}, and"
                        " rabbitmq_stream_create is off: create it, or turn"
                        " rabbitmq_stream_create on"
                    )
            else:
                await self._create_when_ready(locator, stream, arguments, where)
        except (ConfigurationError, NoConnection):
            raise
        except Exception as exc:
            if isinstance(exc, OSError | TimeoutError | ConnectionError):
                raise NoConnection(f"{where}: {reason(exc)}") from None
            shown = ", ".join(f"{k}={v}" for k, v in arguments.items()) or "no arguments"
            raise ConfigurationError(
                f"cannot create stream {stream!r} ({shown}) on {where}: {reason(exc)}"
            ) from None
        self._streams.add(stream)

    def forget(self, stream: str) -> None:
        """Check ``stream`` again before its next use (it was refused: maybe deleted)."""
        self._streams.discard(stream)

    async def _create_when_ready(
        self, locator: Any, stream: str, arguments: dict[str, Any], where: str
    ) -> None:
        """:meth:`_create`, retried for :data:`CREATE_WAIT` seconds while RabbitMQ's stream
        coordinator is not running yet (a node just restarted answers a creation with
        "internal error" or "stream not available" until it has elected one).

        Raises:
            NoConnection: the coordinator did not come up in time.
        """
        from rstream import exceptions

        loop = asyncio.get_running_loop()
        deadline = loop.time() + CREATE_WAIT
        delay = 0.25
        while True:
            try:
                await self._create(locator, stream, arguments)
                return
            except (exceptions.InternalError, exceptions.StreamNotAvailable) as exc:
                if loop.time() + delay > deadline:
                    raise NoConnection(
                        f"{where} cannot create stream {stream!r}: its stream coordinator"
                        f" is not running ({reason(exc)}, for {CREATE_WAIT:g} s); is the"
                        " node still starting, or did it lose its coordinator (see"
                        " docs/rabbitmq-streams.md, When RabbitMQ crashes)?"
                    ) from None
                log.warning(
                    "%s is not ready to create stream %r yet (%s); retrying in %g s",
                    where, stream, reason(exc), delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _create(self, locator: Any, stream: str, arguments: dict[str, Any]) -> None:
        """Create ``stream``; an existing one is fine, whatever its arguments: RabbitMQ
        answers "stream already exists" when they are ours, "precondition failed" when
        they differ (the stream protocol cannot read them back)."""
        from rstream import exceptions

        try:
            await locator.create_stream(stream, arguments)
        except exceptions.StreamAlreadyExists:
            return
        except exceptions.PreconditionFailed:
            if not await locator.stream_exists(stream):
                raise  # the arguments themselves were refused
            if (self.endpoint.address, stream) not in _differ_logged:
                _differ_logged.add((self.endpoint.address, stream))
                ours = ", ".join(f"{k}={v}" for k, v in arguments.items()) or "none"
                log.info(
                    "stream %r exists with arguments other than the worker's (%s); using it"
                    " as it is (its retention is the operator's)", stream, ours,
                )  # fmt: skip
            return
        log.info("created stream %r (%s)", stream, arguments or "the server's defaults")

    async def advertised_host(self, stream: str) -> str | None:
        """The host RabbitMQ names as ``stream``'s leader (its ``advertised_host``), or
        None when it cannot be asked."""
        try:
            producer = await self.producer()
            client = await producer.default_client
            leader, _ = await asyncio.wait_for(client.query_leader_and_replicas(stream), 5)
            return str(leader.host)
        except Exception:
            log.debug("asking for the leader of %s failed", stream, exc_info=True)
            return None

    async def unresolved(self, stream: str, exc: BaseException) -> ConfigurationError | None:
        """A ``ConfigurationError`` naming the advertised host when ``exc`` is a host
        name that does not resolve (RabbitMQ's ``stream.advertised_host``), else None."""
        if not unresolved_host(exc):
            return None
        host = await self.advertised_host(stream)
        named = f"host {host!r}" if host else "a host"
        return ConfigurationError(
            f"RabbitMQ at {self.endpoint.address} advertises its stream listener as"
            f" {named}, which does not resolve here; set stream.advertised_host"
            " (advertised_host) in rabbitmq.conf to a name or address clients can reach"
        )

    async def _start(self, client: Any) -> None:
        from rstream import exceptions

        where, who = self.endpoint.address, self.endpoint
        try:
            await client.start()
        except exceptions.AuthenticationFailure:
            raise ConfigurationError(
                f"RabbitMQ at {where} refused the login of user {who.username!r}; check"
                " the user and password of rabbitmq_stream_uri"
            ) from None
        except exceptions.VirtualHostAccessFailure:
            raise ConfigurationError(
                f"RabbitMQ at {where}: vhost {who.vhost!r} does not exist or user"
                f" {who.username!r} may not use it; check the vhost of rabbitmq_stream_uri"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise NoConnection(f"RabbitMQ streams at {where}: {reason(exc)}") from None
        except Exception as exc:
            if "auth" in type(exc).__name__.lower():
                raise ConfigurationError(
                    f"RabbitMQ at {where} refused user {who.username!r}: {reason(exc)}"
                ) from None
            raise NoConnection(f"RabbitMQ streams at {where}: {reason(exc)}") from None

    async def close(self) -> None:
        """Close every client."""
        for consumer in list(self.consumers):
            await self.close_consumer(consumer)
        if self.producer_client is not None:
            try:
                await asyncio.wait_for(self.producer_client.close(), 5)
            except Exception:
                log.debug("closing the rstream producer failed", exc_info=True)
        self.producer_client = None
