"""The RabbitMQ Streams section: where the server is (``rabbitmq_stream_uri``) and the
streams the worker creates. The Streams transport (:mod:`nsqworker.streams`) takes
:class:`StreamSettings`, which holds these fields and the core ones
(:mod:`nsqworker.settings.core`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from nsqworker.settings.core import CoreSettings
from nsqworker.settings.values import check_host

__all__ = ["StreamSettings", "stream_endpoint", "stream_uri"]


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


class StreamSettings(CoreSettings):
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

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("rabbitmq_stream_uri")
    @classmethod
    def _check_stream_uri(cls, value: SecretStr) -> SecretStr:
        try:
            stream_uri(value.get_secret_value())
        except ValueError as exc:  # the message names the rule, never the value
            raise ValueError(str(exc)) from None
        return value
