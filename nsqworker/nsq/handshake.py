"""Opening a connection: magic, IDENTIFY, TLS, compression, AUTH.

:class:`Negotiation` is the handshake without I/O: fed nsqd's frames one at a time, it
returns the steps the connection carries out (:class:`Send` bytes, :class:`StartTLS`,
:class:`Compress` from now on, :class:`Done` with what nsqd answered) and raises what
nsqd's answers mean. :class:`~nsqworker.nsq.connection.Connection` dials, runs the steps,
then hands over to its read loop. :func:`connect_adapting` retries a negotiation that
nsqd refused with values it accepts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar

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
from nsqworker.nsq.protocol import ErrorFrame, Frame, MessageFrame
from nsqworker.nsq.tls import Codec, compression_codecs, import_snappy

__all__ = [
    "Compress",
    "Done",
    "Negotiation",
    "Send",
    "Stage",
    "StartTLS",
    "Step",
    "connect_adapting",
    "connect_error",
    "forget_adapted",
    "nsqd_info",
]

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


# --- the negotiation, without I/O -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``data`` to nsqd (through the compression in force)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class StartTLS:
    """Upgrade the socket to TLS now; nothing may have been received after the answer
    that asked for it. ``context`` None: the system's default context."""

    context: ssl.SSLContext | None
    server_hostname: str


@dataclass(frozen=True, slots=True)
class Compress:
    """From now on compress what is written and decompress what is read, including the
    bytes received but not decoded yet (nsqd may send its compressed OK in the same
    segment as the plain answer before it)."""

    compress: Codec
    decompress: Codec


@dataclass(frozen=True, slots=True)
class Done:
    """The negotiation is over: ``server`` is what nsqd answered (its IDENTIFY, with
    AUTH's identity when it asked for AUTH)."""

    server: ServerInfo


Step = Send | StartTLS | Compress | Done


class Stage(Enum):
    """What the negotiation waits for nsqd to answer."""

    IDENTIFY = "IDENTIFY"
    TLS = "TLS"
    COMPRESSION = "compression"
    AUTH = "AUTH"
    DONE = "done"


class Negotiation:
    """One handshake with nsqd at ``address`` (dialled as ``host``), as a state machine.

    :meth:`start` gives the first steps (magic and IDENTIFY); :meth:`receive` takes each
    frame nsqd sends and gives the next steps, ending with :class:`Done`. nsqd v1.3.0
    upgrades in this order: TLS, then snappy or deflate, then AUTH. Heartbeats are
    answered with a NOP. Raises :class:`NSQDError` (:class:`AuthError`) for nsqd's
    errors, :class:`AuthError` when AUTH cannot be sent, :class:`ConnectionClosed` for
    answers that make no sense, :class:`ConfigurationError` for a missing snappy.
    """

    def __init__(
        self, address: str, host: str, config: ConnectionConfig, snappy: Any = None
    ) -> None:
        self.address = address
        self.host = host
        self.config = config
        self.snappy = snappy
        self.server = ServerInfo()
        self.stage = Stage.IDENTIFY

    def start(self) -> list[Step]:
        """The magic and IDENTIFY."""
        return [Send(protocol.MAGIC_V2 + protocol.identify(self.config.identify_body()))]

    def receive(self, frame: Frame) -> list[Step]:
        """The steps after nsqd sent ``frame``."""
        if self.stage is Stage.DONE:
            raise RuntimeError("the negotiation is over")
        if isinstance(frame, ErrorFrame):
            raise NSQDError.from_frame(frame.data)
        if isinstance(frame, MessageFrame):
            raise ConnectionClosed(f"nsqd at {self.address} sent a message before SUB")
        if frame.data == protocol.HEARTBEAT:
            return [Send(_NOP)]
        stage = self.stage
        if stage is Stage.IDENTIFY:
            self.server = ServerInfo.from_identify(frame.data)
        elif stage is Stage.AUTH:
            self.server = self._authorised(frame.data)
        elif frame.data != protocol.OK:
            raise ConnectionClosed(
                f"nsqd at {self.address} answered {frame.data!r} after {stage.value}"
            )
        return self._after(stage)

    def _after(self, answered: Stage) -> list[Step]:
        """The next upgrade nsqd's IDENTIFY answer asks for, after ``answered``."""
        server, cfg = self.server, self.config
        if answered is Stage.IDENTIFY and cfg.tls_v1:
            if not server.tls_v1:
                raise ConnectionClosed(
                    f"TLS was asked for but nsqd at {self.address} does not offer it "
                    "(start nsqd with --tls-cert and --tls-key, or set tls_v1 off)"
                )
            self.stage = Stage.TLS
            return [StartTLS(cfg.ssl_context, cfg.tls_server_name or self.host)]
        if answered in (Stage.IDENTIFY, Stage.TLS) and (server.snappy or server.deflate):
            snappy = self.snappy
            if server.snappy and snappy is None:
                snappy = import_snappy()
            codecs = compression_codecs(snappy if server.snappy else None, server.deflate_level)
            self.stage = Stage.COMPRESSION
            return [Compress(*codecs)]
        if answered is not Stage.AUTH and server.auth_required:
            self.stage = Stage.AUTH
            return [Send(protocol.auth(self._secret()))]
        if not server.auth_required and cfg.auth_secret:
            global _warned_unused_secret
            if not _warned_unused_secret:
                _warned_unused_secret = True
                log.warning("auth_secret is set but nsqd at %s does not require AUTH", self.address)
        self.stage = Stage.DONE
        return [Done(server)]

    def _secret(self) -> str:
        secret = self.config.auth_secret
        if not secret:
            raise AuthError(
                f"nsqd at {self.address} requires AUTH and no secret is set: "
                "set NSQWORKER_AUTH_SECRET (Settings.auth_secret)"
            )
        if self.config.auth_requires_tls:
            raise AuthError(
                f"nsqd at {self.address}, found through nsqlookupd, asks for AUTH over plain "
                "TCP: the secret is not sent (lookupd is unauthenticated). Set tls_v1, list "
                "the nsqd in nsqd_tcp_addresses, or set lookupd_auth_without_tls on a "
                "trusted network"
            )
        return secret

    def _authorised(self, data: bytes) -> ServerInfo:
        try:
            info = json.loads(data)
            return dataclasses.replace(
                self.server,
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


def forget_adapted() -> None:
    """Forget what each nsqd accepted and which warnings were given, the unused AUTH
    secret's too (a test's fresh start)."""
    global _warned_unused_secret
    _ADAPTED.clear()
    _WARNED.clear()
    _warned_unused_secret = False


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
    info = await nsqd_info(http_address, cfg)
    limit = None if info is None else info.get(key)
    if not isinstance(limit, int):
        return None
    if field == "output_buffer_size":
        return max(floor, min(asked, limit))
    limit_s = limit / 1e9
    clamped = max(floor, min(asked, limit_s))
    return clamped if clamped < asked else None


async def nsqd_info(http_address: str | None, cfg: ConnectionConfig) -> dict[str, Any] | None:
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
    elif field in _INFO_LIMITS and (info := await nsqd_info(http_address, cfg)) is not None:
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
