"""One worker process: a Registry's tasks, each on its own Consumer, on one event loop.

``Worker(registry, settings)`` builds a :class:`~nsqworker.nsq.consumer.Consumer` per task.
Its callback runs the handler and turns the result into an outcome (see
:mod:`nsqworker.task`); its give-up hook is the dead-letter path. Async handlers are
awaited on the loop; the consumer starts them eagerly, so one that never suspends
finishes inline with no Task. Sync handlers never run on the loop: each sync task has a
small thread pool, sized to its max_in_flight and grown on demand, whose threads hand
results back in batches (one wake-up of the loop per batch, not per message).

Per task the worker keeps a handler-duration histogram and a dead-letter count; the
consumer's own counters complete :meth:`Worker.stats`.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import inspect
import logging
import os
import signal
import threading
from bisect import bisect_left
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any, Protocol, Self

from opentelemetry import context as otel_context

from nsqworker import logging as _logs
from nsqworker.dead_letters import dead_letter_envelope, publish_dead_letter
from nsqworker.errors import ConfigurationError
from nsqworker.logging import TrafficSummary, configure_logging, get_logger
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.consumer import DEFERRED, Consumer
from nsqworker.nsq.eager import resume
from nsqworker.nsq.message import FINISH, Message, MessageOwner, Outcome, Requeue
from nsqworker.nsq.producer import Producer
from nsqworker.pool import LoopOwner, ThreadPool, run_traced
from nsqworker.settings import Settings
from nsqworker.stats import (
    DURATION_BUCKETS,
    FROM_CONSUMER,
    DurationHistogram,
    TaskStats,
    WorkerStats,
)
from nsqworker.task import Registry, Retry, TaskSpec, describe_outcome, outcome_of_error
from nsqworker.watchdog import LoopWatchdog

__all__ = ["Worker", "dead_letter_envelope", "event_loop_factory", "run_worker"]

log = get_logger("nsqworker.worker")
_copy_context = contextvars.copy_context


# --- telemetry seam ------------------------------------------------------------------


class Instrumentation(Protocol):
    """``telemetry.TaskInstrumentation``: ``start`` returns None or a token
    ``(span, context, msg)`` whose context is attached while the handler runs; ``end``
    follows every ``start`` that returned a token, and every one when ``timed``."""

    timed: bool

    def start(self, msg: Message) -> Any: ...

    def end(self, token: Any, outcome: Outcome | None, error: Any, duration: float) -> None: ...


def _instrumentation(spec: TaskSpec, settings: Settings) -> Instrumentation:
    from nsqworker.telemetry.tracing import TaskInstrumentation

    return TaskInstrumentation(spec, settings)


# --- one task ------------------------------------------------------------------------


class _TaskRunner:
    """The per-task half of the worker: the consumer's callback and give-up hook."""

    consumer: Consumer

    def __init__(self, worker: Worker, spec: TaskSpec, max_in_flight: int) -> None:
        self.worker = worker
        self.spec = spec
        self.loop = asyncio.get_running_loop()
        # A task factory (``@spark_task``) may want the worker's settings: its handler
        # then carries bind_settings(settings) -> the handler to run.
        bind = getattr(spec.func, "bind_settings", None)
        self.func = bind(worker.settings) if callable(bind) else spec.func
        self.inst = _instrumentation(spec, worker.settings)
        self.log = log.bind(task=spec.name, topic=spec.topic, channel=spec.channel)
        self.log_debug = self.log.is_enabled_for(logging.DEBUG)
        self.summary = TrafficSummary(DURATION_BUCKETS, self.loop.time())
        self.rejected: dict[str, BaseException] = {}  # Reject errors, for the dead-letter line
        self.bounds = DURATION_BUCKETS
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)
        self.dur_sum = 0.0
        self.dead_lettered = 0
        hook = spec.on_dead_letter
        call = getattr(hook, "__call__", None)  # noqa: B004 - async callable objects count
        self.hook_async = inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(call)
        self.owner: MessageOwner | None = None
        self.proxy: LoopOwner | None = None
        self.pool: ThreadPool | None = None
        if not spec.is_async:
            name = f"nsqworker-{getattr(spec.func, '__name__', 'task')}"
            self.pool = ThreadPool(self.func, self.finish_sync, self.loop, max_in_flight, name)
        self.callback: Callable[[Message], Any] = (
            self.call_async if spec.is_async else self.call_sync
        )

    def call_async(self, msg: Message) -> Any:
        """Run an async handler: its first step inline, a Task only if it suspends.

        A handler that never awaits is finished before this returns, in the same read
        burst; that is the throughput path, so it is kept free of extra coroutines.
        """
        token = self.inst.start(msg)
        start = perf_counter()
        context = _copy_context()
        if token is not None:
            # The span is made current in this message's own Context only: the handler,
            # and the Task that finishes it if it suspends, run in it; nothing to detach.
            context.run(otel_context.attach, token[1])
        try:
            coro = self.func(msg)
            yielded = context.run(coro.send, None)
        except StopIteration:
            return self.succeeded(msg, perf_counter() - start, token, context)
        except (Exception, asyncio.CancelledError) as exc:
            return self.failed(msg, exc, perf_counter() - start, token, context)
        task = self._rest(coro, yielded, msg, start, token)
        return self.loop.create_task(task, context=context)

    async def _rest(
        self,
        coro: Coroutine[Any, Any, Any],
        yielded: Any,
        msg: Message,
        start: float,
        token: Any,
    ) -> Outcome | None:
        try:
            await resume(coro, yielded)
        except (Exception, asyncio.CancelledError) as exc:
            return self.failed(msg, exc, perf_counter() - start, token, None)
        return self.succeeded(msg, perf_counter() - start, token)

    def succeeded(
        self, msg: Message, duration: float, token: Any, context: Any = None
    ) -> Outcome | None:
        """The outcome of a handler that returned, with its log line and telemetry.

        ``context``: the handler's own Context, for the log line's trace ids, when this
        runs outside it."""
        if duration < 0.001:
            self.counts[0] += 1
        else:
            self.counts[bisect_left(self.bounds, duration)] += 1
        self.dur_sum += duration
        outcome = None if msg._responded else FINISH
        if self.log_debug:
            if token is not None and context is not None:
                context.run(self.log_done, msg, outcome, duration)
            else:
                self.log_done(msg, outcome, duration)
        if token is not None or self.inst.timed:
            self.inst.end(token, outcome, None, duration)
        return outcome

    def call_sync(self, msg: Message) -> object:
        """Hand a sync handler to the pool; its outcome reaches the consumer later."""
        owner = msg._owner
        if owner is not self.owner and owner is not None:
            self.owner, self.proxy = owner, LoopOwner(self.loop, owner)
        msg._owner = self.proxy
        token = self.inst.start(msg)
        assert self.pool is not None
        self.pool.submit(msg, _copy_context(), token)
        return DEFERRED

    def finish_sync(
        self, msg: Message, ctx: contextvars.Context, token: Any,
        error: BaseException | None, duration: float,
    ) -> None:  # fmt: skip
        """On the loop: record a sync handler's result and hand its outcome on."""
        if error is not None:
            outcome = self.failed(msg, error, duration, token, ctx)
        else:
            self.counts[bisect_left(self.bounds, duration)] += 1
            self.dur_sum += duration
            outcome = None if msg._responded else FINISH
            if self.log_debug:
                ctx.run(run_traced, token, self.log_done, msg, outcome, duration)
            if token is not None or self.inst.timed:
                self.inst.end(token, outcome, None, duration)
        self.consumer.complete(msg, outcome)

    def log_done(self, msg: Message, outcome: Outcome | None, duration: float) -> None:
        ms = round(duration * 1000, 3)
        self.log.debug(describe_outcome(outcome), id=msg.id, attempts=msg.attempts, duration_ms=ms)

    def failed(
        self, msg: Message, exc: BaseException, duration: float, token: Any,
        ctx: contextvars.Context | None,
    ) -> Outcome | None:  # fmt: skip
        """The outcome of a handler that raised, with its log line and telemetry.

        ``ctx``: the handler's Context, to log in (with the span current), when this
        runs outside it."""
        self.counts[bisect_left(self.bounds, duration)] += 1
        self.dur_sum += duration
        outcome = outcome_of_error(msg, exc)
        if isinstance(outcome, Requeue) and outcome.delay is None:  # picked here, to log it
            outcome = Requeue(self.consumer.requeue_delay(msg.attempts), backoff=outcome.backoff)
        if ctx is None:
            self.log_failure(msg, exc, outcome, duration)
        else:
            ctx.run(run_traced, token, self.log_failure, msg, exc, outcome, duration)
        self.inst.end(token, outcome, exc, duration)
        return outcome

    def log_failure(
        self, msg: Message, exc: BaseException, outcome: Outcome | None, duration: float
    ) -> None:
        fields = {"id": msg.id, "attempts": msg.attempts, "duration_ms": round(duration * 1e3, 3)}
        error = type(exc).__name__
        if isinstance(exc, asyncio.CancelledError):  # the worker is stopping
            self.log.info("cancelled while stopping; requeued", **fields)
        elif outcome is None:
            what = "handler raised after answering the message; nothing more sent"
            self.log.warning(what, error=error, exc_info=exc, **fields)
        elif isinstance(outcome, Requeue):  # a Retry's reason says why: no traceback
            retry, delay = isinstance(exc, Retry), outcome.delay
            why = exc.reason or error if isinstance(exc, Retry) else error
            self.log.warning("req", delay=delay, error=why, exc_info=not retry and exc, **fields)
        else:  # a Reject: logged once, with its traceback, by give_up
            self.rejected[msg.id] = exc

    async def give_up(self, msg: Message, reason: str) -> None:
        """The dead-letter path: publish to dead_letter_topic, then on_dead_letter.

        Any exception propagates, so the consumer REQs the message instead of FINing it.
        """
        spec = self.spec
        exc = self.rejected.pop(msg.id, None)
        self.log.error("dead-letter", id=msg.id, attempts=msg.attempts, reason=reason, exc_info=exc)
        if spec.dead_letter_topic is not None:
            producer = self.worker._dead_letter_producer(msg)
            await publish_dead_letter(producer, spec.dead_letter_topic, msg, reason, spec.name)
        hook = spec.on_dead_letter
        if hook is not None:
            if self.hook_async:
                await hook(msg, reason)
            else:
                ctx = contextvars.copy_context()
                await self.loop.run_in_executor(None, ctx.run, hook, msg, reason)
        self.dead_lettered += 1

    def stats(self) -> TaskStats:
        spec, counts, consumer = self.spec, list(self.counts), self.consumer
        cs = consumer.stats()
        return TaskStats(
            spec.name, spec.topic, spec.channel, consumer.subscribed, consumer.ready,
            dead_lettered=self.dead_lettered, connections=cs.connected,
            buffered=sum(c.lane == "bulk" for c in cs.connections),
            connection_errors=dict(consumer.connection_errors),
            duration=DurationHistogram(list(self.bounds), counts, self.dur_sum, sum(counts)),
            **{key: getattr(cs, key) for key in FROM_CONSUMER.split()},
        )  # fmt: skip


