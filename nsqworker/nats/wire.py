"""A raw NATS connection for a subscription's hot path, on the codec of
:mod:`nsqworker.nats.protocol`.

nats-py builds a ``Msg``, queues it and awaits a callback task for every message, and
awaits again for every publish: four fifths of the time a worker spent per message. A
:class:`Wire` is an ``asyncio.Protocol``: the bytes of one read are decoded in one pass,
each message goes straight to the subscription's callback, and what the callbacks send
(acks, pull requests) is written once per loop turn.

It dials the server the process's nats-py connection is on (so nats-py's discovery and
its refusal to announce passwords in plain text decide where), logs in with the same
settings (user and password, token, nkey seed, creds file; TLS when the URL is
``tls://``, a CA or a client certificate is set, or the server requires it) and never
reconnects by itself: ``on_lost`` tells its owner, who opens another.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from nsqworker._version import __version__
from nsqworker.errors import ConfigurationError, NoConnection, RemoteProtocolError
from nsqworker.nats import protocol
from nsqworker.nats.client import _is_refusal, _tls

if TYPE_CHECKING:
    from nsqworker.settings.nats import NatsSettings as Settings

__all__ = ["Wire", "open_wire"]

log = logging.getLogger("nsqworker.nats")

_monotonic = time.monotonic

OnMsg = Callable[[bytes, int, bytes, bytes | None, bytes], object]


class Wire(asyncio.Protocol):
    """One connection: ``send`` bytes, messages to ``on_msg``; see the module."""

    def __init__(self, on_msg: OnMsg, on_lost: Callable[[BaseException | None], None]) -> None:
        self.on_msg = on_msg
        self.on_lost = on_lost
        self.address = ""
        self.info: dict[str, Any] = {}
        self.errors: list[str] = []
        self._decoder = protocol.Decoder()
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._out: list[bytes] = []
        #: JetStream ack subjects to publish ``+ACK`` to, written in one piece, first, at
        #: the next flush: what a subscription appends for each message it finished.
        self.acks: list[bytes] = []
        #: When the last read arrived (``time.monotonic``): every message and heartbeat
        #: of that read was received then.
        self.read_at = _monotonic()
        self._scheduled = False
        self._pongs: list[asyncio.Future[None]] = []
        self._info_waiter: asyncio.Future[None] | None = self._loop.create_future()
        self._closing = False
        self._ready = False

    def __repr__(self) -> str:
        return f"<Wire {self.address} open={self.open}>"

    @property
    def open(self) -> bool:
        """True from the login to the close or loss."""
        return self._ready and self._transport is not None and not self._closing

    # --- writing ----------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queue ``data``; everything queued in one loop turn goes in one write."""
        self._out.append(data)
        if not self._scheduled:
            self._schedule()

    def send_now(self, data: bytes) -> None:
        """Write what is queued, then ``data``, now rather than at the end of the loop
        turn (a pull request: the server starts on it while this turn goes on)."""
        self._out.append(data)
        self.flush()

    def ack(self, subject: bytes) -> None:
        """Queue ``+ACK`` to ``subject`` (a JetStream ack subject) for the next flush."""
        self.acks.append(subject)
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        """Flush at the end of this loop turn (once, however much is queued by then)."""
        self._scheduled = True
        self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now: the acks, then the rest in order."""
        self._scheduled = False
        out, acks = self._out, self.acks
        if acks:
            out.insert(0, b"PUB " + b" 4\r\n+ACK\r\nPUB ".join(acks) + b" 4\r\n+ACK\r\n")
            acks.clear()
        if not out:
            return
        data = b"".join(out)
        out.clear()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    async def round_trip(self, timeout: float) -> None:
        """PING and wait for the PONG: the server has handled all sent before, and all
        it sent before has been read."""
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._pongs.append(waiter)
        self.send(protocol.PING)
        await asyncio.wait_for(waiter, timeout)

    def close(self) -> None:
        """Write what is queued and close; ``on_lost`` is not called."""
        self.flush()
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    # --- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.read_at = _monotonic()
        try:
            self._decoder.feed_into(data, self.on_msg, self._on_event)
        except RemoteProtocolError as exc:
            log.warning("NATS %s: %s; reconnecting", self.address, exc)
            self.errors.append("protocol")
            self._abort(exc)
        if self.acks and not self._scheduled:  # once per read, not per message
            self._schedule()

    def connection_lost(self, exc: Exception | None) -> None:
        was_ready = self._ready and not self._closing
        self._ready = False
        self._transport = None
        for waiter in [*self._pongs, self._info_waiter]:
            if waiter is not None and not waiter.done():
                waiter.set_exception(ConnectionError(f"NATS {self.address} closed the connection"))
        self._pongs.clear()
        if was_ready:
            self.on_lost(exc)

    def _on_event(self, event: protocol.Event) -> None:
        if event is protocol.PING_EVENT:
            self.send(protocol.PONG)
        elif event is protocol.PONG_EVENT:
            if self._pongs:
                waiter = self._pongs.pop(0)
                if not waiter.done():
                    waiter.set_result(None)
        elif isinstance(event, protocol.Info):
            self.info = event.data
            if self._info_waiter is not None and not self._info_waiter.done():
                self._info_waiter.set_result(None)
        elif isinstance(event, protocol.Err):
            self.errors.append(event.text)
            if self._pongs and not self._ready:  # the login was refused
                waiter = self._pongs.pop(0)
                if not waiter.done():
                    waiter.set_exception(_refused(event.text, self.address))
            else:
                log.warning("NATS %s: -ERR %s", self.address, event.text)

    def _abort(self, exc: BaseException) -> None:
        if self._transport is not None:
            self._transport.abort()

    # --- login -------------------------------------------------------------------

    async def login(self, settings: Settings, name: str, host: str, tls: ssl.SSLContext | None,
                      timeout: float) -> None:  # fmt: skip
        """Wait for INFO, upgrade to TLS where asked, send CONNECT with the settings'
        credentials and wait for the server's answer (what the dialer drives)."""
        assert self._info_waiter is not None
        await asyncio.wait_for(self._info_waiter, timeout)
        self._info_waiter = None
        if tls is None and self.info.get("tls_required"):
            tls = ssl.create_default_context()
        if tls is not None:
            assert self._transport is not None
            transport = await self._loop.start_tls(
                self._transport, self, tls, server_hostname=host, ssl_handshake_timeout=timeout
            )
            self._transport = cast("asyncio.Transport", transport)
        options = _credentials(settings, self.info.get("nonce"))
        options |= {
            "verbose": False, "pedantic": False, "lang": "python3", "version": __version__,
            "protocol": 1, "headers": True, "no_responders": True, "name": name,
        }  # fmt: skip
        self.send(protocol.connect(options))
        await self.round_trip(timeout)
        self._ready = True


