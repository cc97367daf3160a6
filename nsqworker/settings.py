"""Settings: every tunable declared once, with its default, bounds and meaning.

Values come from, highest precedence first: keyword overrides (``Settings.load(**kw)`` or
``Settings(**kw)``), ``NSQWORKER_*`` environment variables, a config file (TOML, JSON or
dotenv), then the defaults below. Durations are float seconds. List fields take a JSON
list or a comma-separated string in the environment. Anything unknown or invalid raises
``SettingsError``, one line per problem, each naming the field and where its value came
from: the argument (``Settings(workers=...)``, or the command-line flag when the CLI says
so), the environment variable, or the config file.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

import annotated_types
from pydantic import (
    AfterValidator,
    Field,
    FilePath,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from nsqworker.broker_settings import BROKER_SECRETS, NatsSettings, StreamSettings
from nsqworker.config_files import (
    ENV_PREFIX,
    RESERVED_ENV_VARS,
    did_you_mean,
    file_label,
    read_config_file,
    unknown_env_vars,
)
from nsqworker.console_settings import CONSOLE_SECRETS
from nsqworker.errors import ConfigurationError
from nsqworker.feature_settings import FeatureSettings
from nsqworker.setting_values import (
    app_uri_pattern,
    lookupd_address,
    nsqd_address,
    reply_address_pattern,
    reply_pattern,
    split_list,
)

__all__ = ["ENV_PREFIX", "RESERVED_ENV_VARS", "Settings", "SettingsError"]

MASK = "********"
_SECRET_FIELDS = frozenset({"auth_secret"}) | BROKER_SECRETS | CONSOLE_SECRETS
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
# Field names found in the config file being loaded; read by _FileSource.
_FILE_VALUES: ContextVar[Mapping[str, Any] | None] = ContextVar("nsqw_file", default=None)
# How the config file being loaded names a field in problems: "workers in config file x.toml".
_FILE_LABEL: ContextVar[str | None] = ContextVar("nsqw_file_label", default=None)
# How the caller of Settings.load spells each override, e.g. {"log_format": "--log-format"}.
_OVERRIDE_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("nsqw_names", default=None)

Seconds = float
_ORDERED = (("requeue_delay", "max_requeue_delay"), ("reconnect_delay", "max_reconnect_delay"))
_CERT_KEY = ("tls_cert_file", "tls_key_file")
_TLS_ONLY = ("tls_ca_file", "tls_cert_file", "tls_key_file", "tls_server_name")


class SettingsError(ConfigurationError):
    """Raised when settings are unknown or invalid; ``str()`` has one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def from_validation_error(
        cls, exc: ValidationError, overrides: Iterable[str] = ()
    ) -> SettingsError:
        """Turn pydantic's errors into ``<origin> (<field>): <problem>; got <value>`` lines.

        The origin is where the value came from: an argument in ``overrides`` (or the CLI
        flag the caller named for it), an ``NSQWORKER_*`` variable, or the config file.
        """
        given = frozenset(overrides)
        lines: list[str] = []
        for err in exc.errors():
            ctx = err.get("ctx") or {}
            if err["type"] == "settings_conflict":
                lines += [_problem(f, msg, v, given) for f, msg, v in ctx["problems"]]
                continue
            loc = [str(p) for p in err["loc"]]
            field = loc[0] if loc else "?"
            where = field + "".join(f"[{p}]" for p in loc[1:])
            value = MASK if field in _SECRET_FIELDS else err.get("input")
            message = _message(err["type"], err["msg"], field)
            lines.append(_problem(field, message, value, given, where))
        return cls(lines)


def _problem(
    field: str, message: str, value: Any, overrides: frozenset[str], where: str | None = None
) -> str:
    shown = value if value == MASK else _shorten(repr(value))
    origin = _origin(field, overrides)
    where = where or field
    named = where == field and origin.startswith((f"Settings({field}=", f"{field} in "))
    return f"{origin if named else f'{origin} ({where})'}: {message}; got {shown}"


def _origin(field: str, overrides: frozenset[str]) -> str:
    """Where ``field``'s value came from, as the user wrote it."""
    if field in overrides:
        return (_OVERRIDE_NAMES.get() or {}).get(field) or f"Settings({field}=...)"
    env = ENV_PREFIX + field.upper()
    if env in {key.upper() for key in os.environ}:
        return env
    label = _FILE_LABEL.get()
    if label is not None and field in (_FILE_VALUES.get() or {}):
        return label.format(field=field, env=env)
    return env


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message(kind: str, msg: str, field: str) -> str:
    if kind == "extra_forbidden":
        return "is not a setting" + did_you_mean(field, Settings.model_fields)
    bounds = _bounds(field) if kind in ("greater_than_equal", "less_than_equal") else None
    if bounds is not None:
        return f"must be from {_number(bounds[0])} to {_number(bounds[1])}"
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return msg.replace("Input should be", "must be")


