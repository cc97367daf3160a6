"""The console section: the settings of ``nsqworker console``
(:mod:`nsqworker.admin.console`), ordinary ``console_*`` settings of
:class:`nsqworker.settings.Settings`."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from nsqworker.settings.base import SettingsBase
from nsqworker.settings.values import split_list

__all__ = ["MIN_TOKEN_LENGTH", "ConsoleSettings", "proxy_address", "worker_url"]

MIN_TOKEN_LENGTH = 16


def worker_url(text: str) -> str:
    """Check a worker's health URL: ``http://host:port`` of ``nsqworker run`` (a bare
    ``host:port`` gets ``http://``); the path, if any, is dropped."""
    text = text.strip()
    url = urlsplit(text if "://" in text else f"http://{text}")
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError("must be http://host:port, the health server of nsqworker run")
    try:
        url.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None
    return f"{url.scheme}://{url.netloc}"


WorkerUrls = Annotated[list[Annotated[str, AfterValidator(worker_url)]], NoDecode]


def proxy_address(text: str) -> str:
    """Check one entry of ``console_forwarded_allow_ips``: an IP address, a CIDR network
    (``10.0.0.0/8``) or ``*`` (any peer)."""
    text = text.strip()
    if text == "*":
        return text
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise ValueError("must be an IP address, a network such as 10.0.0.0/8, or *") from None


ProxyAddresses = Annotated[list[Annotated[str, AfterValidator(proxy_address)]], NoDecode]


class ConsoleSettings(SettingsBase):
    """``nsqworker console`` (docs/operations.md, Console; docs/security.md)."""

    console_token: SecretStr | None = Field(
        None,
        description="Token that allows the console's actions (replay, purge); unset: the "
        f"console is read-only. At least {MIN_TOKEN_LENGTH} characters; never printed.",
    )
    console_host: str = Field(
        "127.0.0.1", min_length=1, description="Address the console listens on."
    )
    console_port: int = Field(8081, ge=1, le=65535, description="Console port. [1..65535]")
    console_workers: WorkerUrls = Field(
        default_factory=list,
        description="Health URLs (http://host:port) of the nsqworker run processes to show.",
    )
    console_kubernetes_selector: str | None = Field(
        None, description="Label selector of worker pods to show (with the Kubernetes API)."
    )
    console_kubernetes_namespace: str | None = Field(
        None, description="Namespace of those pods; unset: the console's own (in a pod)."
    )
    console_worker_port: int = Field(
        8080,
        ge=1,
        le=65535,
        description="Health port of pods with no container port named health. [1..65535]",
    )
    console_poll_interval: float = Field(
        2.0, ge=0.2, le=60.0, description="Seconds between the console's reads. [0.2..60]"
    )
    console_session_ttl: float = Field(
        43200.0,
        ge=1.0,
        le=604800.0,
        description="Seconds a console sign-in lasts before the token must be entered "
        "again (12 hours). [1..604800]",
    )
    console_forwarded_allow_ips: ProxyAddresses = Field(
        default_factory=list,
        description="Proxies in front of the console (IP addresses, networks such as "
        "10.0.0.0/8, or *) whose X-Forwarded-Proto it believes: https from one of them "
        "makes the session cookie Secure. Empty: none is believed.",
    )
    console_dead_letter_topics: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Dead-letter topics the console may read besides those its workers'"
        " tasks declare (no other name is ever read).",
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator(
        "console_workers", "console_dead_letter_topics", "console_forwarded_allow_ips",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _console_list(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator(
        "console_token", "console_kubernetes_selector", "console_kubernetes_namespace",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _console_empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("console_token")
    @classmethod
    def _console_token_long(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"must be at least {MIN_TOKEN_LENGTH} characters (a guessable "
                "token lets anyone who reaches the console replay and purge)"
            )
        return value
