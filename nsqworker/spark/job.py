"""What a ``@spark_task`` handler returns: :class:`SparkJob`, and how a job ended.

A handler only describes the job. The worker checks the description before anything
is submitted (:func:`job_problems`): a job that cannot run (a missing app file, a conf
value Spark cannot take) is a dead letter at once, because retrying cannot fix it.
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nsqworker.spark.policy import (
    DEFAULT_APP_URIS,
    allowed_app_uri,
    denied_conf,
    denied_env,
    outside_root,
)

__all__ = [
    "JobContext",
    "JobResult",
    "JobState",
    "SecretRef",
    "SparkJob",
    "SparkJobFailed",
    "job_problems",
]

RunnerKind = Literal["local", "kubernetes"]

#: Schemes an application or py-file URI may use on Kubernetes (what Spark can fetch).
REMOTE_SCHEMES = ("local", "file", "s3a", "s3", "gs", "hdfs", "abfs", "abfss", "http", "https")
_CONF_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-\[\]]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URI = re.compile(r"^([a-z][a-z0-9+.-]*)://")
_NAME_MAX = 200


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


@dataclass(frozen=True)
class SecretRef:
    """An ``env`` value read from key ``key`` of the Kubernetes Secret ``name`` (in the
    jobs' namespace), so it never appears in the SparkApplication in plain text.
    Kubernetes runner only; build it from your code, never from the message."""

    name: str
    key: str


@dataclass(frozen=True)
class SparkJob:
    """A Spark application to run for one message.

    Args:
        app: the PySpark script (or jar): a file path for the local runner (relative
            paths from the worker's current directory); a URI Spark can fetch on
            Kubernetes (``local:///opt/app/job.py`` inside the image, ``s3a://...``).
        args: the application's arguments.
        conf: ``--conf`` values, ``{"spark.sql.shuffle.partitions": "8"}``; numbers and
            booleans are written as Spark expects them (``8``, ``true``).
        name: the application's name in Spark (default: the task's name).
        py_files: extra ``.py``/``.zip``/``.egg`` files for ``--py-files``.
        env: environment variables for the driver (and, on Kubernetes, the executors);
            on Kubernetes a value may be a :class:`SecretRef` (a ``secretKeyRef``).
        timeout: the longest the job may run, in seconds, from its submission: past
            it the worker stops the job and the attempt fails (retried with backoff,
            dead-lettered after ``max_attempts``). When it exceeds nsqd's
            ``--max-msg-timeout`` the job is refused before it is submitted (nsqd
            would redeliver the message while the job still runs).
    """

    app: str
    args: Sequence[str] = ()
    conf: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    name: str | None = None
    py_files: Sequence[str] = ()
    env: Mapping[str, str | SecretRef] = field(default_factory=dict)
    timeout: float | None = None

    def conf_strings(self) -> dict[str, str]:
        """``conf`` with every value as the string Spark reads (``True`` -> ``"true"``)."""
        return {key: _conf_text(value) for key, value in self.conf.items()}


def _conf_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def job_problems(
    job: object,
    runner: RunnerKind,
    cwd: str | os.PathLike[str] = ".",
    roots: Sequence[str | os.PathLike[str]] = (),
    app_uris: Sequence[str] = DEFAULT_APP_URIS,
) -> list[str]:
    """Everything wrong with ``job`` for ``runner``; empty when it can be submitted.

    Each problem names the field and what to change. The local runner also checks that
    ``app`` and ``py_files`` are files under ``roots`` (default: ``cwd``; relative paths
    are read from ``cwd``); the Kubernetes runner that they
    are URIs the driver can fetch that match ``app_uris`` (``spark_app_uris``). Conf keys and env names that would let a message
    run code are refused (:mod:`nsqworker.spark.policy`).
    """
    if not isinstance(job, SparkJob):
        return [f"the handler returned {type(job).__name__}, not a SparkJob"]
    problems: list[str] = []
    where = [Path(r) for r in roots] or [Path(cwd)]
    places = _Places(cwd, where, tuple(app_uris))
    problems += _file_problems("app", [job.app], runner, places, single=True)
    if isinstance(job.py_files, str) or not isinstance(job.py_files, Sequence):
        problems.append(f"py_files must be a list of paths, got {job.py_files!r}")
    else:
        problems += _file_problems("py_files", list(job.py_files), runner, places, False)
    if isinstance(job.args, str) or not isinstance(job.args, Sequence):
        problems.append(f"args must be a list of strings, got {job.args!r}")
    else:
        args: Sequence[object] = job.args  # the handler's types are not checked at run time
        for i, arg in enumerate(args):
            if not isinstance(arg, str):
                problems.append(f"args[{i}] must be a string, got {arg!r}")
            elif "\x00" in arg:
                problems.append(f"args[{i}] contains a NUL byte")
    problems += _conf_problems(job.conf)
    problems += _env_problems(job.env)
    if runner == "local" and isinstance(job.env, Mapping):
        problems += [
            f"env[{k!r}] is a SecretRef: the local runner has no Kubernetes Secrets"
            for k, v in job.env.items()
            if isinstance(v, SecretRef)
        ]
    if job.name is not None and (
        not isinstance(job.name, str) or not job.name.strip() or len(job.name) > _NAME_MAX
    ):
        problems.append(f"name must be a non-empty string of at most {_NAME_MAX} characters")
    timeout = job.timeout
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        problems.append(f"timeout must be seconds above 0, or None; got {timeout!r}")
    return problems


@dataclass(frozen=True)
class _Places:
    """Where a job's files may be: the local runner's directory and roots, the
    Kubernetes runner's URI patterns."""

    cwd: str | os.PathLike[str]
    roots: list[Path]
    app_uris: tuple[str, ...]


def _file_problems(
    what: str, values: list[object], runner: RunnerKind, places: _Places, single: bool
) -> list[str]:
    problems = []
    for i, value in enumerate(values):
        label = what if single else f"{what}[{i}]"
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{label} must be a non-empty string, got {value!r}")
            continue
        scheme = _URI.match(value)
        if runner == "kubernetes":
            if scheme is None or scheme.group(1) not in REMOTE_SCHEMES:
                problems.append(
                    f"{label} {value!r} is not a URI the driver can fetch; on Kubernetes give "
                    "local:///path/in/the/image or s3a://bucket/key (schemes: "
                    f"{', '.join(REMOTE_SCHEMES)})"
                )
            elif not allowed_app_uri(value, places.app_uris):
                problems.append(
                    f"{label} {value!r} is not allowed by spark_app_uris "
                    f"({', '.join(places.app_uris) or 'none'}); add a pattern for it "
                    "(like s3a://my-bucket/jobs/*) to that setting, or ship it in the image"
                )
            continue
        path_text = value
        if scheme is not None:
            if scheme.group(1) not in ("file", "local"):
                problems.append(
                    f"{label} {value!r} is remote; the local runner runs files under the "
                    "spark_app_roots only (ship the app in the image)"
                )
                continue
            path_text = value[len(scheme.group(0)) :]
        path = Path(places.cwd, path_text)
        if all(outside_root(path, root) for root in places.roots):
            where = ", ".join(str(r) for r in places.roots)
            problems.append(f"{label} {value!r} is outside spark_app_roots ({where})")
        elif not path.is_file():
            problems.append(f"{label} {value!r}: no such file ({path.resolve()})")
    return problems


def _conf_problems(conf: object) -> list[str]:
    if not isinstance(conf, Mapping):
        return [f"conf must be a mapping of Spark property names to values, got {conf!r}"]
    problems = []
    for key, value in conf.items():
        if not isinstance(key, str) or not _CONF_KEY.match(key):
            problems.append(f"conf key {key!r} is not a Spark property name (like spark.x.y)")
            continue
        if denied_conf(key):  # security: code, jars, volumes... are the operator's
            problems.append(
                f"conf key {key!r} may not be set by a job (it runs or fetches code, or "
                "changes the pod); set it in spark-defaults.conf or the operator's defaults"
            )
            continue
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"conf[{key!r}] = {value!r} is not a finite number")
        elif not isinstance(value, str | int | float | bool):
            problems.append(
                f"conf[{key!r}] = {value!r} is a {type(value).__name__}; give a string, "
                "number or boolean"
            )
        elif isinstance(value, str) and ("\n" in value or "\x00" in value or not value.strip()):
            problems.append(f"conf[{key!r}] = {value!r}: empty, or holds a newline or NUL")
    return problems


def _env_problems(env: object) -> list[str]:
    if not isinstance(env, Mapping):
        return [f"env must be a mapping of names to strings, got {env!r}"]
    problems = []
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append(f"env name {key!r} is not a valid variable name")
        elif denied_env(key):
            problems.append(f"env name {key!r} may not be set by a job (it changes what runs)")
        elif isinstance(value, SecretRef):
            if not _K8S_NAME.match(str(value.name)) or not _SECRET_KEY.match(str(value.key)):
                problems.append(f"env[{key!r}] = {value!r}: not a Secret name and key")
        elif not isinstance(value, str) or "\x00" in value:
            problems.append(f"env[{key!r}] must be a string without NUL, got {value!r}")
    return problems


@dataclass(frozen=True)
class JobContext:
    """Who a job runs for: the message's topic, channel, id and attempt, the task name.

    The Kubernetes runner derives the application's name from ``topic``, ``channel``
    and ``message_id``, so a redelivery finds the job its first delivery started.
    """

    topic: str
    channel: str
    message_id: str
    attempts: int
    task: str


class JobState(enum.Enum):
    """Where a job is; the Kubernetes runner maps ``applicationState.state`` onto it."""

    SUBMITTED = "submitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """True for the two final states."""
        return self in (JobState.SUCCEEDED, JobState.FAILED)


@dataclass(frozen=True)
class JobResult:
    """How a job ended: its final state, the runner's id for it, and the details.

    ``exit_code`` is the local runner's spark-submit exit status; ``error`` a short
    reason on failure (the last lines of output, or the operator's error message).
    """

    state: JobState
    job_id: str
    duration: float
    exit_code: int | None = None
    error: str = ""


class SparkJobFailed(Exception):
    """The job ran and failed: the message is requeued with backoff (a normal failure)."""

    def __init__(self, result: JobResult) -> None:
        self.result = result
        detail = f" (exit code {result.exit_code})" if result.exit_code is not None else ""
        reason = f": {result.error}" if result.error else ""
        super().__init__(f"Spark job {result.job_id} failed{detail}{reason}")
