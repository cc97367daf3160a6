"""One NATS connection per worker process, from the settings, shared by its subscriptions
and publishers.

nats-py does discovery (the servers a cluster announces in INFO ``connect_urls``; not
when a password or token would reach them in plain text, see :attr:`NatsConnection.discovery`)
and reconnects; this module gives it the settings (servers, credentials, TLS, delays), turns
a refused login into a ``ConfigurationError`` naming what was refused, and tells the
subscriptions when the connection came back so they can pull again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from nsqworker.errors import ConfigurationError, NoConnection
from nsqworker.settings.core import tls_context
from nsqworker.subscription_kit import ErrorCounts

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = ["NatsConnection"]

log = logging.getLogger("nsqworker.nats")

_AUTH_WORDS = ("authorization", "authentication", "permissions violation")


class NatsConnection:
    """The process's connection: :meth:`get` connects on first use."""

    def __init__(self, settings: Settings, name: str = "nsqworker") -> None:
        self.settings = settings
        self.name = name
        self.client: Client | None = None
        self.js: JetStreamContext | None = None
        self.errors = ErrorCounts()
        self._lock = asyncio.Lock()
        self._closing = False
        self._last_error: BaseException | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def servers(self) -> list[str]:
        """The servers of the settings (``nats://127.0.0.1:4222`` when none are set)."""
        return list(self.settings.nats_servers) or ["nats://127.0.0.1:4222"]

    @property
    def connected(self) -> bool:
        """True while connected (not while reconnecting)."""
        return self.client is not None and self.client.is_connected

    @property
    def address(self) -> str:
        """``host:port`` of the server in use, or of the first configured one."""
        url = self.client.connected_url if self.client is not None else None
        if url is not None and url.netloc:
            return str(url.netloc)
        return self.servers[0].partition("://")[2]

    def on_reconnect(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each reconnect; returns what removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    async def get(self) -> Client:
        """The connected client; connects (once) on first use.

        Raises:
            ConfigurationError: the server refused the credentials (or TLS settings).
            NoConnection: no server answered; the caller retries.
        """
        async with self._lock:
            if self.client is not None and not self.client.is_closed:
                return self.client
            self._closing = False
            self.client = await self._connect()
            self.js = self.client.jetstream()
            return self.client

    async def jetstream(self) -> JetStreamContext:
        """The JetStream context of the connected client."""
        await self.get()
        assert self.js is not None
        return self.js

    @property
    def discovery(self) -> bool:
        """Whether servers the cluster announces (INFO ``connect_urls``) are dialled:
        not when a password or token would go to them in plain text (without TLS), since
        whoever can send an INFO (a rogue cluster member, anyone on a plain-text path)
        could name a server of theirs and collect it. With TLS, an announced server must
        present a certificate the CA signed; nkeys and creds files prove the key by
        signing the server's nonce, which gives that server nothing to replay."""
        settings = self.settings
        plain = settings.nats_password is not None or settings.nats_token is not None
        return not plain or _tls(settings) is not None

    async def _connect(self) -> Client:
        from nats.aio.client import Client
        from nats.errors import NoServersError

        settings = self.settings
        options: dict[str, Any] = {
            "servers": self.servers,
            "name": self.name,
            "connect_timeout": settings.dial_timeout,
            "reconnect_time_wait": settings.reconnect_delay,
            "max_reconnect_attempts": 1,  # at the first connect; -1 once connected
            "allow_reconnect": True,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "user": settings.nats_user,
            "password": _secret(settings.nats_password),
            "token": _secret(settings.nats_token),
            "nkeys_seed_str": _secret(settings.nats_nkey_seed),
            "user_credentials": str(settings.nats_creds_file) if settings.nats_creds_file else None,
            "tls": _tls(settings),
        }
        self._last_error = None
        client = Client() if self.discovery else _configured_servers_only()()
        try:
            await client.connect(**{k: v for k, v in options.items() if v is not None})
        except NoServersError:
            if self._last_error is not None:
                self._raise_for(self._last_error)
            raise NoConnection(f"no NATS server answered at {', '.join(self.servers)}") from None
        except Exception as exc:
            self._raise_for(exc)
        client.options["max_reconnect_attempts"] = -1  # connected: reconnect forever
        return client

    def _raise_for(self, exc: BaseException) -> NoReturn:
        """``ConfigurationError`` for a refused login, else ``NoConnection``."""
        where = ", ".join(self.servers)
        if _is_refusal(exc):
            raise ConfigurationError(
                f"NATS at {where} refused the login ({exc}); check"
                f" {_credential_names(self.settings)}"
            ) from None
        raise NoConnection(f"NATS at {where}: {exc or type(exc).__name__}") from None

    async def close(self) -> None:
        """Flush what was published and close."""
        client, self.client, self.js = self.client, None, None
        self._closing = True
        if client is not None and not client.is_closed:
            try:
                await asyncio.wait_for(client.flush(), timeout=2.0)
            except Exception:  # closing anyway
                log.debug("flush before close failed", exc_info=True)
            await client.close()

    async def _on_error(self, exc: Exception) -> None:
        if self._last_error is None or _is_refusal(exc):  # a refusal outranks the reset after it
            self._last_error = exc
        reason = type(exc).__name__
        self.errors.count(reason)
        log.warning("NATS: %s", exc or reason)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.errors.count("disconnected")
        log.warning("NATS: disconnected from %s; reconnecting", self.address)

    async def _on_reconnected(self) -> None:
        log.info("NATS: reconnected to %s", self.address)
        for listener in list(self._listeners):
            listener()


@functools.cache
def _configured_servers_only() -> type[Client]:
    """A nats-py client that ignores the servers INFO announces, on every (re)connect."""
    from nats.aio.client import Client

    class ConfiguredServersOnly(Client):
        # nats-py adds the announced servers to its pool in _process_info and offers no
        # option to refuse them: the override is the one place to say no.
        async def _process_info(
            self, info: dict[str, Any], initial_connection: bool = False
        ) -> None:
            if info.get("connect_urls"):
                info = {**info, "connect_urls": []}
            await super()._process_info(info, initial_connection=initial_connection)

    return ConfiguredServersOnly


def _is_refusal(exc: BaseException) -> bool:
    text = str(exc).lower()
    return not isinstance(exc, OSError | TimeoutError) and any(w in text for w in _AUTH_WORDS)


def _secret(value: Any) -> str | None:
    return None if value is None else str(value.get_secret_value())


def _credential_names(settings: Settings) -> str:
    given = [
        name
        for name in (
            "nats_user",
            "nats_password",
            "nats_token",
            "nats_nkey_seed",
            "nats_creds_file",
        )
        if getattr(settings, name) is not None
    ]
    if not given:
        return (
            "the server wants credentials: set nats_user and nats_password, nats_token,"
            " nats_nkey_seed or nats_creds_file"
        )
    return " and ".join(given)


def _tls(settings: Settings) -> ssl.SSLContext | None:
    wants = any(s.startswith("tls://") for s in settings.nats_servers) or settings.tls_ca_file
    if not wants and not settings.tls_cert_file:
        return None
    return tls_context(settings)