# --- the worker ----------------------------------------------------------------------


class Worker:
    """Runs every task of ``registry`` on this process's event loop.

    ``async with Worker(registry, settings):`` starts the consumers and drains them on
    exit; ``await worker.run()`` serves until SIGTERM/SIGINT or :meth:`request_stop`.
    ``settings`` default to ``Settings.load()`` (environment and config file).
    """

    def __init__(self, registry: Registry, settings: Settings | None = None) -> None:
        self.registry = registry
        self.settings = settings if settings is not None else Settings.load()
        self._runners: list[_TaskRunner] = []
        self._producers: dict[str, Producer] = {}
        self._config: ConnectionConfig | None = None
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

    def __repr__(self) -> str:
        return f"<Worker tasks={len(self.registry)} ready={self.ready}>"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def ready(self) -> bool:
        """True while running with every task subscribed, or its topic on no nsqd yet."""
        runners = self._runners
        ok = self._started and self._stop_task is None and bool(runners)
        return ok and all(r.consumer.ready for r in runners)

    @property
    def live(self) -> bool:
        """False while the watchdog sees the event loop blocked (any thread may ask)."""
        return self.watchdog is None or not self.watchdog.blocked

    async def start(self) -> None:
        """Build one consumer per task and connect them; returns once each tried once."""
        if self._started:
            raise RuntimeError("this Worker was already started; make a new one")
        if not len(self.registry):
            raise ConfigurationError("no tasks to run: the registry is empty")
        self._started = True
        self._loop = asyncio.get_running_loop()
        settings = self.settings
        _logs.configure_logging_by_default(settings.log_level, settings.log_format)
        self._config = ConnectionConfig.from_settings(settings)
        for spec in self.registry:
            max_in_flight = spec.max_in_flight or settings.max_in_flight
            runner = _TaskRunner(self, spec, max_in_flight)
            requeue_delay = spec.requeue_delay
            runner.consumer = Consumer(
                spec.topic, spec.channel, runner.callback, settings,
                max_in_flight=max_in_flight, on_give_up=runner.give_up, name=spec.name,
                max_attempts=spec.max_attempts or settings.max_attempts,
                requeue_delay=settings.requeue_delay if requeue_delay is None else requeue_delay,
                connection_config=self._config,
            )  # fmt: skip
            self._runners.append(runner)
        results = await asyncio.gather(
            *(r.consumer.start() for r in self._runners), return_exceptions=True
        )
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
        waiting = [r.spec.name for r in self._runners if not r.consumer.subscribed]
        if waiting:  # each consumer logs "subscribed on ..." when it gets there
            log.warning("not subscribed yet; retrying", pid=os.getpid(), waiting_for=waiting)
        else:
            log.info("worker started", pid=os.getpid(), tasks=[s.name for s in self.registry])

    def _log_summaries(self) -> None:
        for r in self._runners:  # each busy task's periodic info line
            r.summary.log(r.log, r.consumer.stats(), r.counts, r.loop.time())

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop taking messages, let running handlers finish within ``drain_timeout``
        (default ``settings.drain_timeout``), REQ the rest, close. Safe to call twice."""
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
        # 1. Each consumer: RDY 0, wait for its handlers (TOUCHing), REQ the rest, close.
        await asyncio.gather(
            *(r.consumer.stop(timeout) for r in self._runners), return_exceptions=True
        )
        # 2. Sync handlers' threads: let idle ones exit; wait for busy ones until the deadline.
        pools = [r.pool for r in self._runners if r.pool is not None]
        for pool in pools:
            pool.shutdown()
        while any(p.alive() for p in pools) and loop.time() < deadline and not self._forced:
            await asyncio.sleep(0.02)
        stuck = sum(p.alive() for p in pools)
        if stuck:
            log.warning("sync handlers still running after the drain", threads=stuck)
        # 3. Dead-letter producers, the watchdog, and the OpenTelemetry view of our stats.
        if self.watchdog is not None:
            self.watchdog.stop()
        if self._unregister_metrics is not None:
            self._unregister_metrics()
        producers, self._producers = list(self._producers.values()), {}
        await asyncio.gather(*(p.close() for p in producers), return_exceptions=True)
        if self._summaries is not None:  # and the last window, so short runs get one too
            self._summaries.cancel()
            self._log_summaries()
        log.info("worker stopped")

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
        """Stop now: REQ every running message and cancel handlers (the second Ctrl-C)."""
        self._forced = True
        self.request_stop()
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._force)
            except RuntimeError:
                pass

    def _force(self) -> None:
        for runner in self._runners:
            runner.consumer.force_stop()

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
            log.warning(f"{name} again: requeueing running messages and stopping now")
            self.force_stop()

    def _dead_letter_producer(self, msg: Message) -> Producer:
        """The producer for dead letters: settings' nsqd, else the message's own nsqd."""
        key = "" if self.settings.nsqd_tcp_addresses else msg.nsqd_address
        producer = self._producers.get(key)
        if producer is None:
            producer = self._producers[key] = Producer(
                [key] if key else None, settings=self.settings,
                connection_config=self._config, envelope=False,
            )  # fmt: skip
        return producer

    def stats(self) -> WorkerStats:
        """Per-task counters, gauges and duration histograms, as plain data."""
        if self._runners:
            tasks = {r.spec.name: r.stats() for r in self._runners}
        else:
            tasks = {s.name: TaskStats(s.name, s.topic, s.channel) for s in self.registry}
        return WorkerStats(pid=os.getpid(), ready=self.ready, tasks=tasks)


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
