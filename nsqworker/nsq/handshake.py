"""Opening a connection: magic, IDENTIFY, TLS, compression, AUTH.

A :class:`~nsqworker.nsq.connection.Connection` dials, then hands itself to a
:class:`Handshake`, which pulls frames one at a time until nsqd has answered every step
(what it needs of the connection is the :class:`Negotiating` protocol). After it, the
connection's read loop takes over.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from nsqworker.errors import (
    AuthError,
    ConfigurationError,
    ConnectionClosed,
    NSQDError,
    RemoteProtocolError,
)
from nsqworker.nsq import protocol
from nsqworker.nsq.lookupd import get_json
from nsqworker.nsq.options import (
    NEGOTIABLE,
    ConnectionConfig,
    ServerInfo,
    identify_rejection,
)
from nsqworker.nsq.protocol import ErrorFrame, MessageFrame, Response
from nsqworker.nsq.tls import compression_codecs, import_snappy

__all__ = ["Handshake", "Negotiating", "connect_adapting", "connect_error"]

log = logging.getLogger("nsqworker.nsq.connection")
_NOP = protocol.nop()
NEGOTIABLE_FLAGS = dict(NEGOTIABLE.values())
_warned_unused_secret = False
#: Seconds assumed between heartbeats when nsqd chooses the interval (its
#: --client-timeout / 2, 30 s by default); the liveness check allows twice this.
ASSUMED_HEARTBEAT = 60.0


def connect_error(address: str, dial_timeout: float, exc: BaseException) -> BaseException:
    """What a failed dial or negotiation raises: nsqd's own errors as they are, network
    failures and timeouts as :class:`ConnectionClosed` naming the nsqd."""
    if isinstance(exc, NSQDError | ConnectionClosed | ConfigurationError):
        return exc
    if isinstance(exc, TimeoutError):
        return ConnectionClosed(
            f"nsqd at {address} did not connect and negotiate within {dial_timeout} s"
        )
    if isinstance(exc, OSError):
        return ConnectionClosed(f"cannot connect to nsqd at {address}: {exc}")
    if isinstance(exc, RemoteProtocolError):
        return ConnectionClosed(f"nsqd at {address} sent garbage: {exc}")
    return exc


class Negotiating(Protocol):
    """What a :class:`Handshake` reads and drives of the connection it negotiates: the
    connection is the asyncio protocol of the socket, so the handshake reads the frames
    its decoder holds, waits on its waiter, and writes through its buffer."""

    address: str
    host: str
    config: ConnectionConfig
    _loop: asyncio.AbstractEventLoop
    _decoder: protocol.Decoder
    _transport: asyncio.Transport | None
    _wbuf: list[bytes]
    _compress: Callable[[bytes], bytes] | None
    _decompress: Callable[[bytes], bytes] | None
    _waiter: asyncio.Future[None] | None
    _lost: bool

    def _flush(self) -> None: ...
    def _closed_error(self) -> ConnectionClosed: ...


class Handshake:
    """One negotiation of ``conn`` after its dial; :meth:`negotiate` returns what nsqd
    answered (its IDENTIFY, with AUTH's identity when it asked for AUTH)."""

    def __init__(self, conn: Negotiating) -> None:
        self.conn = conn
        self.address = conn.address

    async def negotiate(self, snappy: Any) -> ServerInfo:
        """Magic and IDENTIFY, then TLS, compression and AUTH as nsqd answers."""
        return await self._negotiate(snappy)

    async def _negotiate(self, snappy: Any) -> ServerInfo:
        cfg = self.conn.config
        assert self.conn._transport is not None
        self.conn._transport.write(protocol.MAGIC_V2 + protocol.identify(cfg.identify_body()))
        server = ServerInfo.from_identify((await self._next_response()).data)
        if cfg.tls_v1:
            if not server.tls_v1:
                raise ConnectionClosed(
                    f"TLS was asked for but nsqd at {self.address} does not offer it "
                    "(start nsqd with --tls-cert and --tls-key, or set tls_v1 off)"
                )
            await self._start_tls()
            await self._expect_ok("TLS")
        # nsqd v1.3.0 upgrades in this order: TLS, then snappy or deflate.
        if server.snappy or server.deflate:
            self._install_compression(server, snappy)
            await self._expect_ok("compression")
        if server.auth_required:
            server = await self._auth(server)
        elif cfg.auth_secret:
            global _warned_unused_secret
            if not _warned_unused_secret:
                _warned_unused_secret = True
                log.warning("auth_secret is set but nsqd at %s does not require AUTH", self.address)
        return server

    async def _next_response(self) -> Response:
        """The next answer during negotiation; heartbeats are answered and skipped."""
        while True:
            try:
                frame = self.conn._decoder.next_frame()
            except RemoteProtocolError as exc:
                raise ConnectionClosed(f"nsqd at {self.address} sent garbage: {exc}") from exc
            if frame is None:
                if self.conn._lost:
                    raise self.conn._closed_error()
                self.conn._waiter = self.conn._loop.create_future()
                await self.conn._waiter
            elif isinstance(frame, ErrorFrame):
                raise NSQDError.from_frame(frame.data)
            elif isinstance(frame, MessageFrame):
                raise ConnectionClosed(f"nsqd at {self.address} sent a message before SUB")
            elif frame.data == protocol.HEARTBEAT:
                self.conn._wbuf.append(_NOP)
                self.conn._flush()
            else:
                return frame

    async def _expect_ok(self, step: str) -> None:
        frame = await self._next_response()
        if frame.data != protocol.OK:
            raise ConnectionClosed(f"nsqd at {self.address} answered {frame.data!r} after {step}")

    async def _start_tls(self) -> None:
        if len(self.conn._decoder):
            raise ConnectionClosed(f"nsqd at {self.address} sent data before the TLS handshake")
        cfg = self.conn.config
        context = cfg.ssl_context or ssl.create_default_context()
        assert self.conn._transport is not None
        transport = await self.conn._loop.start_tls(
            self.conn._transport,
            cast(asyncio.BaseProtocol, self.conn),
            context,
            server_hostname=cfg.tls_server_name or self.conn.host,
            ssl_handshake_timeout=cfg.dial_timeout,
        )
        if transport is None:
            raise ConnectionClosed(f"TLS handshake with nsqd at {self.address} failed")
        self.conn._transport = transport

    def _install_compression(self, server: ServerInfo, snappy: Any) -> None:
        # nsqd may have sent the compressed OK in the same segment as the plain
        # IDENTIFY answer: those bytes sit undecoded in the decoder.
        leftover = self.conn._decoder.take_buffer()
        if server.snappy and snappy is None:
            snappy = import_snappy()
        self.conn._compress, self.conn._decompress = compression_codecs(
            snappy if server.snappy else None, server.deflate_level
        )
        if leftover:
            self.conn._decoder.receive(self.conn._decompress(leftover))

    async def _auth(self, server: ServerInfo) -> ServerInfo:
        secret = self.conn.config.auth_secret
        if not secret:
            raise AuthError(
                f"nsqd at {self.address} requires AUTH and no secret is set: "
                "set NSQWORKER_AUTH_SECRET (Settings.auth_secret)"
            )
        if self.conn.config.auth_requires_tls:
            raise AuthError(
                f"nsqd at {self.address}, found through nsqlookupd, asks for AUTH over plain "
                "TCP: the secret is not sent (lookupd is unauthenticated). Set tls_v1, list "
                "the nsqd in nsqd_tcp_addresses, or set lookupd_auth_without_tls on a "
                "trusted network"
            )
        self.conn._wbuf.append(protocol.auth(secret))
        self.conn._flush()
        data = (await self._next_response()).data
        try:
            info = json.loads(data)
            return dataclasses.replace(
                server,
                auth_identity=str(info.get("identity", "")),
                auth_identity_url=str(info.get("identity_url", "")) or None,
                auth_permission_count=int(info.get("permission_count", 0)),
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConnectionClosed(f"nsqd at {self.address} answered AUTH with {data!r}") from exc


# --- negotiation that adapts ---------------------------------------------------------


class _Connectable(Protocol):
    server: ServerInfo

    async def connect(self) -> ServerInfo: ...

    def abort(self) -> None: ...


C = TypeVar("C", bound=_Connectable)

#: What each nsqd accepted, by (address, config asked): reconnects ask it directly.
_ADAPTED: dict[tuple[str, ConnectionConfig], ConnectionConfig] = {}
_WARNED: set[tuple[str, str]] = set()
_MAX_REFUSALS = 5  # one per negotiable field at most


def _shown(field: str, value: Any) -> str:
    seconds = field in ("msg_timeout", "heartbeat_interval", "output_buffer_timeout")
    return f"{value:g} s" if seconds else str(value)


#: nsqd's /info limits (nanoseconds for durations) for the fields it refuses.
_INFO_LIMITS = {
    "heartbeat_interval": ("max_heartbeat_interval", 1.0),
    "output_buffer_timeout": ("max_output_buffer_timeout", 0.025),
    "output_buffer_size": ("max_output_buffer_size", 64),
}


async def _clamp(field: str, asked: Any, http_address: str | None, cfg: ConnectionConfig) -> Any:
    """``asked`` within nsqd's limit as its ``/info`` says (nsqd v1.3.0 lists
    max_heartbeat_interval, max_output_buffer_timeout and max_output_buffer_size);
    None (nsqd's own default) when the limit cannot be learned."""
    if http_address is None or field not in _INFO_LIMITS:
        return None
    key, floor = _INFO_LIMITS[field]
    info = await _info(http_address, cfg)
    limit = None if info is None else info.get(key)
    if not isinstance(limit, int):
        return None
    if field == "output_buffer_size":
        return max(floor, min(asked, limit))
    limit_s = limit / 1e9
    clamped = max(floor, min(asked, limit_s))
    return clamped if clamped < asked else None


async def _info(http_address: str | None, cfg: ConnectionConfig) -> dict[str, Any] | None:
    """nsqd's ``GET /info`` answer, or None (also for one over lookupd's size cap, or
    nested too deeply: the address came from lookupd, which anyone may answer as)."""
    import httpx  # here, not at import: it costs ~60 ms

    if http_address is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=cfg.dial_timeout, trust_env=False) as client:
            info = await get_json(client, f"{http_address}/info")
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("nsqd %s/info: %s", http_address, exc)
        return None
    return info if isinstance(info, dict) else None


def _used(field: str, server: ServerInfo) -> str:
    """What nsqd chose for ``field`` when we left it to nsqd, as its answer tells."""
    if field == "msg_timeout":
        return f"nsqd's --msg-timeout ({server.msg_timeout:g} s)"
    if field == "heartbeat_interval":
        return "nsqd's default (its --client-timeout / 2, 30 s unless changed)"
    if field == "output_buffer_timeout":
        return f"nsqd's default ({server.output_buffer_timeout:g} s)"
    if field == "output_buffer_size":
        return f"nsqd's default ({server.output_buffer_size} bytes)"
    return "nsqd's default"


async def connect_adapting(
    address: str,
    config: ConnectionConfig,
    make: Callable[[ConnectionConfig], C],
    http_address: str | None = None,
) -> C:
    """``make(config).connect()``, adapting to what this nsqd accepts.

    When nsqd refuses an IDENTIFY value that was left at its default, the value is
    clamped to nsqd's limit when its HTTP ``/info`` (at ``http_address``, which lookupd
    tells) gives it, else dropped (nsqd's own setting applies), and a fresh connection
    tries again, once per field; one warning names the setting, the value asked and the value nsqd used, and
    later connections to the same nsqd ask the adapted values at once. A value the
    operator set explicitly (``config.explicit``) that nsqd refuses raises
    :class:`ConfigurationError` naming the setting and nsqd's limit: a retry loop
    would never consume anything.
    """
    key = (address, config)
    cfg = _ADAPTED.get(key, config)
    dropped: list[tuple[str, Any]] = []
    for _ in range(_MAX_REFUSALS):
        conn = make(cfg)
        try:
            server = await conn.connect()
        except NSQDError as exc:
            rejected = identify_rejection(exc)
            if rejected is None or rejected[0] == "sample_rate":
                raise
            if getattr(cfg, rejected[0]) is None:
                raise
            field, flag, _asked = rejected
            if field in cfg.explicit:
                raise await _refused_error(address, cfg, field, flag, make, http_address) from exc
            asked = getattr(cfg, field)
            dropped.append((field, asked))
            clamped: dict[str, Any] = {field: await _clamp(field, asked, http_address, cfg)}
            cfg = dataclasses.replace(cfg, **clamped)
            continue
        if dropped:
            _ADAPTED[key] = cfg
            for field, asked in dropped:
                used = getattr(cfg, field)
                log.warning(
                    "nsqd at %s refused %s=%s (outside its %s); using %s",
                    address, field, _shown(field, asked), NEGOTIABLE_FLAGS[field],
                    _used(field, server) if used is None else f"{_shown(field, used)}, its limit",
                )  # fmt: skip
        capped = cfg.compression == "deflate" and server.deflate_level < cfg.deflate_level
        if capped and (address, "deflate_level") not in _WARNED:
            _WARNED.add((address, "deflate_level"))
            log.warning(
                "nsqd at %s caps deflate_level at %d (--max-deflate-level); asked %d",
                address, server.deflate_level, cfg.deflate_level,
            )  # fmt: skip
        return conn
    raise ConnectionClosed(f"nsqd at {address} kept refusing IDENTIFY values: {dropped}")


async def _refused_error(
    address: str,
    cfg: ConnectionConfig,
    field: str,
    flag: str,
    make: Callable[[ConnectionConfig], C],
    http_address: str | None = None,
) -> ConfigurationError:
    """The error for an explicit value nsqd refused, with nsqd's limit when one probe
    connection (the value left to nsqd) can tell it."""
    asked = getattr(cfg, field)
    limit = ""
    if field == "msg_timeout":
        probe = make(dataclasses.replace(cfg, msg_timeout=None))
        try:
            server = await probe.connect()
            limit = f" (nsqd allows at most {server.max_msg_timeout:g} s)"
        except Exception as exc:  # the error below is the one that matters
            log.debug("probing nsqd at %s for its limits: %s", address, exc)
        finally:
            probe.abort()
    elif field in _INFO_LIMITS and (info := await _info(http_address, cfg)) is not None:
        key = _INFO_LIMITS[field][0]
        value = info.get(key)
        if isinstance(value, int):
            shown = str(value) if field == "output_buffer_size" else f"{value / 1e9:g} s"
            limit = f" (nsqd allows at most {shown})"
    env = "NSQWORKER_" + field.upper()
    return ConfigurationError(
        f"{env} ({field}) = {_shown(field, asked)} is refused by nsqd at {address}{limit}: "
        f"lower it, unset it to let nsqd decide, or change nsqd's {flag}"
    )
