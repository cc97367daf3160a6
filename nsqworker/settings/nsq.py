"""The NSQ section: where nsqd and nsqlookupd are, what IDENTIFY asks of nsqd, TLS and
AUTH. The NSQ transport (:mod:`nsqworker.nsq`) takes :class:`NsqSettings`, which holds
these fields and the core ones (:mod:`nsqworker.settings.core`), and nothing else.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from nsqworker.settings.base import Seconds, bounded
from nsqworker.settings.core import CoreSettings
from nsqworker.settings.values import (
    ReplyAddresses,
    lookupd_address,
    nsqd_address,
    split_list,
)

__all__ = ["NsqSettings"]

NsqdAddresses = Annotated[list[Annotated[str, AfterValidator(nsqd_address)]], NoDecode]
LookupdAddresses = Annotated[list[Annotated[str, AfterValidator(lookupd_address)]], NoDecode]
_TLS_ONLY = ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name")


@cache
def _fqdn() -> str:
    return socket.getfqdn() or "localhost"


class NsqSettings(CoreSettings):
    """NSQ (``transport="nsq"``, the default); docs/consumer.md, docs/security.md."""

    # -- where the brokers are
    nsqd_tcp_addresses: NsqdAddresses = Field(
        default_factory=list, description="nsqd TCP addresses to connect to directly (host:port)."
    )
    lookupd_http_addresses: LookupdAddresses = Field(
        default_factory=list, description="nsqlookupd http(s)://host:port addresses to poll."
    )
    lookupd_poll_interval: Seconds = bounded(60.0, 0.05, 3600, "Seconds between lookupd polls.")
    lookupd_poll_jitter: float = bounded(0.3, 0, 1, "Poll jitter, a fraction of the interval.")
    # -- asked of nsqd in IDENTIFY
    heartbeat_interval: Seconds = bounded(30.0, 1, 60, "Seconds between nsqd heartbeats.")
    output_buffer_size: int | None = bounded(
        None,
        -1,
        65536,
        "Bytes nsqd buffers before writing to us. Unset (default): adaptive, each message"
        " written at once while the rate is low, and a second, buffered connection to the"
        " same nsqd under load; -1: always at once (lowest latency); 16384 with a timeout"
        " of 0.25: nsqd's own batching (highest throughput).",
    )
    output_buffer_timeout: Seconds = bounded(
        0.25,
        0.025,
        30,
        "Seconds nsqd may hold buffered data; lower = less latency, more CPU. When"
        " output_buffer_size is unset, the buffered connection uses 0.025 unless this is set.",
    )
    sample_rate: int = bounded(0, 0, 99, "Percent of messages nsqd sends us; 0 sends all.")
    compression: Literal["none", "deflate", "snappy"] = Field(
        "none", description="Wire compression: none, deflate or snappy (needs python-snappy)."
    )
    deflate_level: int = bounded(6, 1, 9, "Deflate level when compression is deflate.")
    hostname: str = Field(default_factory=_fqdn, min_length=1, description="IDENTIFY hostname.")
    # -- TLS and AUTH
    tls_v1: bool = Field(False, description="Upgrade connections to TLS.")
    tls_server_name: str | None = Field(None, description="Name in nsqd's cert; host if unset.")
    auth_secret: SecretStr | None = Field(None, description="AUTH secret; never printed.")
    lookupd_allowed_nsqd: ReplyAddresses = Field(
        default_factory=list, description="host:port patterns of the nsqd taken from lookupd."
    )
    lookupd_auth_without_tls: bool = Field(
        False, description="Send AUTH to nsqd found through lookupd over plain TCP, not only TLS."
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator(
        "nsqd_tcp_addresses", "lookupd_http_addresses", "lookupd_allowed_nsqd", mode="before"
    )
    @classmethod
    def _nsq_list(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("nsqd_tcp_addresses", "lookupd_http_addresses")
    @classmethod
    def _dedupe(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator("compression", mode="before")
    @classmethod
    def _lower_compression(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("tls_server_name", "auth_secret", mode="before")
    @classmethod
    def _nsq_empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("output_buffer_size")
    @classmethod
    def _check_buffer(cls, value: int | None) -> int | None:
        if value is not None and 0 <= value < 64:
            raise ValueError("must be -1 (no buffering) or from 64 to 65536")
        return value

    def _section_conflicts(self) -> Iterator[tuple[str, str, Any]]:
        for name in _TLS_ONLY if not self.tls_v1 and self.transport == "nsq" else ():
            if (value := getattr(self, name)) is not None:
                yield name, "needs tls_v1; set NSQWORKER_TLS_V1=true or unset this one", str(value)
