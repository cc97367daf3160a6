"""A long-lived SparkSession for a worker process, and each message's jobs in it.

:class:`SessionHolder` owns one session per backend and target in the process:

- ``local``: a pyspark driver inside the worker process (``Settings.spark_master``,
  ``local[2]`` and the like), on the Java :func:`~nsqworker.spark.local.find_java` finds;
- ``connect``: a Spark Connect client of ``Settings.spark_remote`` (``sc://host:15002``).

It starts the session on first use (or at worker start, ``spark_session_start``), from a
thread, since a local driver takes seconds to start, and stops it when the worker has
drained. Each message's jobs carry a group named after the message: a job group on a
local driver (``setJobGroup``, interrupting its tasks on cancel), a tag on Spark Connect
(``addTag``). :meth:`SessionHolder.cancel_group` cancels exactly that message's jobs
(``cancelJobGroup`` / ``interruptTag``).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from nsqworker.errors import ConfigurationError
from nsqworker.logging import get_logger
from nsqworker.spark.local import require_java

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from nsqworker.settings.spark import SparkSettings as Settings

__all__ = ["Backend", "GroupCancelled", "SessionHolder", "error_summary", "holder_for"]

log = get_logger("nsqworker.spark")

Backend = Literal["local", "connect"]
#: Lines of a Spark error kept for the log and the span (a JVM trace runs to hundreds).
ERROR_LINES = 6
#: Conf every local session gets unless ``spark_session_conf`` says otherwise: FAIR
#: scheduling, so that concurrent messages (each in its own pool) share the executors.
#: A ``local[N]`` driver also gets ``spark.sql.shuffle.partitions`` = N
#: (:func:`local_defaults`).
LOCAL_DEFAULTS: dict[str, str] = {"spark.scheduler.mode": "FAIR"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_LOCAL = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?")


def local_defaults(master: str) -> dict[str, str]:
    """The conf a local session gets unless its own conf says otherwise: FAIR
    scheduling and, on a ``local``/``local[N]``/``local[*]`` master, one shuffle
    partition per core. Spark's default of 200 suits a cluster; on a driver of a few
    cores a small job's every shuffle becomes 200 tasks (and as many map outputs), most
    of its time on a warm session."""
    conf = dict(LOCAL_DEFAULTS)
    found = _LOCAL.fullmatch(master.strip())
    if found is not None:
        cores = found.group(1)
        count = (os.cpu_count() or 1) if cores == "*" else int(cores or 1)
        conf["spark.sql.shuffle.partitions"] = str(max(count, 1))
    return conf


class GroupCancelled(RuntimeError):
    """The message's group was cancelled before its handler started a job."""


def group_name(task: str, message_id: str) -> str:
    """The job group (tag) of one message: ``nsqworker:<task>:<message id>``, with any
    character Spark Connect refuses in a tag (a comma, a space) replaced by ``_``."""
    return _UNSAFE.sub("_", f"nsqworker:{task}:{message_id}")


def error_summary(exc: BaseException, lines: int = ERROR_LINES) -> str:
    """The first non-blank lines of a Spark error: the cause, without the JVM trace."""
    text = str(exc) or type(exc).__name__
    kept = [
        line.rstrip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("at ")
    ][:lines]
    return f"{type(exc).__name__}: " + "\n".join(kept)


