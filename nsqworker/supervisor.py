"""``nsqworker run``: a supervisor process and its worker processes.

The supervisor imports the task module once to check it, serves ``/livez``,
``/readyz`` and ``/metrics``, and keeps ``settings.workers`` child processes running,
each a :class:`~nsqworker.worker.Worker` with every task. It is one loop over a signal
queue and a list of children; signal handlers only record the signal.

* A child sends its stats over a pipe every second from its event loop, so a child
  whose loop hangs stops sending and is killed after ``hung_timeout`` seconds.
* A child that dies is replaced after a delay that doubles per death of that worker
  (0.5 s up to 30 s; back to 0.5 s once a child lived 60 s). ``crash_limit`` deaths
  within ``crash_window`` seconds end the supervisor with exit code 1.
* SIGTERM or the first Ctrl-C drains: each child gets SIGTERM (its Worker stops taking
  messages, finishes or REQs the ones in flight within ``drain_timeout``, exits 0);
  stragglers are killed ``drain_timeout + 5`` s later. A second Ctrl-C kills at once.

Exit codes: 0 drained, 1 crash loop, 2 usage / import / settings error, 130 forced.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from nsqworker.child import (
    EXIT_CRASH_LOOP,
    EXIT_FORCED,
    EXIT_OK,
    EXIT_USAGE,
    ChildSpec,
    child_main,
)
from nsqworker.health import HealthServer, WorkerMetrics, status_tasks
from nsqworker.logging import get_logger
from nsqworker.supervised import Child as _Child
from nsqworker.supervised import _workers, describe_exit
from nsqworker.watchdog import over_memory, rss_bytes

if TYPE_CHECKING:
    from nsqworker.schedules.runner import ScheduleRunner
    from nsqworker.settings import Settings

__all__ = [
    "EXIT_CRASH_LOOP",
    "EXIT_FORCED",
    "EXIT_OK",
    "EXIT_USAGE",
    "RestartPolicy",
    "Supervisor",
    "run",
]

log = get_logger(__name__)

DRAIN_MARGIN = 5.0
#: ``/livez`` fails when the supervisor loop has not turned for this many seconds.
LIVE_TIMEOUT = 10.0


@dataclass(frozen=True)
class RestartPolicy:
    """How the supervisor watches and replaces its children."""

    hung_timeout: float = 60.0
    """Seconds without a heartbeat before a child is killed (SIGKILL) and replaced."""
    crash_limit: int = 5
    """Deaths within ``crash_window`` that end the supervisor (exit code 1)."""
    crash_window: float = 60.0
    """Seconds over which deaths are counted."""
    restart_delay: float = 0.5
    """Delay before the first replacement; doubles per death of the same worker."""
    max_restart_delay: float = 30.0
    """Cap on the replacement delay."""
    stable_after: float = 60.0
    """A child that lived this long resets its worker's replacement delay."""
    boot_timeout: float = 60.0
    """Seconds a new child has to send its first heartbeat (imports, connecting), if
    longer than ``hung_timeout``."""
    heartbeat_interval: float = 1.0
    """Seconds between a child's stats messages."""


# ---------------------------------------------------------------------------- the child


# ---------------------------------------------------------------------------- the parent