def _bounds(field: str) -> tuple[float, float] | None:
    """A field's ``(ge, le)`` bounds as declared in its ``Field``, or None."""
    info = Settings.model_fields.get(field)
    metadata = info.metadata if info is not None else []
    low: list[Any] = [m.ge for m in metadata if isinstance(m, annotated_types.Ge)]
    high: list[Any] = [m.le for m in metadata if isinstance(m, annotated_types.Le)]
    return (float(low[0]), float(high[0])) if low and high else None


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@cache
def _fqdn() -> str:
    return socket.getfqdn() or "localhost"


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def _bounded(default: float, ge: float, le: float, doc: str) -> Any:
    """A numeric field with its default, bounds and doc; the bounds end the doc."""
    return Field(default, ge=ge, le=le, description=f"{doc} [{_number(ge)}..{_number(le)}]")


NsqdAddresses = Annotated[list[Annotated[str, AfterValidator(nsqd_address)]], NoDecode]
LookupdAddresses = Annotated[list[Annotated[str, AfterValidator(lookupd_address)]], NoDecode]
ReplyPatterns = Annotated[list[Annotated[str, AfterValidator(reply_pattern)]], NoDecode]
ReplyAddresses = Annotated[list[Annotated[str, AfterValidator(reply_address_pattern)]], NoDecode]
AppUriPatterns = Annotated[list[Annotated[str, AfterValidator(app_uri_pattern)]], NoDecode]


