"""The worker section: the task layer's defaults (flow, retries, backoff, time limits),
the worker processes (`nsqworker run`), health, logs, and what a hostile message may cost.

No transport reads these: they are the task layer's policy (docs/tasks.md). Retries are
``retry_delay``, ``retry_multiplier`` and ``max_retry_delay``; their old names
(``requeue_delay``...) still work, with a deprecation line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator

from nsqworker.settings.base import Seconds, SettingsBase, bounded, renamed_attribute

__all__ = ["DEFAULT_TYPED_BODY_MAX_BYTES", "WorkerSettings"]

DEFAULT_TYPED_BODY_MAX_BYTES = 1_048_576
"""1 MiB: nsqd's default --max-msg-size, so by default only a raised broker limit meets it."""


class WorkerSettings(SettingsBase):
    """The task layer's numbers and the worker processes; docs/tasks.md, docs/running.md."""

    RENAMED: ClassVar[dict[str, str]] = {
        "requeue_delay": "retry_delay",
        "requeue_multiplier": "retry_multiplier",
        "max_requeue_delay": "max_retry_delay",
    }

    # -- processes and flow control
    workers: int = bounded(1, 1, 256, "Worker processes under `nsqworker run`.")
    max_in_flight: int = bounded(
        100, 1, 1_000_000, "Default messages in flight per task, spread over its connections."
    )
    max_attempts: int = bounded(
        5, 1, 65535, "Default deliveries before a message goes to the dead-letter hooks."
    )
    # -- retries and consumer backoff
    retry_delay: Seconds = bounded(5.0, 0, 3600, "Seconds of the first retry after a failure.")
    retry_multiplier: float = bounded(
        2.0, 1, 100, "Growth of the retry delay per attempt: retry_delay * m**(attempts - 1)."
    )
    max_retry_delay: Seconds = bounded(
        900.0, 0, 3600, "Cap on the retry delay; a broker may cap it lower (nsqd: one hour)."
    )
    backoff_multiplier: Seconds = bounded(
        1.0, 0, 3600, "Seconds of the first consumer backoff pause, doubled per level; 0 = off."
    )
    max_backoff_duration: Seconds = bounded(120.0, 0, 3600, "Cap on the backoff pause.")
    # -- stopping, health, logs
    uvloop: bool = Field(
        True, description="Run workers on uvloop when it is installed (the uvloop extra)."
    )
    watchdog_timeout: Seconds = bounded(
        10.0,
        0,
        3600,
        "Seconds a worker's event loop may be blocked before /livez fails and the blocking"
        " stack is logged once; 0 = no watchdog.",
    )
    max_memory_per_child: int = bounded(
        0,
        0,
        1_048_576,
        "MiB of resident memory after which `nsqworker run` replaces a worker process,"
        " once it has finished its in-flight messages; 0 = no limit.",
    )
    max_tasks_per_child: int = bounded(
        0,
        0,
        1_000_000_000,
        "Messages a worker process handles before `nsqworker run` replaces it, once it"
        " has drained; 0 = no limit.",
    )
    slow_handler_after: Seconds = bounded(
        60.0,
        0.1,
        86400,
        "Seconds a handler may run before a warning says so, once per message (or 10x"
        " the task's p99 handler duration, if that is longer); /inflight lists them all.",
    )
    task_timeout: Seconds | None = bounded(
        None,
        0.001,
        7 * 86400,
        "Seconds a handler may run before its message is retried (an attempt counted);"
        " a task's timeout= overrides it; unset = no limit (docs/tasks.md, Time limits).",
    )
    drain_timeout: Seconds = bounded(
        30.0, 0, 86400, "Seconds a stop waits for running handlers before returning their messages."
    )
    health_port: int = bounded(8080, 0, 65535, "Port of /livez /readyz /metrics; 0 = off.")
    health_host: str = Field(
        "127.0.0.1", min_length=1, description="Address health binds; 0.0.0.0: every address."
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="Lowest level logged: debug, info, warning, error or critical."
    )
    log_format: Literal["auto", "console", "json"] = Field(
        "auto", description="console or json; auto is console on a terminal, else json."
    )
    log_summary_interval: Seconds = bounded(
        60.0, 0, 86400, "Seconds between each task's info summary line (while busy); 0 = off."
    )
    # -- what a hostile message may cost (docs/tasks.md: Typed bodies, Time limits)
    typed_body_max_bytes: int = Field(
        DEFAULT_TYPED_BODY_MAX_BYTES,
        ge=0,
        le=2**31,
        description="Largest body (bytes) validated into a handler's typed parameter; a larger"
        " one is dead-lettered, its reason naming this setting; 0 = no cap. [0..2147483648]",
    )
    timeout_action: Literal["retry", "dead_letter", "abandon"] = Field(
        "retry",
        description="What a handler past its time limit does (a task's timeout_action="
        " overrides it): retry (an attempt counted; a sync handler's process is replaced),"
        " dead_letter (at the first time limit), abandon (as retry, but a sync handler's"
        " thread is left running and the process kept); docs/tasks.md, Time limits.",
    )
    max_abandoned_threads: int = bounded(
        10,
        0,
        10_000,
        "Sync handlers' threads a worker process may leave running past their time limit"
        " (timeout_action abandon); past it, the process is replaced as with retry.",
    )
    timeout_dead_letter_attempts: int = Field(
        0,
        ge=0,
        le=65535,
        description="A handler past its time limit on this delivery of its message or a later"
        " one dead-letters the message instead of retrying it (2: a message that times out on"
        " a retry is not tried again); 0 = retried like any failure. [0..65535]",
    )

    # The old names, read-only (DeprecationWarning): Settings().requeue_delay still works.
    requeue_delay = renamed_attribute("requeue_delay", "retry_delay")
    requeue_multiplier = renamed_attribute("requeue_multiplier", "retry_multiplier")
    max_requeue_delay = renamed_attribute("max_requeue_delay", "max_retry_delay")

    if TYPE_CHECKING:  # every field has a default; type checkers see each base's fields

        def __init__(self, **values: Any) -> None: ...

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            return "warning" if value == "warn" else value
        return value

    def _section_conflicts(self) -> Iterator[tuple[str, str, Any]]:
        yield from self._ordered("retry_delay", "max_retry_delay")
