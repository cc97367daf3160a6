"""The settings of the brokers other than NSQ, declared here to keep ``settings.py`` short.

:class:`NatsSettings` is a base of :class:`nsqworker.settings.Settings`: its fields are
ordinary settings (``nats_servers`` is ``NSQWORKER_NATS_SERVERS``), listed after NSQ's.
"""

from __future__ import annotations

import ssl
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, FilePath, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode

from nsqworker.setting_values import check_host, check_port, split_list

__all__ = [
    "BROKER_SECRETS",
    "NatsSettings",
    "StreamSettings",
    "nats_server",
    "stream_endpoint",
    "stream_uri",
    "tls_context",
]

BROKER_SECRETS = frozenset({"nats_password", "nats_token", "nats_nkey_seed", "rabbitmq_stream_uri"})
"""Fields shown as ``********`` in problems and tables."""


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


def stream_uri(text: str) -> str:
    """Check a RabbitMQ stream URI: ``rabbitmq-stream://user:password@host:5552/vhost``
    (``rabbitmq-stream+tls://`` for TLS); the problem never shows the password."""
    text = text.strip()
    url = urlsplit(text)
    if url.scheme not in ("rabbitmq-stream", "rabbitmq-stream+tls") or not url.hostname:
        raise ValueError(
            "must be rabbitmq-stream://user:password@host:5552/vhost (or rabbitmq-stream+tls://)"
        )
    if url.query or url.fragment:
        raise ValueError("leave out the query and fragment of the URI")
    try:
        url.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None
    check_host(url.hostname if ":" not in url.hostname else f"[{url.hostname}]")
    return text


def stream_endpoint(uri: str) -> tuple[str, int]:
    """``(host, port)`` of a stream URI (5552 when it names none)."""
    url = urlsplit(uri)
    return url.hostname or "127.0.0.1", url.port or 5552


NatsServers = Annotated[list[Annotated[str, AfterValidator(nats_server)]], NoDecode]


class NatsSettings(BaseSettings):
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


class StreamSettings(BaseSettings):
    """RabbitMQ Streams (``transport="rabbitmq-stream"``); see docs/rabbitmq-streams.md."""

    rabbitmq_stream_uri: SecretStr = Field(
        SecretStr("rabbitmq-stream://guest:guest@127.0.0.1:5552/"),
        description="rabbitmq-stream://user:password@host:5552/vhost; never printed.",
    )
    rabbitmq_stream_max_age: float = Field(
        7 * 86400.0,
        ge=0,
        le=10 * 365 * 86400.0,
        description="Seconds a created stream keeps messages; 0 = no limit. [0..315360000]",
    )
    rabbitmq_stream_max_length_bytes: int = Field(
        0, ge=0, le=2**62, description="Bytes a created stream keeps; 0 = no limit."
    )
    rabbitmq_stream_segment_bytes: int = Field(
        0, ge=0, le=2**31, description="Segment size of a created stream; 0 = the server's."
    )
    rabbitmq_stream_create: bool = Field(
        True,
        description="Create a missing stream (the topic's and its retry streams); off: each"
        " must exist (an operator's), and a missing one is an error at start.",
    )

    @field_validator("rabbitmq_stream_uri")
    @classmethod
    def _check_stream_uri(cls, value: SecretStr) -> SecretStr:
        try:
            stream_uri(value.get_secret_value())
        except ValueError as exc:  # the message names the rule, never the value
            raise ValueError(str(exc)) from None
        return value


def tls_context(settings: Any) -> ssl.SSLContext:
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