@dataclass
class SessionHolder:
    """One SparkSession for the process: started on first :meth:`get`, shared by every
    task and thread, stopped by :meth:`stop` (only when this holder started it)."""

    backend: Backend
    target: str
    """``spark_master`` (local) or ``spark_remote`` (connect)."""
    conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "nsqworker"
    session: Any = None
    """The session, once started (a ``pyspark.sql.SparkSession``)."""
    owned: bool = False
    """True when this holder started the session (and so stops it on drain)."""
    started: int = 0
    """How many sessions this holder started (a restart after a stop counts)."""
    users: int = 0
    """Running tasks bound to this holder (:meth:`acquire`); the last to go stops it."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _cancelled: set[str] = field(default_factory=set, repr=False)

    def acquire(self) -> None:
        """Count a task of a running worker as a user of the session."""
        with self._lock:
            self.users += 1

    def release(self) -> None:
        """A drained task is done with the session: stop it when it was the last user
        (two Workers in one process share the session; blocking: call from a thread)."""
        with self._lock:
            self.users = max(self.users - 1, 0)
            if self.users:
                return
        self.stop()

    def get(self) -> SparkSession:
        """The session, started now if there is none (blocking: call from a thread)."""
        with self._lock:
            if self.session is None:
                self.session = self._start()
                self.owned = True
                self.started += 1
            spark: SparkSession = self.session
            return spark

    def adopt(self, spark: SparkSession) -> None:
        """Use a session built elsewhere (a test's, one with special conf); the holder
        never stops it."""
        with self._lock:
            self.session, self.owned = spark, False

    def stop(self) -> None:
        """Stop the session if this holder started it (blocking); the next :meth:`get`
        starts a new one."""
        with self._lock:
            spark, owned = self.session, self.owned
            if spark is None or not owned:
                return
            self.session, self.owned = None, False
        log.info("spark session stopping", backend=self.backend, target=self.target)
        try:
            spark.stop()
        except Exception as exc:  # a connect server gone, a JVM already down
            log.warning("stopping the spark session failed", error=error_summary(exc))

    def _start(self) -> SparkSession:
        log.info("spark session starting", backend=self.backend, target=self.target)
        if self.backend == "connect":
            try:
                from pyspark.sql.connect.session import SparkSession as ConnectSession
            except ImportError as exc:
                raise ConfigurationError(
                    f"spark_remote needs pyspark's Spark Connect client ({exc}): "
                    "pip install 'nsq-worker[spark]'"
                ) from exc
            remote = ConnectSession.builder.remote(self.target)
            for key, value in self.conf.items():
                remote = remote.config(key, value)
            # create(), not getOrCreate(): a thread's "active" session may be one this
            # holder stopped; each start is a new server-side session of our own.
            return cast("SparkSession", remote.create())  # the same API, typed apart
        _java_for_driver()
        # py4j logs each connection it closes at INFO, from __del__ too (even at exit,
        # into closed streams): its warnings are enough.
        logging.getLogger("py4j").setLevel(logging.WARNING)
        try:
            from pyspark.sql import SparkSession
        except ImportError as exc:
            raise ConfigurationError(
                "a Spark session needs pyspark: pip install 'nsq-worker[spark]'"
            ) from exc
        builder = SparkSession.builder.master(self.target).appName(self.app_name)
        for key, value in (local_defaults(self.target) | dict(self.conf)).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    # -- one message's group ------------------------------------------------------

    def begin(self, spark: SparkSession, group: str, description: str) -> None:
        """Tag the calling thread's next jobs with ``group`` (call in the handler's
        thread before its jobs); raises :class:`GroupCancelled` if it was cancelled."""
        if group in self._cancelled:
            raise GroupCancelled(f"group {group} was cancelled before its jobs started")
        if self.backend == "connect":
            spark.addTag(group)
            return
        sc = spark.sparkContext
        sc.setJobGroup(group, description, interruptOnCancel=True)
        # Each handler thread its own FAIR pool: concurrent messages share the cores.
        sc.setLocalProperty("spark.scheduler.pool", threading.current_thread().name)

    def end(self, spark: SparkSession, group: str) -> None:
        """Untag the calling thread (in the handler's thread, after its jobs)."""
        self._cancelled.discard(group)
        try:
            if self.backend == "connect":
                spark.removeTag(group)
            else:
                # None is a Java null: the JVM drops the thread's property.
                spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        except Exception as exc:  # the session was stopped under the handler
            log.debug("clearing the spark job group failed", group=group, error=str(exc))

    def cancel_group(self, group: str) -> None:
        """Cancel the running jobs of ``group`` and refuse it new ones (any thread)."""
        self._cancelled.add(group)
        spark = self.session
        if spark is None:
            return
        try:
            if self.backend == "connect":
                spark.interruptTag(group)
            else:
                spark.sparkContext.cancelJobGroup(group)
        except Exception as exc:
            log.warning("cancelling the spark jobs failed", group=group, error=error_summary(exc))

    def forget(self, group: str) -> None:
        """Drop a cancelled group's mark once its handler thread has ended."""
        self._cancelled.discard(group)


def _java_for_driver() -> None:
    """Point the driver's JVM at a Java runtime (``JAVA_HOME`` or ``PATH``) and its
    Python workers at this interpreter, in this process's environment."""
    java = require_java(os.environ)
    if os.environ.get("JAVA_HOME") != java.home:
        os.environ["JAVA_HOME"] = java.home
        log.info("spark java", java_home=java.home, source=java.source)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", os.environ["PYSPARK_PYTHON"])


_holders: dict[tuple[Backend, str, tuple[tuple[str, str], ...]], SessionHolder] = {}
_holders_lock = threading.Lock()


def holder_for(settings: Settings) -> SessionHolder:
    """The process's holder for the backend ``settings`` name: ``connect`` when
    ``spark_remote`` is set, else ``local`` on ``spark_master``."""
    remote = settings.spark_remote
    backend: Backend = "local" if remote is None else "connect"
    target = settings.spark_master if remote is None else remote
    conf = {k: _conf_value(v) for k, v in settings.spark_session_conf.items()}
    key = (backend, target, tuple(sorted(conf.items())))
    with _holders_lock:
        holder = _holders.get(key)
        if holder is None:
            holder = _holders[key] = SessionHolder(backend, target, conf)
        return holder


def _conf_value(value: object) -> str:
    """A conf value as Spark reads it: ``true``/``false``, not Python's ``True``."""
    return str(value).lower() if isinstance(value, bool) else str(value)
