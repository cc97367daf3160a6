"""One task inside a worker: run its handler, decide the outcome, log and trace it.

A :class:`TaskRunner` is built with everything its task needs (spec, settings,
transport, hooks) and builds its own subscription and
:class:`~nsqworker.dispatch.Dispatcher`, whose callback and reject hook it is; the
worker only starts and stops runners and asks them for stats. Async handlers run eagerly (the first step inline, a Task only if they
suspend); sync handlers go to the task's thread pool (:mod:`nsqworker.pool`). Around the
handler: the typed body is validated (:mod:`nsqworker.bodies`), the hooks run
(:mod:`nsqworker.hooks`), the time limit is kept, the span is started and ended
(:mod:`nsqworker.telemetry`), failures are logged, and a rejected message goes through the
dead-letter chain (``dead_letter_topic``, ``on_dead_letter``, dead-letter hooks).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from bisect import bisect_left
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any, Protocol

from opentelemetry import context as otel_context

from nsqworker.bodies import typed_handler
from nsqworker.consumer import open_subscription
from nsqworker.dead_letters import DeadLetterChain, dead_letter_envelope
from nsqworker.dispatch import DEFERRED, MAX_ATTEMPTS_REASON, Callback, Dispatcher, Policy
from nsqworker.eager import Starter
from nsqworker.errors import ConfigurationError
from nsqworker.hooks import Hooks, run_after, run_on_error, with_hooks
from nsqworker.logging import TrafficSummary, get_logger, histogram_quantile
from nsqworker.message import FINISH, Message, Outcome, Stage
from nsqworker.outcomes import (
    TIME_LIMIT,
    Publish,
    Reject,
    Retry,
    TaskTimeout,
    describe_outcome,
    last_error,
    outcome_of_error,
)
from nsqworker.pool import ThreadPool, run_traced
from nsqworker.results import planned, publish_results
from nsqworker.safe_text import one_line
from nsqworker.settings import Settings
from nsqworker.slow import SlowWatch
from nsqworker.stats import (
    DURATION_BUCKETS,
    FINE_BUCKETS,
    DurationHistogram,
    TaskStats,
    coarse_counts,
)
from nsqworker.task import TaskSpec
from nsqworker.time_limits import AbandonedThreads, timeout_reject
from nsqworker.transport import Capabilities, Transport

__all__ = ["TaskRunner", "check_needs", "dead_letter_envelope"]

log = get_logger("nsqworker.worker")
_copy_context = contextvars.copy_context
_ANSWERED, _SETTLED = Stage.ANSWERED, Stage.SETTLED


# --- telemetry seam ------------------------------------------------------------------


class Instrumentation(Protocol):
    """``telemetry.TaskInstrumentation``: ``start`` returns None or a token
    ``(span, context, msg)`` whose context is attached while the handler runs; ``end``
    follows every ``start`` that returned a token, and every one when ``timed``."""

    timed: bool

    def start(self, msg: Message) -> Any: ...

    def end(self, token: Any, outcome: Outcome | None, error: Any, duration: float) -> None: ...


def _instrumentation(spec: TaskSpec, settings: Settings, caps: Capabilities) -> Instrumentation:
    from nsqworker.telemetry.tracing import TaskInstrumentation

    return TaskInstrumentation(spec, settings, capabilities=caps)


def check_needs(spec: TaskSpec, caps: Capabilities) -> None:
    """Refuse a task that needs a capability its transport lacks (``handler.needs``:
    capability name -> why, set by ``@rpc``)."""
    needs: dict[str, str] = getattr(spec.func, "needs", None) or {}
    for capability, why in needs.items():
        if not getattr(caps, capability, False):
            kind = getattr(spec.func, "kind", "a task")
            raise ConfigurationError(
                f"task {spec.name!r} ({kind}) needs a transport with {capability} ({why}); "
                f"transport {caps.name!r} has not"
            )


# --- one task ------------------------------------------------------------------------


def _no_recycle(reason: str) -> None:
    log.warning("this worker process should be replaced after a drain", reason=reason)


class TaskRunner:
    """One task of a worker: its subscription and dispatcher, the handler around them
    (the dispatcher's callback and reject hook), its counters and telemetry.

    ``hooks``: the registry's, run before the task's own. ``request_recycle(reason)``
    asks for this process to be replaced after a drain (a sync handler outlived its
    time limit). ``wrap_callback`` wraps the dispatcher's callback (the process-wide
    ``max_tasks_per_child`` budget). ``abandoned``: the process's count of sync
    handlers' threads left running past their time limit (``timeout_action``
    ``abandon``), shared by its tasks. Build it on the loop it will run on.
    """

    def __init__(
        self,
        spec: TaskSpec,
        settings: Settings,
        transport: Transport,
        *,
        hooks: Hooks | None = None,
        request_recycle: Callable[[str], None] = _no_recycle,
        wrap_callback: Callable[[Callback], Callback] | None = None,
        abandoned: AbandonedThreads | None = None,
    ) -> None:
        caps = transport.capabilities
        check_needs(spec, caps)
        self.spec = spec
        self.settings = settings
        self.transport = transport
        self._request_recycle = request_recycle
        self.loop = asyncio.get_running_loop()
        self.starter = Starter(self.loop)
        policy = Policy.from_settings(
            settings, max_in_flight=spec.max_in_flight, max_attempts=spec.max_attempts,
            retry_delay=spec.retry_delay,
        )  # fmt: skip
        # A task factory (``@spark_task``) may want the worker's settings: its handler
        # then carries bind_settings(settings) -> the handler to run.
        bind = getattr(spec.func, "bind_settings", None)
        func = bind(settings) if callable(bind) else spec.func
        #: What the bound handler holds open (@spark_session_task's session), closed by
        #: the Worker once it has drained: ``async close()`` on the handler, or None.
        self.close_handler: Callable[[], Coroutine[Any, Any, None]] | None = getattr(
            func, "close", None
        )
        if spec.body is not None:  # a typed body: validated before the handler
            func = typed_handler(func, spec.body, Reject, settings.typed_body_max_bytes)
        hooks = (hooks or Hooks()) + spec.hooks
        self.func = with_hooks(func, hooks, spec.is_async, self.loop)
        self.after_hooks = hooks.after
        self.error_hooks = hooks.on_error
        self.timeout = spec.timeout if spec.timeout is not None else settings.task_timeout
        #: From this delivery on, a time limit reached dead-letters the message (0: never).
        self.timeout_dead_letter = settings.timeout_dead_letter_attempts
        #: What a time limit reached does (nsqworker.time_limits).
        self.timeout_action = spec.timeout_action or settings.timeout_action
        self.abandoned = abandoned or AbandonedThreads(settings.max_abandoned_threads)
        # Messages whose handler ran past the time limit: cancelled (async) or given back
        # while their thread still runs (sync); and the sync handlers' limit timers.
        self.expired: set[Message] = set()
        self.overdue: dict[Message, asyncio.TimerHandle] = {}
        #: Sync handlers' messages whose thread was left running (settled, slot freed).
        self.left_running: set[Message] = set()
        self.inst = _instrumentation(spec, settings, caps)
        self.log = log.bind(task=spec.name, topic=spec.topic, channel=spec.channel)
        self.dead_letters = DeadLetterChain(spec, transport, hooks.on_dead_letter, self.log)
        self.log_debug = self.log.is_enabled_for(logging.DEBUG)
        self.summary = TrafficSummary(FINE_BUCKETS, self.loop.time())
        # Durations in fine buckets (summary quantiles close to the real figures); the
        # coarse DURATION_BUCKETS histogram of stats() is summed from them.
        self.bounds = FINE_BUCKETS
        self.counts = [0] * (len(FINE_BUCKETS) + 1)
        self.dur_sum = 0.0
        self.last_error: dict[str, Any] | None = None  # for /status and the console
        self.slow_floor = settings.slow_handler_after
        self.pool: ThreadPool | None = None
        #: Sync handlers' results being published (they complete their messages).
        self.publishing: set[asyncio.Task[None]] = set()
        if not spec.is_async:
            name = f"nsqworker-{getattr(spec.func, '__name__', 'task')}"
            self.pool = ThreadPool(
                self.func, self.finish_sync, self.loop, policy.max_in_flight, name
            )
        #: The dispatcher's callback (call_sync returns DEFERRED: it completes later).
        self.callback: Callback = self.call_async if spec.is_async else self.call_sync  # type: ignore[assignment]
        self.slow_watch = SlowWatch(
            self.on_slow, self.slow_after, self.pool.running_for if self.pool else None
        )
        subscription = open_subscription(
            transport, spec.topic, spec.channel, name=spec.name,
            max_in_flight=policy.max_in_flight,
            requests=getattr(spec.func, "serves_requests", False),  # @rpc: request/reply
        )  # fmt: skip
        self.dispatcher = Dispatcher(
            subscription, wrap_callback(self.callback) if wrap_callback else self.callback,
            policy, capabilities=caps, on_reject=self.dead_letters.run, name=spec.name,
            slow=self.slow_watch,
        )  # fmt: skip

    def call_async(self, msg: Message) -> Any:
        """Run an async handler as a Task whose first step runs here (nsqworker.eager):
        its outcome when that finished it, else the Task."""
        token = self.inst.start(msg)
        start = perf_counter()
        context = _copy_context()
        if token is not None:
            # The span is made current in this message's own Context only: the handler's
            # Task runs in it; nothing to detach.
            context.run(otel_context.attach, token[1])
        try:
            coro = self.func(msg)
        except Exception as exc:  # a wrapper that fails before making the coroutine
            return self.failed(msg, exc, perf_counter() - start, token, context)
        done, task = self.starter.start(self._rest(coro, msg, start, token), context)
        if done:  # finished in its first step: no loop turn, no done callback
            return task
        if self.timeout is not None:
            left = max(self.timeout - (perf_counter() - start), 0.0)
            timer = self.loop.call_later(left, self._expire, msg, task)
            task.add_done_callback(lambda _: timer.cancel())
        return task

    def _expire(self, msg: Message, task: asyncio.Task[Any]) -> None:
        """An async handler ran past its time limit: cancel it (it becomes TaskTimeout)."""
        if not task.done():
            self.expired.add(msg)
            task.cancel(TIME_LIMIT)

    async def _rest(
        self, coro: Coroutine[Any, Any, Any], msg: Message, start: float, token: Any
    ) -> Outcome | None:
        """The handler's coroutine to its end, then its outcome (publishing what it
        returned first, when there is something to publish)."""
        try:
            value = await coro
            if value is not None and self.publishes(value):
                await self.publish(msg, value)
        except (Exception, asyncio.CancelledError) as exc:
            error: BaseException = exc
            if msg in self.expired:  # our own cancel: the time limit, not a stop
                self.expired.discard(msg)
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                assert self.timeout is not None
                error = TaskTimeout(self.timeout)
                if self.error_hooks:  # the handler saw a cancel; its hooks see why
                    await run_on_error(self.error_hooks, msg, error)
            return self.failed(msg, error, perf_counter() - start, token, None)
        if self.expired and msg in self.expired:  # it answered its time limit itself (RPC)
            self.expired.discard(msg)
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
        return self.succeeded(msg, perf_counter() - start, token)

    def publishes(self, value: Any) -> bool:
        """Whether a handler's return value (not None) is published: with
        ``publish_to``, or when it is a Publish or a list holding them."""
        if self.spec.publish_to is not None or value.__class__ is Publish:
            return True
        return isinstance(value, list | tuple) and any(isinstance(v, Publish) for v in value)

    async def publish(self, msg: Message, value: Any) -> None:
        """Publish what ``value`` says on the task's transport (in the handler's
        Context, its span current); raises what fails, a bad value included."""
        plan = planned(value, self.spec.publish_to)
        envelope = self.settings.tracing_envelope
        await publish_results(self.transport, msg, plan, envelope=envelope)

    async def _publish_sync_result(
        self, msg: Message, value: Any, duration: float, token: Any
    ) -> None:
        """A sync handler returned something to publish: publish it on the loop, in the
        handler's Context with its span current, then hand the outcome on."""
        attached = otel_context.attach(token[1]) if token is not None else None
        began = perf_counter()
        try:
            await self.publish(msg, value)
        except (Exception, asyncio.CancelledError) as exc:
            outcome = self.failed(msg, exc, duration + perf_counter() - began, token, None)
        else:
            outcome = self.succeeded(msg, duration + perf_counter() - began, token)
        finally:
            if attached is not None:
                otel_context.detach(attached)
        self.dispatcher.complete(msg, outcome)

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
        stage = msg.stage  # msg.answered, inline: this runs once per message
        outcome = None if stage is _ANSWERED or stage is _SETTLED else FINISH
        if self.log_debug:
            if token is not None and context is not None:
                context.run(self.log_done, msg, outcome, duration)
            else:
                self.log_done(msg, outcome, duration)
        if self.after_hooks:
            run_after(self.after_hooks, msg, outcome, None, duration, loop=self.loop)
        if token is not None or self.inst.timed:
            self.inst.end(token, outcome, None, duration)
        return outcome

    def call_sync(self, msg: Message) -> object:
        """Hand a sync handler to the pool; its outcome reaches the dispatcher later."""
        token = self.inst.start(msg)
        assert self.pool is not None
        self.pool.submit(msg, _copy_context(), token)
        if self.timeout is not None:
            self.overdue[msg] = self.loop.call_later(self.timeout, self._overdue, msg, token)
        return DEFERRED

    def _overdue(self, msg: Message, token: Any) -> None:
        """A sync handler ran past its time limit. Its thread cannot be stopped: the
        message is settled now (retried, or dead-lettered), and either the thread is
        abandoned (``timeout_action`` ``abandon``, within ``max_abandoned_threads``) or
        it keeps its slot until it returns and the process asks to be replaced."""
        self.overdue.pop(msg, None)
        if msg.responded:
            return
        assert self.timeout is not None
        self.expired.add(msg)
        error = TaskTimeout(self.timeout)
        if self.error_hooks:  # on the loop: the handler's thread is still busy
            run_after(self.error_hooks, msg, error, loop=self.loop)
        outcome = self.failed(msg, error, self.timeout, token, None)
        if isinstance(outcome, Retry):
            msg.retry(outcome.delay, backoff=outcome.backoff)
        elif isinstance(outcome, Reject):  # timed out again: the dead-letter chain, now
            msg.move(Stage.ANSWERED)
            self.dispatcher.settle(msg, outcome)
        if self.timeout_action == "abandon":
            if self._abandon(msg):
                return
        else:
            self.log.warning(
                "a sync handler ran past its time limit; its thread cannot be stopped, so it "
                "keeps its slot until it returns, and this worker process is replaced after "
                "a drain (timeout_action abandon would leave the thread and keep the process)",
                id=msg.id, limit=self.timeout, timeout_action=self.timeout_action,
            )  # fmt: skip
        self._request_recycle(f"a sync handler of {self.spec.name} outlived its time limit")

    def _abandon(self, msg: Message) -> bool:
        """Leave ``msg``'s thread running, give its slot to a new one; False (with a
        warning) past ``max_abandoned_threads``."""
        assert self.pool is not None
        if not self.abandoned.take():
            self.log.warning(
                "a sync handler ran past its time limit with max_abandoned_threads threads "
                "already abandoned in this process; replacing the process instead",
                id=msg.id, limit=self.timeout, max_abandoned_threads=self.abandoned.limit,
            )  # fmt: skip
            return False
        if not self.pool.abandon(msg):  # its thread returned meanwhile: nothing to leave
            self.abandoned.release()
            return True
        self.left_running.add(msg)
        self.log.warning(
            "a sync handler ran past its time limit; its thread is left running "
            "(timeout_action abandon) and a new one takes its slot",
            id=msg.id, limit=self.timeout, abandoned=self.abandoned.count,
        )  # fmt: skip
        self.dispatcher.complete(msg, None)  # the slot is free: the message is settled
        return True

    def finish_sync(
        self, msg: Message, ctx: contextvars.Context, token: Any,
        error: BaseException | None, duration: float, result: Any = None,
    ) -> None:  # fmt: skip
        """On the loop: record a sync handler's result and hand its outcome on."""
        if self.overdue:
            timer = self.overdue.pop(msg, None)
            if timer is not None:
                timer.cancel()
        if self.expired and msg in self.expired:  # retried at its limit: its thread is done
            self.expired.discard(msg)
            if msg in self.left_running:  # abandoned: its slot was freed then
                self.left_running.discard(msg)
                self.abandoned.release()
                self.log.info("an abandoned sync handler returned", id=msg.id)
            else:
                self.dispatcher.complete(msg, None)
            return
        if error is None and result is not None and self.publishes(result):
            publishing = self._publish_sync_result(msg, result, duration, token)
            task = self.loop.create_task(publishing, context=ctx)  # it completes the message
            self.publishing.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(self.publishing.discard)
            return
        if error is not None:
            outcome = self.failed(msg, error, duration, token, ctx)
        else:
            self.counts[bisect_left(self.bounds, duration)] += 1
            self.dur_sum += duration
            outcome = None if msg.answered else FINISH
            if self.log_debug:
                ctx.run(run_traced, token, self.log_done, msg, outcome, duration)
            if self.after_hooks:
                run_after(self.after_hooks, msg, outcome, None, duration, loop=self.loop)
            if token is not None or self.inst.timed:
                self.inst.end(token, outcome, None, duration)
        self.dispatcher.complete(msg, outcome)

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
        rejected = timeout_reject(exc, msg.attempts, self.timeout_action, self.timeout_dead_letter)
        if rejected is not None:
            outcome = rejected
        elif (
            isinstance(outcome, Retry)
            and outcome.backoff
            and msg.attempts >= self.dispatcher.max_attempts
        ):  # the last allowed attempt failed: rejected now
            outcome = Reject(MAX_ATTEMPTS_REASON)
        if isinstance(outcome, Retry) and outcome.delay is None:  # picked here, to log it
            delay = self.dispatcher.retry_delay(msg.attempts)
            outcome = Retry(delay, outcome.reason, backoff=outcome.backoff)
        if not isinstance(exc, asyncio.CancelledError):
            self.last_error = last_error(msg, exc, outcome)
        if ctx is None:
            self.log_failure(msg, exc, outcome, duration)
        else:
            ctx.run(run_traced, token, self.log_failure, msg, exc, outcome, duration)
        if self.after_hooks:
            run_after(self.after_hooks, msg, outcome, exc, duration, loop=self.loop)
        self.inst.end(token, outcome, exc, duration)
        return outcome

    def log_failure(
        self, msg: Message, exc: BaseException, outcome: Outcome | None, duration: float
    ) -> None:
        fields = {"id": msg.id, "attempts": msg.attempts, "duration_ms": round(duration * 1e3, 3)}
        error = type(exc).__name__
        if isinstance(exc, asyncio.CancelledError):  # the worker is stopping
            self.log.info("cancelled while stopping; retried", **fields)
        elif outcome is None:
            what = "handler raised after answering the message; nothing more sent"
            self.log.warning(what, error=error, exc_info=exc, **fields)
        elif isinstance(outcome, Retry):  # a Retry's reason says why: no traceback
            retry, delay = isinstance(exc, Retry), outcome.delay
            why = exc.reason or error if isinstance(exc, Retry) else error
            self.log.warning(
                "retry",
                delay=round(delay, 3) if delay is not None else None,
                error=why,
                exc_info=not retry and exc,
                **fields,
            )
        else:  # a reject: its dead-letter line here, in the handler's span
            assert isinstance(outcome, Reject)
            self.dead_letters.handler_rejected(msg, one_line(outcome.reason), exc)

    def slow_after(self) -> float:
        """When a running handler is worth a warning: 10x this task's p99 handler
        duration, at least ``slow_handler_after`` seconds."""
        p99 = histogram_quantile(self.bounds, self.counts, 0.99) if any(self.counts) else 0.0
        return max(self.slow_floor, 10 * p99)

    def on_slow(self, msg: Message, seconds: float) -> None:
        """Log, once per message, a handler that runs longer than :meth:`slow_after`."""
        self.log.warning(
            "handler still running", id=msg.id, attempts=msg.attempts,
            running_s=round(seconds, 1), threshold_s=round(self.slow_after(), 1),
        )  # fmt: skip

    # --- lifecycle, for the worker -----------------------------------------------------

    async def start(self) -> None:
        """Subscribe and connect; returns once the subscription tried once."""
        self.dead_letters.start()
        await self.dispatcher.start()

    async def stop(self, timeout: float) -> None:
        """Drain the dispatcher (pause, let handlers finish within ``timeout``, retry
        the rest) and close the subscription."""
        await self.dispatcher.stop(timeout)
        self.starter.close()
        self.dead_letters.close()

    def force_stop(self) -> None:
        """Cut a running drain short."""
        self.dispatcher.force_stop()

    def shutdown_pool(self) -> None:
        """Let the idle threads of a sync task exit (busy ones finish their message)."""
        if self.pool is not None:
            self.pool.shutdown()

    def threads(self) -> tuple[int, int]:
        """Sync handlers' threads alive: ``(all, those running a message already retried
        at its time limit)``."""
        if self.pool is None:
            return 0, 0
        return self.pool.alive(), sum(msg in self.expired for msg in self.pool.running())

    async def close(self) -> None:
        """Close what the bound handler holds open (a Spark session), once it has
        drained; a failure is logged, never raised."""
        if self.close_handler is None:
            return
        try:
            await self.close_handler()
        except Exception:
            log.exception("closing the task's resources failed", task=self.spec.name)

    @property
    def ready(self) -> bool:
        """The subscription's readiness (see the transport)."""
        return self.dispatcher.ready

    @property
    def subscribed(self) -> bool:
        """True while the subscription has a live connection."""
        return self.dispatcher.subscribed

    def handled(self) -> int:
        """Messages settled so far (finished, retried, rejected)."""
        d = self.dispatcher
        return d.finished + d.retried + d.rejected

    def log_summary(self) -> None:
        """The task's periodic info line, when it was busy."""
        self.summary.log(self.log, self.dispatcher.stats(), self.counts, self.loop.time())

    def inflight(self) -> list[dict[str, Any]]:
        """This task's messages beyond the hot path, as plain data for /inflight."""
        now = self.dispatcher.subscription.clock()
        threads = self.pool.running() if self.pool is not None else {}
        rows = []
        for msg, state, handle in self.dispatcher.tracked():
            if handle is not None:
                where = f"task {handle.get_name()}"
            else:
                where = f"thread {threads[msg]}" if msg in threads else "-"
            rows.append({
                "task": self.spec.name, "id": msg.id, "attempts": msg.attempts,
                "age_s": round(now - msg.received_at, 3), "state": state, "handler": where,
            })  # fmt: skip
        return rows

    def stats(self) -> TaskStats:
        spec, counts, dispatcher = self.spec, coarse_counts(self.counts), self.dispatcher
        ds = dispatcher.stats()
        sub = ds.subscription
        return TaskStats(
            spec.name, spec.topic, spec.channel, dispatcher.subscribed, dispatcher.ready,
            dead_lettered=self.dead_letters.count, connections=sub.connected, rdy=sub.window,
            dead_letter_topic=spec.dead_letter_topic, last_error=self.last_error,
            buffered=sub.buffered, connection_errors=dict(sub.errors),
            system=self.transport.capabilities.system,
            duration=DurationHistogram(list(DURATION_BUCKETS), counts, self.dur_sum, sum(counts)),
            max_in_flight=ds.max_in_flight, received=ds.received, finished=ds.finished,
            requeued=ds.requeued, in_flight=ds.in_flight, running=ds.running,
            backoff_level=ds.backoff_level, backoff_stalls=ds.backoff_stalls,
        )  # fmt: skip