async def open_wire(
    settings: Settings,
    address: str,
    *,
    scheme: str,
    name: str,
    on_msg: OnMsg,
    on_lost: Callable[[BaseException | None], None],
) -> Wire:
    """A logged-in :class:`Wire` to ``address`` (``host:port``).

    Raises:
        ConfigurationError: the server refused the login.
        NoConnection: the server did not answer, or closed during the login.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    loop = asyncio.get_running_loop()
    wire = Wire(on_msg, on_lost)
    wire.address = address
    timeout = settings.dial_timeout
    tls = _tls(settings)
    if tls is None and scheme == "tls":
        tls = ssl.create_default_context()
    try:
        await asyncio.wait_for(loop.create_connection(lambda: wire, host, int(port)), timeout)
        await wire.login(settings, name, host, tls, timeout)
    except ConfigurationError:
        wire.close()
        raise
    except (OSError, TimeoutError, ValueError, ssl.SSLError) as exc:
        wire.close()
        raise NoConnection(f"NATS at {address}: {exc or type(exc).__name__}") from None
    return wire


def _refused(text: str, address: str) -> Exception:
    if _is_refusal(Exception(text)):
        return ConfigurationError(f"NATS at {address} refused the login ({text})")
    return NoConnection(f"NATS at {address}: -ERR {text}")


def _credentials(settings: Settings, nonce: str | None) -> dict[str, Any]:
    """The login fields of CONNECT, as nats-py sends them for the same settings."""
    options: dict[str, Any] = {}
    seed: bytes | None = None
    if settings.nats_creds_file is not None:
        jwt, seed = _read_creds(settings.nats_creds_file.read_text())
        options["jwt"] = jwt
    elif settings.nats_nkey_seed is not None:
        seed = settings.nats_nkey_seed.get_secret_value().strip().encode()
    if seed is not None:
        try:
            import nkeys  # type: ignore[import-not-found]
        except ImportError as exc:  # nats-py needs it for the same settings
            raise ConfigurationError("nats_nkey_seed and nats_creds_file need nkeys") from exc
        pair = nkeys.from_seed(seed)
        if nonce is not None:
            options["sig"] = base64.b64encode(pair.sign(nonce.encode())).decode()
        if "jwt" not in options:
            options["nkey"] = pair.public_key.decode()
        if settings.nats_token is not None:
            options["auth_token"] = settings.nats_token.get_secret_value()
    elif settings.nats_user is not None and settings.nats_password is not None:
        options["user"] = settings.nats_user
        options["pass"] = settings.nats_password.get_secret_value()
    elif settings.nats_token is not None:
        options["auth_token"] = settings.nats_token.get_secret_value()
    return options


def _read_creds(text: str) -> tuple[str, bytes]:
    """The user JWT and the nkey seed of a ``.creds`` file."""
    lines = [line.strip() for line in text.splitlines()]

    def after(marker: str) -> str:
        for i, line in enumerate(lines):
            if marker in line and i + 1 < len(lines) and lines[i + 1]:
                return lines[i + 1]
        raise ConfigurationError(f"nats_creds_file has no {marker} section")

    return after("BEGIN NATS USER JWT"), after("BEGIN USER NKEY SEED").encode()