class _FileSource(PydanticBaseSettingsSource):
    """The values of the config file ``Settings.load()`` is reading, below the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_VALUES.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get() or {})


class _CoreSettings(BaseSettings):
    """The settings of the task layer and of NSQ; :class:`Settings` adds other brokers'."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=True
    )
    _sources: dict[str, str] = PrivateAttr(default_factory=dict)

    # -- which broker (docs/transports.md)
    transport: str = Field(
        "nsq",
        min_length=1,
        description="The broker: nsq (default), nats, rabbitmq-stream or memory (tests).",
    )
    # -- where the brokers are: NSQ
    nsqd_tcp_addresses: NsqdAddresses = Field(
        default_factory=list, description="nsqd TCP addresses to connect to directly (host:port)."
    )
    lookupd_http_addresses: LookupdAddresses = Field(
        default_factory=list, description="nsqlookupd http(s)://host:port addresses to poll."
    )
    lookupd_poll_interval: Seconds = _bounded(60.0, 0.05, 3600, "Seconds between lookupd polls.")
    lookupd_poll_jitter: float = _bounded(0.3, 0, 1, "Poll jitter, a fraction of the interval.")
    reconnect_delay: Seconds = _bounded(
        1.0, 0.01, 3600, "Seconds before reconnecting to a direct nsqd; doubles per failure."
    )
    max_reconnect_delay: Seconds = _bounded(60.0, 0.01, 3600, "Cap on the reconnect delay.")
    dial_timeout: Seconds = _bounded(5.0, 0.01, 300, "Seconds to connect and IDENTIFY.")
    # -- processes and flow control
    workers: int = _bounded(1, 1, 256, "Worker processes under `nsqworker run`.")
    max_in_flight: int = _bounded(
        100, 1, 1_000_000, "Default messages in flight per task, spread over its connections."
    )
    max_attempts: int = _bounded(
        5, 1, 65535, "Default deliveries before a message goes to the dead-letter hooks."
    )
    # -- retries and consumer backoff
    requeue_delay: Seconds = _bounded(5.0, 0, 3600, "Seconds of the first REQ after a failure.")
    requeue_multiplier: float = _bounded(
        2.0, 1, 100, "Growth of the REQ delay per attempt: requeue_delay * m**(attempts - 1)."
    )
    max_requeue_delay: Seconds = _bounded(
        900.0, 0, 3600, "Cap on the REQ delay; nsqd allows at most one hour."
    )
    backoff_multiplier: Seconds = _bounded(
        1.0, 0, 3600, "Seconds of the first consumer backoff pause, doubled per level; 0 = off."
    )
    max_backoff_duration: Seconds = _bounded(120.0, 0, 3600, "Cap on the backoff pause.")
    # -- asked of nsqd in IDENTIFY
    msg_timeout: Seconds | None = _bounded(
        None,  # type: ignore[arg-type]
        1,
        900,
        "Seconds before nsqd redelivers; unset = nsqd's --msg-timeout (60 s by default)."
        " A value above nsqd's --max-msg-timeout fails at start.",
    )
    heartbeat_interval: Seconds = _bounded(30.0, 1, 60, "Seconds between nsqd heartbeats.")
    output_buffer_size: int | None = _bounded(
        None,  # type: ignore[arg-type]
        -1,
        65536,
        "Bytes nsqd buffers before writing to us. Unset (default): adaptive, each message"
        " written at once while the rate is low, and a second, buffered connection to the"
        " same nsqd under load; -1: always at once (lowest latency); 16384 with a timeout"
        " of 0.25: nsqd's own batching (highest throughput).",
    )
    output_buffer_timeout: Seconds = _bounded(
        0.25,
        0.025,
        30,
        "Seconds nsqd may hold buffered data; lower = less latency, more CPU. When"
        " output_buffer_size is unset, the buffered connection uses 0.025 unless this is set.",
    )
    sample_rate: int = _bounded(0, 0, 99, "Percent of messages nsqd sends us; 0 sends all.")
    compression: Literal["none", "deflate", "snappy"] = Field(
        "none", description="Wire compression: none, deflate or snappy (needs python-snappy)."
    )
    deflate_level: int = _bounded(6, 1, 9, "Deflate level when compression is deflate.")
    client_id: str = Field(
        default_factory=_short_hostname, min_length=1, description="IDENTIFY client_id."
    )
    hostname: str = Field(default_factory=_fqdn, min_length=1, description="IDENTIFY hostname.")
    # -- TLS and AUTH
    tls_v1: bool = Field(False, description="Upgrade connections to TLS.")
    tls_ca_file: FilePath | None = Field(None, description="CA bundle; system CAs if unset.")
    tls_cert_file: FilePath | None = Field(None, description="Client certificate (with key).")
    tls_key_file: FilePath | None = Field(None, description="Client private key (with cert).")
    tls_server_name: str | None = Field(None, description="Name in nsqd's cert; host if unset.")
    tls_verify: bool = Field(True, description="Verify nsqd's certificate; off only in tests.")
    auth_secret: SecretStr | None = Field(None, description="AUTH secret; never printed.")
    lookupd_allowed_nsqd: ReplyAddresses = Field(
        default_factory=list, description="host:port patterns of the nsqd taken from lookupd."
    )
    lookupd_auth_without_tls: bool = Field(
        False, description="Send AUTH to nsqd found through lookupd over plain TCP, not only TLS."
    )
    # -- stopping, health, logs, tracing
    uvloop: bool = Field(
        True, description="Run workers on uvloop when it is installed (the uvloop extra)."
    )
    watchdog_timeout: Seconds = _bounded(
        10.0,
        0,
        3600,
        "Seconds a worker's event loop may be blocked before /livez fails and the blocking"
        " stack is logged once; 0 = no watchdog.",
    )
    max_memory_per_child: int = _bounded(
        0,
        0,
        1_048_576,
        "MiB of resident memory after which `nsqworker run` replaces a worker process,"
        " once it has finished its in-flight messages; 0 = no limit.",
    )
    max_tasks_per_child: int = _bounded(
        0,
        0,
        1_000_000_000,
        "Messages a worker process handles before `nsqworker run` replaces it, once it"
        " has drained; 0 = no limit.",
    )
    slow_handler_after: Seconds = _bounded(
        60.0,
        0.1,
        86400,
        "Seconds a handler may run before a warning says so, once per message (or 10x"
        " the task's p99 handler duration, if that is longer); /inflight lists them all.",
    )
    task_timeout: Seconds | None = _bounded(
        None,  # type: ignore[arg-type]
        0.001,
        7 * 86400,
        "Seconds a handler may run before its message is retried (an attempt counted);"
        " a task's timeout= overrides it; unset = no limit (docs/tasks.md, Time limits).",
    )
    drain_timeout: Seconds = _bounded(
        30.0, 0, 86400, "Seconds a stop waits for running handlers before returning their messages."
    )
    health_port: int = _bounded(8080, 0, 65535, "Port of /livez /readyz /metrics; 0 = off.")
    health_host: str = Field(
        "127.0.0.1", min_length=1, description="Address health binds; 0.0.0.0: every address."
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        "info", description="Lowest level logged: debug, info, warning, error or critical."
    )
    log_format: Literal["auto", "console", "json"] = Field(
        "auto", description="console or json; auto is console on a terminal, else json."
    )
    log_summary_interval: Seconds = _bounded(
        60.0, 0, 86400, "Seconds between each task's info summary line (while busy); 0 = off."
    )
    tracing_envelope: bool = Field(
        False, description="Producers wrap bodies in an envelope carrying trace context."
    )
    trace_parent_mode: Literal["link", "parent"] = Field(
        "link", description="Consumer span links to the producer's, or is its child (parent)."
    )
    trace_trust_remote: bool = Field(False, description="Trust envelopes' sampled flag, baggage.")
    # -- RPC endpoints (nsqworker.rpc, docs/rpc.md, docs/security.md)
    rpc_reply_addresses: ReplyAddresses = Field(
        default_factory=list, description="More nsqd (host:port patterns) @rpc may reply to."
    )
    rpc_reply_topics: ReplyPatterns = Field(
        default_factory=lambda: ["rpc_*", "rcp-*"],
        description="Topics (patterns) @rpc may reply to.",
    )
    rpc_error_details: bool = Field(
        False, description="RPC error replies carry any exception's type and text (not only ours)."
    )
    # -- Spark jobs (nsqworker.spark, docs/spark.md)
    spark_runner: Literal["local", "kubernetes"] = Field(
        "local", description="Where @spark_task jobs run: local (spark-submit) or kubernetes."
    )
    spark_app_roots: list[str] = Field(
        default_factory=list, description="Directories local Spark apps must be in; default: ."
    )
    spark_app_uris: AppUriPatterns = Field(
        default_factory=lambda: ["local://*"],
        description="App URIs (patterns) the kubernetes runner may run; default: local://*.",
    )
    spark_master: str = Field(
        "local[*]",
        min_length=1,
        pattern=r"^\S+$",
        description="--master of the local runner: local[N], local[*], spark://host:port...",
    )
    spark_namespace: str = Field(
        "default",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description="Namespace of SparkApplications (kubernetes runner).",
    )
    spark_image: str | None = Field(
        None, min_length=1, description="Image of driver and executors (kubernetes runner)."
    )
    spark_service_account: str = Field(
        "spark", min_length=1, description="Service account of the Spark driver (kubernetes)."
    )
    spark_ttl: Seconds = _bounded(
        3600.0, 0, 30 * 86400, "Seconds a finished SparkApplication is kept before removal."
    )

    # -- Spark sessions (@spark_session_task, nsqworker.spark.session, docs/spark.md)
    spark_remote: str | None = Field(
        None, pattern=r"^sc://\S+$", description="Spark Connect server of sessions: sc://host:15002"
    )
    spark_session_start: Literal["first_message", "worker_start"] = Field(
        "first_message", description="When a worker starts its Spark session."
    )
    spark_session_conf: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="Spark conf of the session (spark.* keys)."
    )

    def __init__(self, **values: Any) -> None:
        """Build settings from ``values``, the environment and defaults; see ``load``."""
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError.from_validation_error(exc, values) from exc
        env = {key.upper() for key in os.environ}
        file_values = _FILE_VALUES.get() or {}
        for name in type(self).model_fields:
            source = "default"
            if name in values:
                source = "override"
            elif self.env_name(name) in env:
                source = "env"
            elif name in file_values:
                source = "file"
            self._sources[name] = source

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Overrides, then the environment, then the config file being loaded."""
        return init_settings, env_settings, _FileSource(settings_cls)

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

    @field_validator(
        "nsqd_tcp_addresses",
        "lookupd_http_addresses",
        "rpc_reply_addresses",
        "rpc_reply_topics",
        "lookupd_allowed_nsqd",
        "spark_app_uris",
        mode="before",
    )
    @classmethod
    def _parse_list(cls, value: Any) -> Any:
        return split_list(value)

    @field_validator("nsqd_tcp_addresses", "lookupd_http_addresses")
    @classmethod
    def _dedupe(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator("log_level", "log_format", "compression", "trace_parent_mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            return "warning" if value == "warn" else value
        return value

    @field_validator(*_TLS_ONLY, "auth_secret", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("output_buffer_size")
    @classmethod
    def _check_buffer(cls, value: int | None) -> int | None:
        if value is not None and 0 <= value < 64:
            raise ValueError("must be -1 (no buffering) or from 64 to 65536")
        return value

    @model_validator(mode="after")
    def _check_together(self) -> Self:
        problems = tuple(self._conflicts())
        if problems:
            summary = "; ".join(f"{field} {message}" for field, message, _ in problems)
            ctx = {"summary": summary, "problems": problems}
            raise PydanticCustomError("settings_conflict", "{summary}", ctx)
        return self

    def _conflicts(self) -> Iterator[tuple[str, str, Any]]:
        """``(field, what to change, value)`` for each pair of settings that disagree."""
        for low, high in _ORDERED:
            if getattr(self, low) > getattr(self, high):
                limit, env = _number(getattr(self, high)), self.env_name(high)
                yield (
                    low,
                    f"is more than {high} ({limit}); lower it or raise {env}",
                    getattr(self, low),
                )
        for given, needed in (_CERT_KEY, _CERT_KEY[::-1]):
            if getattr(self, given) is not None and getattr(self, needed) is None:
                yield (
                    given,
                    f"needs {needed} too; set {self.env_name(needed)}",
                    str(getattr(self, given)),
                )
        for name in _TLS_ONLY if not self.tls_v1 and self.transport == "nsq" else ():
            if (value := getattr(self, name)) is not None:
                yield name, "needs tls_v1; set NSQWORKER_TLS_V1=true or unset this one", str(value)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of ``field``: ``max_in_flight`` -> ``NSQWORKER_MAX_IN_FLIGHT``."""
        if field not in cls.model_fields:
            raise ValueError(f"{field} is not a setting" + did_you_mean(field, cls.model_fields))
        return ENV_PREFIX + field.upper()

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        *,
        override_names: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Self:
        """Read settings: ``overrides`` > ``NSQWORKER_*`` environment > ``config_file`` > defaults.

        ``config_file`` is a ``.toml`` file (top-level keys, or a ``[nsqworker]`` or
        ``[tool.nsqworker]`` table), a ``.json`` file (an object, or one under
        ``"nsqworker"``), or a dotenv file (``.env``, ``*.env``; ``NSQWORKER_*`` keys; other
        keys are ignored, except a setting's bare name like ``max_attempts``, which is an
        error). When it is None, ``NSQWORKER_CONFIG`` may name one. Overrides that are None
        count as not given, so CLI options can be passed straight through;
        ``override_names`` says how the caller spells them in problems (the CLI passes
        ``{"log_format": "--log-format"}``). Raises ``SettingsError`` naming every unknown
        or invalid value and where it came from, including ``NSQWORKER_*`` environment
        variables that are not settings.
        """
        problems = unknown_env_vars(os.environ, cls.model_fields)
        if config_file is None and os.environ.get("NSQWORKER_CONFIG"):
            config_file = os.environ["NSQWORKER_CONFIG"]
        file_values: dict[str, Any] = {}
        if config_file is not None:
            file_values, file_problems = read_config_file(Path(config_file), cls.model_fields)
            problems += file_problems
        token = _FILE_VALUES.set({k: v for k, v in file_values.items() if k in cls.model_fields})
        label = _FILE_LABEL.set(None if config_file is None else file_label(Path(config_file)))
        names = _OVERRIDE_NAMES.set(override_names)
        try:
            settings = cls(**{k: v for k, v in overrides.items() if v is not None})
        except SettingsError as exc:
            problems += exc.problems
        finally:
            _OVERRIDE_NAMES.reset(names)
            _FILE_LABEL.reset(label)
            _FILE_VALUES.reset(token)
        if problems:
            raise SettingsError(problems)
        return settings

    def source(self, field: str) -> str:
        """Where ``field``'s value came from: default, env, file or override."""
        return self._sources.get(field, "default")

    def describe(self) -> list[tuple[str, str, str, str]]:
        """``(name, value, source, description)`` per field, secrets shown as ``********``."""
        return [
            (name, self.display(name), self.source(name), info.description or "")
            for name, info in type(self).model_fields.items()
        ]

    def display(self, field: str) -> str:
        """``field``'s value as text: lists comma-joined, unset as ``-``, secrets masked."""
        value = getattr(self, field)
        if value is None or value == []:
            return "-"
        if isinstance(value, SecretStr):
            return MASK
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float):
            return _number(value)
        if isinstance(value, list):
            return ",".join(value)
        return str(value)


class Settings(FeatureSettings, StreamSettings, NatsSettings, _CoreSettings):
    """nsqworker's settings; see the module docstring for where values come from.

    The other brokers' fields (:mod:`nsqworker.broker_settings`) come after NSQ's."""

    if TYPE_CHECKING:  # every field has a default; type checkers see two bases' fields

        def __init__(self, **values: Any) -> None: ...
