"""What a connection asks of nsqd (:class:`ConnectionConfig`) and what nsqd answered
(:class:`ServerInfo`): IDENTIFY's two sides, as plain values."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import ssl
from typing import Any

from nsqworker._version import __version__
from nsqworker.errors import ConfigurationError, NSQDError, RemoteProtocolError
from nsqworker.nsq import protocol
from nsqworker.nsq.tls import ssl_context

__all__ = ["NEGOTIABLE", "ConnectionConfig", "ServerInfo", "identify_rejection"]

COMPRESSIONS = ("none", "deflate", "snappy")
# Settings fields copied as they are; the TLS files and the secret need more work.
_SETTINGS = (  # noqa: SIM905
    "client_id hostname heartbeat_interval msg_timeout output_buffer_size output_buffer_timeout "
    "sample_rate tls_v1 tls_server_name compression deflate_level dial_timeout"
).split()
_MS_FIELDS = ("max_msg_timeout", "msg_timeout", "output_buffer_timeout")

#: IDENTIFY values nsqd may refuse, by the words of its error text, with the config
#: field and the nsqd flag that bounds it. nsqd v1.3.0 answers
#: ``E_BAD_BODY IDENTIFY msg timeout (60000) is invalid`` and closes; it never says the
#: bound (deflate_level is clamped silently, sample_rate is checked here first).
NEGOTIABLE = {
    "heartbeat interval": ("heartbeat_interval", "--max-heartbeat-interval"),
    "output buffer timeout": (
        "output_buffer_timeout",
        "--min-output-buffer-timeout/--max-output-buffer-timeout",
    ),
    "output buffer size": ("output_buffer_size", "--max-output-buffer-size"),
    "msg timeout": ("msg_timeout", "--max-msg-timeout"),
    "sample rate": ("sample_rate", "(0..99)"),
}
_REJECTED = re.compile(r"IDENTIFY (" + "|".join(NEGOTIABLE) + r") \((-?\d+)\) is invalid")


def identify_rejection(error: NSQDError) -> tuple[str, str, int] | None:
    """``(config field, nsqd flag, asked value as sent)`` when ``error`` is nsqd refusing
    an IDENTIFY value, else None."""
    if error.code != "E_BAD_BODY":
        return None
    match = _REJECTED.search(error.message)
    if match is None:
        return None
    field, flag = NEGOTIABLE[match.group(1)]
    return field, flag, int(match.group(2))


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def _default_user_agent() -> str:
    return f"nsqworker/{__version__}"


def _ms(seconds: float) -> int:
    # -1 disables a feature in nsqd; keep it as is rather than -1000.
    return -1 if seconds < 0 else round(seconds * 1000)


@dataclasses.dataclass(frozen=True)
class ConnectionConfig:
    """What a connection asks of nsqd, and how it dials. Durations are seconds.

    ``output_buffer_size`` / ``output_buffer_timeout`` left at None let nsqd decide;
    -1 disables nsqd's output buffering. ``msg_timeout`` None (the default) uses nsqd's
    ``--msg-timeout``, as go-nsq does; ``heartbeat_interval`` None uses nsqd's default
    (``--client-timeout`` / 2). ``explicit`` names the fields the operator chose: when
    nsqd refuses one of those the connection fails with a ConfigurationError instead of
    falling back to nsqd's default (see :func:`nsqworker.nsq.handshake.connect_adapting`).
    """

    client_id: str = dataclasses.field(default_factory=_short_hostname)
    hostname: str = dataclasses.field(default_factory=socket.getfqdn)
    user_agent: str = dataclasses.field(default_factory=_default_user_agent)
    heartbeat_interval: float | None = 30.0
    msg_timeout: float | None = None
    output_buffer_size: int | None = None
    output_buffer_timeout: float | None = None
    sample_rate: int = 0
    tls_v1: bool = False
    ssl_context: ssl.SSLContext | None = None
    tls_server_name: str | None = None
    compression: str = "none"
    deflate_level: int = 6
    auth_secret: str | None = dataclasses.field(default=None, repr=False)
    # Security (issue 29): lookupd answers over plain HTTP, so an nsqd it lists may be
    # anyone's. Such connections get auth_requires_tls, and AUTH is then only sent over
    # TLS unless lookupd_auth_without_tls (docs/security.md).
    auth_requires_tls: bool = False
    lookupd_auth_without_tls: bool = False
    dial_timeout: float = 5.0
    max_frame_size: int = protocol.DEFAULT_MAX_FRAME_SIZE
    explicit: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ConfigurationError(
                f"compression must be one of {', '.join(COMPRESSIONS)}, got {self.compression!r}"
            )
        if not 0 <= self.sample_rate <= 99:
            raise ConfigurationError(f"sample_rate must be within 0..99, got {self.sample_rate}")
        if not 1 <= self.deflate_level <= 9:
            raise ConfigurationError(f"deflate_level must be within 1..9, got {self.deflate_level}")
        if self.dial_timeout <= 0:
            raise ConfigurationError(f"dial_timeout must be > 0, got {self.dial_timeout}")

    @classmethod
    def from_settings(cls, settings: Any) -> ConnectionConfig:
        """Build a config from :class:`nsqworker.settings.Settings` (missing fields keep
        their defaults)."""
        get = getattr
        kwargs: dict[str, Any] = {
            name: get(settings, name) for name in _SETTINGS if get(settings, name, None) is not None
        }
        secret = get(settings, "auth_secret", None)
        if secret is not None and hasattr(secret, "get_secret_value"):
            secret = secret.get_secret_value()
        kwargs["auth_secret"] = secret or None
        kwargs["lookupd_auth_without_tls"] = bool(get(settings, "lookupd_auth_without_tls", False))
        source = getattr(settings, "source", None)
        if source is not None:
            kwargs["explicit"] = frozenset(
                name for name in _SETTINGS if name in kwargs and source(name) != "default"
            )
        if kwargs.get("tls_v1"):
            kwargs["ssl_context"] = ssl_context(
                get(settings, "tls_ca_file", None),
                get(settings, "tls_cert_file", None),
                get(settings, "tls_key_file", None),
                bool(get(settings, "tls_verify", True)),
            )
        return cls(**kwargs)

    def for_discovered(self) -> ConnectionConfig:
        """This config for an nsqd found through nsqlookupd: AUTH only over TLS, unless
        ``lookupd_auth_without_tls``."""
        if self.tls_v1 or self.lookupd_auth_without_tls or not self.auth_secret:
            return self
        return dataclasses.replace(self, auth_requires_tls=True)

    def identify_body(self) -> dict[str, Any]:
        """The IDENTIFY body this config asks nsqd for."""
        cfg = self
        body: dict[str, Any] = {
            "client_id": cfg.client_id,
            "hostname": cfg.hostname,
            "user_agent": cfg.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": 0
            if cfg.heartbeat_interval is None
            else _ms(cfg.heartbeat_interval),
            "sample_rate": cfg.sample_rate,
            "tls_v1": cfg.tls_v1,
            "deflate": cfg.compression == "deflate",
            "deflate_level": cfg.deflate_level,
            "snappy": cfg.compression == "snappy",
        }
        if cfg.msg_timeout is not None:
            body["msg_timeout"] = _ms(cfg.msg_timeout)
        if cfg.output_buffer_size is not None:
            body["output_buffer_size"] = cfg.output_buffer_size
        # Without buffering (size -1) nsqd ignores the timeout; sending it anyway would
        # only give nsqd a value to refuse (--max-output-buffer-timeout below it).
        if cfg.output_buffer_timeout is not None and cfg.output_buffer_size != -1:
            body["output_buffer_timeout"] = _ms(cfg.output_buffer_timeout)
        return body


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What nsqd answered to IDENTIFY (and AUTH). Durations in seconds.

    The defaults are nsqd v1.3.0's, used when the server answers a plain ``OK``.
    """

    max_rdy_count: int = protocol.DEFAULT_MAX_RDY_COUNT
    version: str = ""
    max_msg_timeout: float = protocol.DEFAULT_MAX_MSG_TIMEOUT_MS / 1000
    msg_timeout: float = 60.0
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 6
    snappy: bool = False
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    max_deflate_level: int = 6
    auth_identity: str | None = None
    auth_identity_url: str | None = None
    auth_permission_count: int = 0

    @classmethod
    def from_identify(cls, data: bytes) -> ServerInfo:
        """Parse IDENTIFY's answer: ``OK`` or the feature-negotiation JSON."""
        if data == protocol.OK:
            return cls()
        try:
            info = json.loads(data)
            known = {field.name for field in dataclasses.fields(cls)}
            values = {key: value for key, value in info.items() if key in known}
            for key in _MS_FIELDS:
                if key in values:
                    values[key] = values[key] / 1000
            return cls(**values)
        except (ValueError, TypeError, AttributeError) as exc:
            raise RemoteProtocolError(f"unreadable IDENTIFY answer {data[:200]!r}") from exc
