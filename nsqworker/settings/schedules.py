"""The schedules section: periodic tasks (``@task(schedule=...)``), a base of ``Settings``.

Every field is an ordinary setting: ``schedule_leader`` is ``NSQWORKER_SCHEDULE_LEADER``.
The lease timings default to client-go's leader election (lease 15 s, renew deadline
10 s, retry 2 s); tests shorten them. docs/schedules.md explains each.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from nsqworker.settings.base import SettingsBase

__all__ = ["LEADERS", "ScheduleSettings", "postgres_dsn", "timing_problems"]

LEADERS = ("kubernetes", "nats", "postgres", "none")
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_BUCKET = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ScheduleSettings(SettingsBase):
    """Periodic tasks: who fires them and how a new leader catches up; docs/schedules.md."""

    schedule_leader: Literal["kubernetes", "nats", "postgres", "none"] | None = Field(
        None,
        description="Who fires schedules: kubernetes (a Lease), nats (a JetStream KV bucket),"
        " postgres (a row in schedule_postgres_dsn's database) or none (this process); unset:"
        " kubernetes in a pod with a service account, else none.",
    )
    schedule_lease_name: str | None = Field(
        None,
        description="Name of the Lease (or KV key) schedules elect their leader with;"
        " unset: nsqworker-schedules-<tasks module>.",
    )
    kubernetes_namespace: str | None = Field(
        None,
        description="Namespace of the Lease; unset: the pod's service-account namespace,"
        " else the kubeconfig context's, else default.",
    )
    schedule_lease_duration: float = Field(
        15.0,
        ge=0.5,
        le=3600,
        description="Seconds a leader's lease lasts without renewal before another takes"
        " over (client-go: 15). [0.5..3600]",
    )
    schedule_renew_deadline: float = Field(
        10.0,
        ge=0.2,
        le=3600,
        description="Seconds after its last renewal began that a leader stops firing;"
        " below schedule_lease_duration (client-go: 10). [0.2..3600]",
    )
    schedule_retry_period: float = Field(
        2.0,
        ge=0.05,
        le=600,
        description="Seconds between renewals, and between a follower's tries (client-go:"
        " 2). [0.05..600]",
    )
    schedule_catchup: float = Field(
        3600.0,
        ge=0,
        le=7 * 86400,
        description="Seconds back a new leader fires the ticks nobody fired; older ones"
        " are skipped and logged (0: none; a tick found under 1 s late is on time)."
        " [0..604800]",
    )
    schedule_kv_bucket: str = Field(
        "nsqworker_schedules",
        description="JetStream key-value bucket of the nats leader (created if missing).",
    )
    schedule_postgres_dsn: SecretStr | None = Field(
        None,
        description="PostgreSQL of the postgres leader: postgresql://user:password@host:5432/db"
        " or key=value pairs (libpq's); never printed.",
    )

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator(
        "schedule_leader", "schedule_lease_name", "kubernetes_namespace", mode="before"
    )
    @classmethod
    def _schedule_empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            return value.lower() if info.field_name == "schedule_leader" else value
        return value

    @field_validator("schedule_lease_name")
    @classmethod
    def _check_lease_name(cls, value: str | None) -> str | None:
        if value is not None and not re.match(_DNS_NAME, value):
            raise ValueError(
                "must be a Kubernetes object name: lower-case letters, digits, - and ., "
                "starting and ending with a letter or digit, at most 253 characters"
            )
        return value

    @field_validator("kubernetes_namespace")
    @classmethod
    def _check_namespace(cls, value: str | None) -> str | None:
        if value is not None and not re.match(_NAMESPACE, value):
            raise ValueError(
                "must be a namespace name: lower-case letters, digits and -, starting and "
                "ending with a letter or digit, at most 63 characters"
            )
        return value

    @field_validator("schedule_postgres_dsn", mode="before")
    @classmethod
    def _postgres_dsn_empty_is_unset(cls, value: Any) -> Any:
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("schedule_postgres_dsn")
    @classmethod
    def _check_postgres_dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            postgres_dsn(value.get_secret_value())  # the message never shows the value
        return value

    @field_validator("schedule_kv_bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        if not _BUCKET.match(value):
            raise ValueError("must be 1-64 letters, digits, - or _ (a JetStream bucket name)")
        return value


def postgres_dsn(text: str) -> str:
    """Check a libpq connection string, ``postgresql://user:password@host:5432/db`` or
    ``host=... dbname=...``; the problem names the rule, never the value (a password)."""
    if "://" in text:
        url = urlsplit(text)
        if url.scheme not in ("postgresql", "postgres"):
            raise ValueError("a URL must start with postgresql:// (or postgres://)")
        try:
            url.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ValueError("the port must be a number from 1 to 65535") from None
        return text
    if not re.match(r"^\s*[A-Za-z_]+\s*=", text):
        raise ValueError(
            "must be postgresql://user:password@host:5432/dbname or key=value pairs"
            " (host=db.example dbname=app user=app)"
        )
    return text


def timing_problems(settings: Any) -> list[str]:
    """What is wrong with the lease timings together (checked when a supervisor has
    scheduled tasks, so settings without schedules never fail on them)."""
    problems = []
    if not settings.schedule_retry_period < settings.schedule_renew_deadline:
        problems.append(
            f"schedule_retry_period ({settings.schedule_retry_period:g}) must be below "
            f"schedule_renew_deadline ({settings.schedule_renew_deadline:g}), so that a "
            "leader renews before it stops firing"
        )
    if not settings.schedule_renew_deadline < settings.schedule_lease_duration:
        problems.append(
            f"schedule_renew_deadline ({settings.schedule_renew_deadline:g}) must be below "
            f"schedule_lease_duration ({settings.schedule_lease_duration:g}), so that a "
            "leader stops firing before another may take over"
        )
    return problems
