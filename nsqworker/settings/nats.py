"""The NATS JetStream section: servers, credentials, and the streams and consumers the
worker creates. The NATS transport (:mod:`nsqworker.nats`) takes :class:`NatsSettings`,
which holds these fields and the core ones (:mod:`nsqworker.settings.core`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, FilePath, SecretStr, field_validator
from pydantic_settings import NoDecode

from nsqworker.settings.core import CoreSettings
from nsqworker.settings.values import check_host, check_port, split_list

__all__ = ["NatsSettings", "nats_server"]


def nats_server(text: str) -> str:
    """Check a NATS server URL: ``nats://host:port`` or ``tls://host:port`` (a bare
    ``host:port`` gets ``nats://``); credentials belong in their own settings."""
    text = text.strip()
    url = urlsplit(text if "://" in text else f"nats://{text}")
    if url.scheme not in ("nats", "tls") or not url.hostname:
        raise ValueError("must be nats://host:port (or tls://), like nats://127.0.0.1:4222")
    if url.username or url.password:
        raise ValueError("leave the user and password out of the URL: set nats_user/nats_password")
    if url.path not in ("", "/") or url.query or url.fragment:
        raise ValueError("must be nats://host:port, without a path or query")
    host = url.netloc
    name, sep, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    check_host(name if sep else host)
    if sep:
        check_port(port)
    else:
        host += ":4222"
    return f"{url.scheme}://{host}"


NatsServers = Annotated[list[Annotated[str, AfterValidator(nats_server)]], NoDecode]


class NatsSettings(CoreSettings):
    """NATS JetStream (``transport="nats"``); see docs/nats.md."""

    nats_servers: NatsServers = Field(
        default_factory=list,
        description="NATS servers, nats://host:port; the cluster announces the others.",
    )
    nats_user: str | None = Field(None, description="NATS user (with nats_password).")
    nats_password: SecretStr | None = Field(None, description="NATS password; never printed.")
    nats_token: SecretStr | None = Field(None, description="NATS token; never printed.")
    nats_nkey_seed: SecretStr | None = Field(None, description="NATS nkey seed; never printed.")
    nats_creds_file: FilePath | None = Field(
        None, description="NATS credentials file (JWT and nkey seed)."
    )
    nats_stream: str | None = Field(
        None, description="Stream for the tasks' subjects; unset: the one covering the subject."
    )
    nats_stream_replicas: int = Field(
        1, ge=1, le=5, description="Replicas of a stream the worker creates. [1..5]"
    )
    nats_stream_max_age: float = Field(
        7 * 86400.0,
        ge=0,
        le=10 * 365 * 86400.0,
        description="Seconds a created stream keeps messages; 0 = no limit. [0..315360000]",
    )
    nats_stream_retention: Literal["limits", "interest"] = Field(
        "limits", description="Retention of a created stream: limits or interest."
    )
    nats_max_ack_pending: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="Unacked messages of a channel's consumer, all workers together. [1..1000000]",
    )
    nats_create: bool = Field(
        True,
        description="Create a missing stream or consumer; off: each must exist (an"
        " operator's), and a missing one is an error at start.",
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("nats_servers", mode="before")
    @classmethod
    def _nats_list(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("nats_servers")
    @classmethod
    def _nats_dedupe(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator(
        "nats_user", "nats_password", "nats_token", "nats_nkey_seed", "nats_creds_file",
        "nats_stream", mode="before",
    )  # fmt: skip
    @classmethod
    def _nats_empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value
