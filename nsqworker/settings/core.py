"""The core section: the settings every transport and feature may read (which broker,
who we are to it, how long to dial and when to reconnect, TLS files, tracing).

A transport's own section (:mod:`nsqworker.settings.nsq`, ``.nats``, ``.streams``)
inherits this one; the task layer's numbers are :mod:`nsqworker.settings.worker`'s.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, FilePath, field_validator

from nsqworker.settings.base import Seconds, SettingsBase, bounded

__all__ = ["CoreSettings", "tls_context"]

_CERT_KEY = ("tls_cert_file", "tls_key_file")


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class CoreSettings(SettingsBase):
    """Which broker, and what every transport's connection and tracing share."""

    # -- which broker (docs/transports.md)
    transport: str = Field(
        "nsq",
        min_length=1,
        description="The broker: nsq (default), nats, rabbitmq-stream or memory (tests).",
    )
    # -- connecting
    reconnect_delay: Seconds = bounded(
        1.0, 0.01, 3600, "Seconds before reconnecting to a direct nsqd; doubles per failure."
    )
    max_reconnect_delay: Seconds = bounded(60.0, 0.01, 3600, "Cap on the reconnect delay.")
    dial_timeout: Seconds = bounded(5.0, 0.01, 300, "Seconds to connect and IDENTIFY.")
    msg_timeout: Seconds | None = bounded(
        None,
        1,
        900,
        "Seconds before nsqd redelivers; unset = nsqd's --msg-timeout (60 s by default)."
        " A value above nsqd's --max-msg-timeout fails at start.",
    )
    client_id: str = Field(
        default_factory=_short_hostname, min_length=1, description="IDENTIFY client_id."
    )
    # -- TLS files (NSQ turns TLS on with tls_v1; NATS and RabbitMQ by their URL's scheme)
    tls_ca_file: FilePath | None = Field(None, description="CA bundle; system CAs if unset.")
    tls_cert_file: FilePath | None = Field(None, description="Client certificate (with key).")
    tls_key_file: FilePath | None = Field(None, description="Client private key (with cert).")
    tls_verify: bool = Field(True, description="Verify nsqd's certificate; off only in tests.")
    # -- tracing (nsqworker.telemetry)
    tracing_envelope: bool = Field(
        False, description="Producers wrap bodies in an envelope carrying trace context."
    )
    trace_parent_mode: Literal["link", "parent"] = Field(
        "link", description="Consumer span links to the producer's, or is its child (parent)."
    )
    trace_trust_remote: bool = Field(False, description="Trust envelopes' sampled flag, baggage.")

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("transport", mode="before")
    @classmethod
    def _known_transport(cls, value: Any) -> Any:
        from nsqworker.transport import transport_names

        if isinstance(value, str):
            value = value.strip().lower()
            if value not in transport_names():
                names = ", ".join(transport_names())
                raise ValueError(f"is not a transport; the transports are {names}")
        return value

    @field_validator("trace_parent_mode", mode="before")
    @classmethod
    def _lower_mode(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file", mode="before")
    @classmethod
    def _empty_file_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def _section_conflicts(self) -> Iterator[tuple[str, str, Any]]:
        yield from self._ordered("reconnect_delay", "max_reconnect_delay")
        for given, needed in (_CERT_KEY, _CERT_KEY[::-1]):
            if getattr(self, given) is not None and getattr(self, needed) is None:
                yield (
                    given,
                    f"needs {needed} too; set {self.env_name(needed)}",
                    str(getattr(self, given)),
                )


def tls_context(settings: CoreSettings) -> ssl.SSLContext:
    """A client TLS context from the ``tls_*`` settings (CA, client certificate and key,
    verification), for the brokers other than NSQ."""
    context = ssl.create_default_context(
        cafile=str(settings.tls_ca_file) if settings.tls_ca_file else None
    )
    if settings.tls_cert_file and settings.tls_key_file:
        context.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
    if not settings.tls_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