class Supervisor:
    """Runs ``settings.workers`` worker processes for the tasks in ``target``.

    ``run()`` blocks until the supervisor stops and returns the process exit code. The
    caller checks the task module first (see :func:`run`); the children import it again.
    """

    def __init__(
        self,
        target: str,
        settings: Settings,
        policy: RestartPolicy | None = None,
        schedules: ScheduleRunner | None = None,
    ) -> None:
        self.target = target
        self.schedules = schedules
        """This supervisor's schedule candidate (``@task(schedule=...)``), if any."""
        self.metrics = WorkerMetrics()
        if schedules is not None:
            self.metrics.extra.append(schedules.metrics)
        self.settings = settings
        self.policy = policy or RestartPolicy()
        self._ctx = multiprocessing.get_context("spawn")
        self._slots: list[_Child | None] = [None] * settings.workers
        self._restart_at: dict[int, float] = {i: 0.0 for i in range(settings.workers)}
        self._delay = [self.policy.restart_delay] * settings.workers
        self._deaths: deque[float] = deque()
        self._keys = 0
        self._signals: deque[int] = deque()
        self._reloads: deque[list[str]] = deque()  # changed files (--reload), from its thread
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._deadline = 0.0
        self._exit_code = EXIT_OK
        self._tick = self._born = time.monotonic()
        self._readiness: tuple[bool, dict[str, Any]] = (False, {"workers": []})

    # -- health -------------------------------------------------------------------------

    def is_live(self) -> bool:
        """True while this loop turns and no worker's event loop is blocked (watchdog_timeout)."""
        now, limit = time.monotonic(), self.settings.watchdog_timeout
        grace = limit + self.policy.heartbeat_interval  # its last stats may be that old
        late = limit > 0 and any(c.snapshot and now - c.last_seen > grace for c in self._children())
        return now - self._tick < LIVE_TIMEOUT and not late

    def inflight(self) -> dict[str, Any]:
        """What every worker process last reported in flight (running handlers that
        suspended or run in threads, messages waiting for a slot), oldest first."""
        rows = []
        for child in list(self._children()):
            for row in child.snapshot.get("inflight") or ():
                rows.append({**row, "pid": child.pid, "worker": child.index + 1})
        rows.sort(key=lambda row: -float(row.get("age_s") or 0))
        return {"inflight": rows}

    def status(self) -> dict[str, Any]:
        """This supervisor and its worker processes (pid, memory, uptime, in flight) and
        the tasks' totals with their last error: ``/status``, read by the console."""
        now, children = time.monotonic(), list(self._children())
        workers = [c.status(now) for c in children]
        return {
            "pid": os.getpid(), "hostname": socket.gethostname(), "target": self.target,
            "transport": self.settings.transport, "uptime_s": round(now - self._born, 1),
            "memory_bytes": rss_bytes(os.getpid()), "restarts": self.metrics.restarts,
            "stopping": self._stopping, "workers": workers,
            "tasks": status_tasks(self.metrics.totals(), [c.snapshot for c in children]),
        }  # fmt: skip

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, details)`` as of the last loop turn: every live child subscribed."""
        return self._readiness

    def _update_readiness(self) -> None:
        children = list(self._children())
        workers = [c.state(self._stopping) for c in children]
        ready = bool(children) and not self._stopping and all(c.ready for c in children)
        details: dict[str, Any] = {"transport": self.settings.transport, "workers": workers}
        if self._stopping:
            details["stopping"] = True
        self._readiness = (ready, details)
        self.metrics.alive = len(children)

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """Start the children and supervise them until they are stopped; the exit code."""
        previous = self._install_signals()
        try:
            log.info(
                f"starting {_workers(len(self._slots))} for {self.target}",
                drain_timeout=self.settings.drain_timeout,
            )
            return self._loop()
        finally:
            self._restore_signals(previous)
            self._wake_r.close()
            self._wake_w.close()

    def _loop(self) -> int:
        while True:
            now = time.monotonic()
            self._tick = now
            while self._signals:
                if self._on_signal(self._signals.popleft()):
                    return self._force()
            self._reap(now)
            if self._stopping:
                if not any(self._children()):
                    log.info("all workers stopped", exit_code=self._exit_code)
                    return self._exit_code
                if now >= self._deadline:
                    self._kill_stragglers()
            else:
                self._check_hung(now)
                self._check_memory()
                self._check_reload()
                self._start_due(now)
            self._update_readiness()
            self._wait(0.5)

    def _wait(self, timeout: float) -> None:
        children = list(self._children())
        ready = wait(
            [self._wake_r, *(c.conn for c in children), *(c.process.sentinel for c in children)],
            timeout,
        )
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                self._wake_r.recv(4096)
        now = time.monotonic()
        for child in children:
            self._read(child, now)

    def _read(self, child: _Child, now: float) -> None:
        try:
            while child.conn.poll():
                kind, payload = child.conn.recv()
                if kind == "stats":
                    child.snapshot = payload
                    child.last_seen, child.pinged = now, False
                    self.metrics.update(child.key, payload)
        except (EOFError, OSError):
            pass  # the child is gone; _reap notices through its sentinel

    def _children(self) -> Iterator[_Child]:
        return (c for c in self._slots if c is not None)

    # -- starting and reaping -----------------------------------------------------------

    def _start_due(self, now: float) -> None:
        for index, at in list(self._restart_at.items()):
            if now >= at:
                del self._restart_at[index]
                self._start(index, now)

    def _start(self, index: int, now: float) -> None:
        parent_conn, child_conn = self._ctx.Pipe()
        spec = ChildSpec(self.target, self.settings, index + 1, self.policy.heartbeat_interval)
        process = self._ctx.Process(
            target=child_main, args=(spec, child_conn), name=f"nsqworker-{index + 1}"
        )
        process.start()
        child_conn.close()
        self._keys += 1
        self._slots[index] = _Child(index, self._keys, process, parent_conn, now, now)
        log.info(f"worker {index + 1} started", pid=process.pid)

    def _reap(self, now: float) -> None:
        for child in list(self._children()):
            if child.process.is_alive():
                continue
            child.process.join()
            self._read(child, now)  # its last stats, sent while it drained
            child.conn.close()
            self._slots[child.index] = None
            self.metrics.retire(child.key)
            code = child.process.exitcode
            if self._stopping:
                log.info(f"worker {child.index + 1} stopped", pid=child.pid, exit=code)
            else:
                self._on_death(child, code, now)

    def _check_memory(self) -> None:
        """SIGTERM a child over max_memory_per_child, or one that asks to be replaced (a
        sync handler past its time limit): it drains, exits, is replaced."""
        limit = self.settings.max_memory_per_child
        for child in self._children():
            if child.recycling:
                continue
            asked = child.snapshot.get("recycle")
            if asked:
                log.warning(f"worker {child.index + 1} asks to be replaced: {asked}")
                child.recycling = "asked"
            elif mib := over_memory(child.pid, limit):
                log.warning(f"worker {child.index + 1} over max_memory_per_child: {mib:.0f} MiB")
                child.recycling = "memory limit"
            else:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    def request_reload(self, changed: list[str]) -> None:
        """Drain and restart every worker (``--reload``); any thread may call this."""
        self._reloads.append(changed)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"r")

    def _check_reload(self) -> None:
        if not self._reloads:
            return
        changed = sorted({path for batch in self._reloads for path in batch})
        self._reloads.clear()
        shown = ", ".join(changed[:3]) + (
            f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        )
        log.info(f"{shown} changed; restarting the workers (--reload)")
        for child in self._children():
            if not child.recycling:
                child.recycling = "reload"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)

    def _on_death(self, child: _Child, code: int | None, now: float) -> None:
        lived = now - child.started
        if code == 0 and not child.recycling and child.snapshot.get("recycle"):
            child.recycling = "asked"  # it drained and exited before we could SIGTERM it
        if child.recycling and not child.killed:  # asked to stop to be replaced: not a crash
            self._restart_at[child.index], self.metrics.restarts = now, self.metrics.restarts + 1
            log.info(f"worker {child.index + 1} replaced ({child.recycling})", exit=code)
            return
        if code == EXIT_USAGE and not child.killed:  # a setting that cannot work: no retry
            log.error(f"worker {child.index + 1} stopped on a configuration error; stopping")
            self._begin_stop(EXIT_USAGE)
            return
        why = f"killed {child.killed}" if child.killed else describe_exit(code)
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.policy.crash_window:
            self._deaths.popleft()
        if len(self._deaths) >= self.policy.crash_limit:
            window = f"{self.policy.crash_window:g}"
            log.error(
                f"{len(self._deaths)} workers died within {window} s; last {why} "
                "(see its logs above); giving up"
            )
            self._begin_stop(EXIT_CRASH_LOOP)
            return
        if lived >= self.policy.stable_after:
            self._delay[child.index] = self.policy.restart_delay
        delay = self._delay[child.index]
        self._delay[child.index] = min(delay * 2, self.policy.max_restart_delay)
        self._restart_at[child.index] = now + delay
        self.metrics.restarts += 1
        log.warning(
            f"worker {child.index + 1} died ({why}) after {lived:.1f} s; restarting in {delay:g} s",
            pid=child.pid,
        )

    def _check_hung(self, now: float) -> None:
        policy = self.policy
        for child in self._children():
            silent = now - child.last_seen
            booting = not child.snapshot
            limit = (
                max(policy.hung_timeout, policy.boot_timeout) if booting else policy.hung_timeout
            )
            if silent >= limit and not child.killed:
                what = "within {:.0f} s of starting" if booting else "for {:.0f} s"
                log.error(
                    f"worker {child.index + 1} sent no heartbeat {what.format(silent)}; killing it",
                    pid=child.pid,
                )
                self._kill(child, "as hung")
            elif silent >= 5 * self.policy.heartbeat_interval and not child.pinged:
                child.pinged = True
                with contextlib.suppress(OSError):
                    child.conn.send("ping")

    # -- stopping -----------------------------------------------------------------------

    def _on_signal(self, signum: int) -> bool:
        """Act on one recorded signal; True means stop now (forced)."""
        name = signal.Signals(signum).name
        if not self._stopping:
            log.info(f"{name}: draining")
            self._begin_stop(EXIT_OK)
            return False
        if signum == signal.SIGINT:
            return True
        log.info(f"{name}: already draining; Ctrl-C again to force")
        return False

    def _begin_stop(self, exit_code: int) -> None:
        if self.schedules is not None:  # stop firing first: another supervisor takes over
            self.schedules.request_stop()
        self._stopping = True
        self._exit_code = exit_code
        self._restart_at.clear()
        self._deadline = time.monotonic() + self.settings.drain_timeout + DRAIN_MARGIN
        children = list(self._children())
        if children:
            log.info(
                f"stopping {_workers(len(children))}; killing any left after "
                f"{self.settings.drain_timeout + DRAIN_MARGIN:g} s"
            )
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    def _kill_stragglers(self) -> None:
        for child in self._children():
            if not child.killed:
                log.warning(f"worker {child.index + 1} did not stop in time; killing it")
                self._kill(child, "at the drain deadline")

    def _force(self) -> int:
        log.warning("SIGINT again: killing all workers")
        for child in self._children():
            self._kill(child, "forced")
        for child in self._children():
            child.process.join(5)
            self.metrics.retire(child.key)
        return EXIT_FORCED

    @staticmethod
    def _kill(child: _Child, why: str) -> None:
        child.killed = why
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)

    # -- signals ------------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        self._wake_w.setblocking(False)
        self._wake_r.setblocking(False)
        previous: dict[int, Any] = {-1: signal.set_wakeup_fd(self._wake_w.fileno())}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, self._record_signal)
        return previous

    def _record_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        signal.set_wakeup_fd(previous.pop(-1))
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# ---------------------------------------------------------------------------- entry point


def run(
    target: str,
    settings: Settings,
    policy: RestartPolicy | None = None,
    *,
    spelled: Mapping[str, str] | None = None,
    reload: bool = False,
) -> int:
    """``nsqworker run``: check ``target``, serve health, supervise; the exit code.

    ``target`` is ``module`` or ``module:attribute`` naming a Registry. It is imported
    here first, so that a broken module raises ``TaskImportError`` (an ``ImportError``)
    once, before any child starts. A health port that was set and cannot be bound
    returns 2; the default one, when taken, is replaced by a free one, so that a second
    local worker just works. ``spelled`` names the flag of each setting the caller
    passed on its command line (``{"health_port": "--health-port"}``). ``reload``
    restarts the workers when a source file of the task package changes.
    """
    from nsqworker.errors import ConfigurationError
    from nsqworker.task import load_registry

    registry = load_registry(target)
    try:
        schedules = _schedule_runner(target, settings, registry)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    supervisor = Supervisor(target, settings, policy, schedules)
    health: HealthServer | None = None
    if settings.health_port:
        health = _start_health(settings, supervisor, spelled or {})
        if health is None:
            return EXIT_USAGE
    reloader = None
    if reload:
        from nsqworker.reload import Reloader, watched_paths

        reloader = Reloader(watched_paths(target), supervisor.request_reload)
        reloader.start()
        log.info("watching for changes (--reload): " + ", ".join(map(str, reloader.paths)))
    if schedules is not None:
        schedules.start()
    try:
        return supervisor.run()
    finally:
        if schedules is not None:
            schedules.stop()
        if reloader is not None:
            reloader.stop()
        if health is not None:
            health.stop()


def _schedule_runner(target: str, settings: Settings, registry: Any) -> ScheduleRunner | None:
    """The schedule candidate for ``registry``'s scheduled tasks, None without any;
    ``ConfigurationError`` when the settings cannot work."""
    from nsqworker.schedules.runner import ScheduleRunner, scheduled_tasks

    tasks = scheduled_tasks(registry)
    return ScheduleRunner(target, settings, tasks) if tasks else None


def _start_health(
    settings: Settings, supervisor: Supervisor, spelled: Mapping[str, str]
) -> HealthServer | None:
    """The running health server; None (after one error line) if its port is taken."""
    default = settings.source("health_port") == "default"
    for port in [settings.health_port] + [0] * default:
        health = HealthServer(
            settings.health_host, port, supervisor.is_live, supervisor.readiness,
            supervisor.metrics, supervisor.inflight, supervisor.status,
        )  # fmt: skip
        try:
            health.start()
        except OSError as exc:
            if default and port:
                continue
            origin = spelled.get("health_port") or settings.env_name("health_port")
            print(
                f"error: the health server cannot listen on {settings.health_host}:{port} "
                f"({exc.strerror or exc}); change {origin} (0 turns the server off)",
                file=sys.stderr,
            )
            return None
        host = f"[{health.host}]" if ":" in health.host else health.host
        where = f"http://{host}:{health.port}/livez /readyz /metrics"
        if health.port == settings.health_port:
            log.info(f"health on {where}")
        else:
            env = settings.env_name("health_port")
            log.warning(f"port {settings.health_port} is taken; health on {where} ({env} fixes it)")
        return health
    return None
