"""One worker process: a Registry's tasks on one event loop, over one transport.

``Worker(registry, settings)`` builds the transport ``settings.transport`` names (NSQ by
default) and, per task, a :class:`~nsqworker.task_runner.TaskRunner`, which builds its
subscription and :class:`~nsqworker.dispatch.Dispatcher` (the task's policy) and runs the
handler, turning the result into an outcome (finish, retry or reject: see
:mod:`nsqworker.outcomes`); its reject hook is the dead-letter chain. The worker only starts and stops the runners and asks them for
stats and in-flight rows. Async
handlers run on the loop, each in its own Task whose first step runs at once, so one
that never suspends finishes in the same call (:mod:`nsqworker.eager`). Sync handlers never run on the loop: each sync task has a small
thread pool, sized to its max_in_flight and grown on demand, whose threads hand results
back in batches (one wake-up of the loop per batch, not per message).

Per task the worker keeps a handler-duration histogram and a dead-letter count; the
dispatcher's counters and the subscription's gauges complete :meth:`Worker.stats`.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, Self

from nsqworker import logging as _logs
from nsqworker.dispatch import Callback
from nsqworker.errors import ConfigurationError
from nsqworker.hooks import Hooks
from nsqworker.logging import configure_logging, get_logger
from nsqworker.message import Message, Retry
from nsqworker.settings import Settings
from nsqworker.stats import (
    TaskStats,
    WorkerStats,
)
from nsqworker.task import Registry
from nsqworker.task_runner import TaskRunner, dead_letter_envelope
from nsqworker.time_limits import AbandonedThreads
from nsqworker.transport import Transport, create_transport
from nsqworker.watchdog import LoopWatchdog

__all__ = ["Worker", "dead_letter_envelope", "event_loop_factory", "run_worker"]

_HAND_BACK = Retry(0.0, backoff=False)  # a message past max_tasks_per_child: unstarted

log = get_logger("nsqworker.worker")
_copy_context = contextvars.copy_context


# --- the worker ----------------------------------------------------------------------


class Worker:
    """Runs every task of ``registry`` on this process's event loop.

    ``async with Worker(registry, settings):`` starts the tasks and drains them on exit;
    ``await worker.run()`` serves until SIGTERM/SIGINT or :meth:`request_stop`.
    ``settings`` default to ``Settings.load()`` (environment and config file);
    ``transport`` defaults to the one ``settings.transport`` names (a
    :class:`~nsqworker.memory.MemoryTransport` instance in tests, say).
    """

    def __init__(
        self,
        registry: Registry,
        settings: Settings | None = None,
        *,
        transport: Transport | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings if settings is not None else Settings.load()
        self._transport = transport
        self._runners: list[TaskRunner] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._stop_task: asyncio.Future[None] | None = None
        self._stop_requested = False
        self._stop_event: asyncio.Event | None = None
        self._forced = False
        self._ctrl_c = False  # whether SIGINT is ours (not under a supervisor)
        self._unregister_metrics: Callable[[], None] | None = None
        self.watchdog: LoopWatchdog | None = None
        self._summaries: asyncio.Task[None] | None = None
        #: Messages this process may still start (max_tasks_per_child), or None: no limit.
        self._budget: int | None = None
        #: Why this process should be replaced after a drain (see request_recycle), or None.
        self.recycle: str | None = None
        #: Called (on the loop) when a recycle is first requested.
        self.recycle_listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"<Worker tasks={len(self.registry)} ready={self.ready}>"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def runners(self) -> tuple[TaskRunner, ...]:
        """The task runners, one per task, in the registry's order (empty before
        :meth:`start`)."""
        return tuple(self._runners)

    @property
    def transport(self) -> Transport:
        """The transport the tasks run on (built from the settings on first use)."""
        if self._transport is None:
            self._transport = create_transport(self.settings)
        return self._transport

    @property
    def ready(self) -> bool:
        """True while running with every task subscribed (or, on NSQ, its topic on no
        nsqd yet)."""
        runners = self._runners
        ok = self._started and self._stop_task is None and bool(runners)
        return ok and all(r.ready for r in runners)

    @property
    def live(self) -> bool:
        """False while the watchdog sees the event loop blocked (any thread may ask)."""
        return self.watchdog is None or not self.watchdog.blocked

    async def start(self) -> None:
        """Subscribe every task and connect; returns once each subscription tried once."""
        if self._started:
            raise RuntimeError("this Worker was already started; make a new one")
        if not len(self.registry):
            raise ConfigurationError("no tasks to run: the registry is empty")
        self._started = True
        self._loop = asyncio.get_running_loop()
        settings = self.settings
        _logs.configure_logging_by_default(settings.log_level, settings.log_format)
        transport = self.transport
        hooks: Hooks = getattr(self.registry, "hooks", None) or Hooks()
        wrap = None
        if settings.max_tasks_per_child > 0:  # else the hot path is left as it is
            self._budget = settings.max_tasks_per_child
            wrap = self._counted
        abandoned = AbandonedThreads(settings.max_abandoned_threads)  # shared by the tasks
        for spec in self.registry:
            runner = TaskRunner(
                spec, settings, transport, hooks=hooks, abandoned=abandoned,
                request_recycle=self.request_recycle, wrap_callback=wrap,
            )  # fmt: skip
            self._runners.append(runner)
        results = await asyncio.gather(*(r.start() for r in self._runners), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.stop(0)
            raise errors[0]
        from nsqworker.telemetry.metrics import register_worker_metrics

        self._unregister_metrics = register_worker_metrics(self)
        if settings.watchdog_timeout > 0:
            self.watchdog = LoopWatchdog.start_for(self.registry, settings.watchdog_timeout)
        if (every := settings.log_summary_interval) > 0:
            self._summaries = asyncio.create_task(_logs.every(every, self._log_summaries))
        waiting = [r.spec.name for r in self._runners if not r.subscribed]
        if waiting:  # each subscription logs "subscribed on ..." when it gets there
            log.warning("not subscribed yet; retrying", pid=os.getpid(), waiting_for=waiting)
        else:
            log.info("worker started", pid=os.getpid(), tasks=[s.name for s in self.registry])

    def inflight(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Messages in flight beyond the hot path, oldest first (at most ``limit``):
        task, id, attempts, age in seconds, state (running, waiting) and the handler's
        asyncio task or thread; what ``/inflight`` and ``nsqworker inflight`` show."""
        rows: list[dict[str, Any]] = []
        for runner in self._runners:
            rows += runner.inflight()
        rows.sort(key=lambda row: -row["age_s"])
        return rows[:limit]

    def handled(self) -> int:
        """Messages this worker's tasks have settled so far (finished, retried, rejected)."""
        return sum(r.handled() for r in self._runners)

    def _counted(self, callback: Callback) -> Callback:
        """``callback`` that starts at most the process's ``max_tasks_per_child``
        messages (over all its tasks); the last one starts the drain, and what arrives
        after it is handed back at once, unstarted, for the next process."""

        def counted(msg: Message) -> Any:  # the callback's own return types
            left = self._budget
            if left is None or left <= 0:
                return _HAND_BACK
            self._budget = left - 1
            if left == 1:
                self._budget_spent()
            return callback(msg)

        return counted

    def _budget_spent(self) -> None:
        limit = self.settings.max_tasks_per_child
        self.request_recycle(f"started {limit} messages (max_tasks_per_child {limit})")
        # Take no more now (the drain pauses every task's flow); the supervisor starts
        # the replacement when this process exits. run() returns once drained.
        self.request_stop()
        if self._stop_task is None:  # as stop() starts it; run() and __aexit__ await it
            self._stop_task = asyncio.ensure_future(self._stop(self.settings.drain_timeout))

    def _log_summaries(self) -> None:
        for r in self._runners:  # each busy task's periodic info line
            r.log_summary()

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop taking messages, let running handlers finish within ``drain_timeout``
        (default ``settings.drain_timeout``), retry the rest, close. Safe to call twice."""
        if self._stop_task is None:
            timeout = self.settings.drain_timeout if drain_timeout is None else drain_timeout
            self._stop_task = asyncio.ensure_future(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float) -> None:
        if not self._runners:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        log.info("worker draining", timeout=timeout)
        # 1. Each task: pause the flow, wait for its handlers (kept alive), retry the rest.
        await asyncio.gather(*(r.stop(timeout) for r in self._runners), return_exceptions=True)
        # 2. Sync handlers' threads: let idle ones exit; wait for busy ones until the
        # deadline, except those of messages already retried at their time limit: they
        # are settled, and nothing can stop their threads (the process exits without them).
        for runner in self._runners:
            runner.shutdown_pool()
        while self._threads()[0] and loop.time() < deadline and not self._forced:
            await asyncio.sleep(0.02)
        stuck, overdue = self._threads()
        if stuck:
            log.warning("sync handlers still running after the drain", threads=stuck)
        if overdue:
            log.info("not waiting for sync handlers past their time limit", threads=overdue)
        # 2b. What bound handlers hold open (a Spark session), now that none runs.
        for runner in self._runners:
            await runner.close()
        # 3. The transport's publishers, the watchdog, the OpenTelemetry view of our stats.
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._unregister_metrics is not None:
            self._unregister_metrics()
        try:
            await self.transport.close()
        except Exception:
            log.exception("closing the transport failed")
        if self._summaries is not None:  # and the last window, so short runs get one too
            self._summaries.cancel()
            self._log_summaries()
        log.info("worker stopped")

    def _threads(self) -> tuple[int, int]:
        """Sync handlers' threads still alive: ``(to wait for, past their time limit)``,
        the latter running a message already retried at its limit."""
        alive = overdue = 0
        for runner in self._runners:
            threads, past_limit = runner.threads()
            alive += threads
            overdue += past_limit
        return max(alive - overdue, 0), overdue

    async def run(self) -> None:
        """Start (unless started), serve until SIGTERM/SIGINT or :meth:`request_stop`,
        then drain within ``settings.drain_timeout``. A second SIGINT forces the stop."""
        loop = self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stop_requested:
            self._stop_event.set()
        installed = self._install_signal_handlers(loop)
        try:
            if not self._started:
                await self.start()
            await self._stop_event.wait()
        finally:
            try:
                await self.stop()
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)

    def request_recycle(self, reason: str) -> None:
        """Ask to be replaced after a drain (a sync handler that outlived its time limit
        holds a thread that cannot be stopped). Under ``nsqworker run`` the supervisor
        drains this process and starts a new one; an embedded Worker logs it once."""
        if self.recycle is None:
            self.recycle = reason
            log.warning("this worker process should be replaced after a drain", reason=reason)
            for listener in self.recycle_listeners:  # the child's heartbeat: tell at once
                listener()

    def request_stop(self) -> None:
        """Ask :meth:`run` to drain and return; safe from any thread and signal handler."""
        self._stop_requested = True
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed
                pass

    def force_stop(self) -> None:
        """Stop now: retry every running message and cancel handlers (the second Ctrl-C)."""
        self._forced = True
        self.request_stop()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._force)
            except RuntimeError:
                pass

    def _force(self) -> None:
        for runner in self._runners:
            runner.force_stop()

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # e.g. supervised children: the supervisor decides about Ctrl-C
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append(sig)
        self._ctrl_c = signal.SIGINT in installed
        return installed

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self._stop_requested:
            if self._ctrl_c:
                log.info(f"{name}: draining; press Ctrl-C again to stop at once")
            else:  # a supervised worker: the supervisor logged which signal it got
                log.debug(f"{name}: draining")
            self.request_stop()
        elif sig == signal.SIGINT and not self._forced:
            log.warning(f"{name} again: retrying running messages and stopping now")
            self.force_stop()

    def stats(self) -> WorkerStats:
        """Per-task counters, gauges and duration histograms, as plain data."""
        if self._runners:
            tasks = {r.spec.name: r.stats() for r in self._runners}
        else:
            tasks = {s.name: TaskStats(s.name, s.topic, s.channel) for s in self.registry}
        return WorkerStats(
            pid=os.getpid(), ready=self.ready, tasks=tasks, recycle=self.recycle,
            inflight=self.inflight() if self._runners else [],
        )  # fmt: skip


# --- entry point for worker processes ------------------------------------------------


def event_loop_factory(
    settings: Settings | None = None, use_uvloop: bool | None = None
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` when it is installed and allowed, else None (asyncio).

    ``use_uvloop`` None follows ``settings.uvloop`` when that setting exists (default on).
    """
    if use_uvloop is None:
        use_uvloop = bool(getattr(settings, "uvloop", True))
    if not use_uvloop:
        return None
    try:
        module = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = module.new_event_loop
    return factory


def run_worker(
    registry: Registry, settings: Settings | None = None, *,
    use_uvloop: bool | None = None, configure_logs: bool = True,
) -> None:  # fmt: skip
    """Run a Worker for ``registry`` until SIGTERM/SIGINT, on uvloop when available.

    The blocking entry point of a worker process; logging is configured from
    ``settings`` first unless ``configure_logs`` is False.
    """
    settings = settings if settings is not None else Settings.load()
    if configure_logs:
        configure_logging(settings.log_level, settings.log_format)
    worker = Worker(registry, settings)
    with asyncio.Runner(loop_factory=event_loop_factory(settings, use_uvloop)) as runner:
        runner.run(worker.run())
