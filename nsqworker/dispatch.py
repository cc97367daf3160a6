"""The task layer's policy for one task, the same on every transport.

A :class:`Dispatcher` receives deliveries from its transport's
:class:`~nsqworker.transport.Subscription` and owns everything a task decides:

* handlers running at once never exceed ``max_in_flight`` (a second fence behind the
  transport's flow control; the excess waits in order);
* a delivery past ``max_attempts`` (unhandled) or a failed last attempt is rejected;
* outcomes become the subscription's ``finish``, ``retry`` after the policy's delay, or
  ``reject`` after the reject hook (the dead-letter chain); a reject hook that fails
  turns into a retry, never a loss;
* consumer backoff: failures pause the subscription's flow, then probe it;
* keep-alive of long handlers, within the transport's longest hold;
* drain: pause, hand back what has not started, let running handlers finish within the
  deadline, retry the rest, close.

Hot path: a delivery goes from the transport's read callback straight into the
callback. A coroutine callback runs its first step at once, as a Task, in its own
contextvars Context (:mod:`nsqworker.eager`); if that finishes it, its finish is written
in the same read burst. Those that suspend (and callbacks that answer later, like the
sync thread pool) are tracked for keep-alive and drain."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import types
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final

from nsqworker.backoff import Alarm, Backoff, Phase
from nsqworker.eager import Starter
from nsqworker.message import FINISH, Finish, Message, Outcome, Reject, Retry, Stage, Undecodable
from nsqworker.policy import Policy, retry_delay
from nsqworker.slow import SlowWatch
from nsqworker.stats import DispatchStats
from nsqworker.transport import Capabilities, Flow, Subscription

__all__ = [
    "DEFERRED",
    "MAX_ATTEMPTS_REASON",
    "Callback",
    "DispatchStats",
    "Dispatcher",
    "Policy",
    "RejectHook",
]

log = logging.getLogger("nsqworker.dispatch")

Callback = Callable[[Message], "Outcome | Awaitable[Outcome | None] | None"]
RejectHook = Callable[[Message, str], "Awaitable[None] | None"]
"""``hook(msg, reason)`` before a reject (the dead-letter chain); raising turns it into a retry."""

KEEP_ALIVE_SWEEP = 0.25
"""Seconds between looks for running messages that need a keep-alive."""


class _Deferred:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


#: Returned by a callback that will call :meth:`Dispatcher.complete` later (on the loop).
DEFERRED: Final = _Deferred()
MAX_ATTEMPTS_REASON = "max attempts exceeded"
_FAILED = Retry(None)
_DRAIN_RETRY = Retry(0.0, backoff=False)
_CoroutineType = types.CoroutineType
_OUTCOMES = (Finish, Retry, Reject)
_PENDING: Final = object()  # the callback's outcome arrives later
_copy_context = contextvars.copy_context
_NEW, _WAITING, _RUNNING = Stage.NEW, Stage.WAITING, Stage.RUNNING
_ANSWERED, _SETTLED = Stage.ANSWERED, Stage.SETTLED


class Dispatcher:
    """Runs ``callback`` for the deliveries of one subscription under one policy.

    ``callback(msg)`` returns an :data:`~nsqworker.message.Outcome`, None when it
    answered the message itself, an awaitable of either, or :data:`DEFERRED` when it
    will call :meth:`complete`. ``on_reject(msg, reason)`` runs for messages past
    ``max_attempts`` and for ``Reject`` outcomes, before the subscription's reject; if
    it raises, the message is retried instead, never lost. ``capabilities``: the
    transport's (the longest retry delay, whether keep-alives exist); ``slow``: the
    task's slow-handler watch, told on each keep-alive sweep (None: no watch).
    """

    def __init__(
        self,
        subscription: Subscription,
        callback: Callback,
        policy: Policy,
        *,
        capabilities: Capabilities,
        on_reject: RejectHook | None = None,
        name: str | None = None,
        slow: SlowWatch | None = None,
    ) -> None:
        self.subscription = subscription
        self.topic, self.channel = subscription.topic, subscription.channel
        self.name = name or f"{self.topic}/{self.channel}"
        self.policy = policy
        self.max_in_flight, self.max_attempts = policy.max_in_flight, policy.max_attempts
        self._callback = callback
        self._on_reject = on_reject
        self._max_retry_delay = capabilities.max_retry_delay
        self._keep_alive = capabilities.keep_alive
        self._slow = slow
        self._finish = subscription.finish
        self._clock = subscription.clock
        self._backoff = Backoff(policy.backoff_multiplier, policy.max_backoff_duration)
        self._alarm = Alarm(subscription.call_later, self._clock, self._on_timer)
        self._tasks: dict[Message, asyncio.Future[Any]] = {}
        self._deferred: set[Message] = set()  # callbacks that will call complete()
        self._backlog: deque[Message] = deque()
        self._in_flight = self._running = 0
        self.finished = self.retried = self.rejected = 0
        # True while a finish needs no bookkeeping beyond counters (see _set_flow).
        self._plain = True
        self._stopping = self._started = False
        self._drained = asyncio.Event()
        #: Set when :meth:`stop` begins; a handler whose work can continue without it
        #: (a Kubernetes Spark job) waits on it to hand the message back at once.
        self.draining = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starter: Starter | None = None
        self._in_backlog = False
        self._loop_thread = 0

    # --- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Start the subscription with this dispatcher as its receiver; returns after
        the transport's first connection attempts (failed ones keep retrying)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._starter = Starter(self._loop)
        self._loop_thread = threading.get_ident()
        self._set_flow()
        self._sweeper = asyncio.create_task(self._sweep_loop())
        await self.subscription.start(self)

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Drain and close: pause the flow, let running handlers finish (kept alive)
        for up to ``drain_timeout`` seconds, retry what did not finish, close."""
        if self._stop_task is None:
            timeout = self.policy.drain_timeout if drain_timeout is None else drain_timeout
            self._stop_task = asyncio.ensure_future(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float) -> None:
        # 1. Take no more: pause the flow, stop discovery and reconnects.
        self._stopping = True
        self._plain = False
        self.draining.set()
        self._backoff.stop(self._clock())
        self._arm()
        await self.subscription.stop()
        # 2. Messages waiting for a handler slot have not started: give them back now.
        while self._backlog:
            self._settle_now(self._backlog.popleft(), _DRAIN_RETRY)
        # 3. Let running handlers finish; the sweeper keeps them alive.
        if self._in_flight > 0 and timeout > 0:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except TimeoutError:
                pass
        if self._sweeper is not None:
            self._sweeper.cancel()
        # 4. Retry what did not finish; cancel what can be cancelled and let the
        # cancellations (and reject hooks turned into retries) settle before closing.
        for msg in list(self._deferred):  # in a thread: cannot be cancelled, only answered
            if not msg.answered:
                self._settle_now(msg, _DRAIN_RETRY)
        unfinished = list(self._tasks.items())
        for msg, future in unfinished:
            if not msg.answered:
                self._settle_now(msg, _DRAIN_RETRY)
            future.cancel()
        if unfinished:
            await asyncio.wait([f for _, f in unfinished], timeout=1.0)
        if self._in_flight:
            log.warning("%s: %d messages still in flight at close", self.name, self._in_flight)
        # 5. Close the subscription.
        await self.subscription.close()
        if self._starter is not None:
            self._starter.close()

    def force_stop(self) -> None:
        """Cut a running drain short: retry what is still running and close now."""
        self._drained.set()

    @property
    def received(self) -> int:
        """Deliveries so far: each is settled (finished, retried, rejected) or in flight."""
        return self.finished + self.retried + self.rejected + self._in_flight

    @property
    def subscribed(self) -> bool:
        """True while the subscription has at least one live connection."""
        return self.subscription.subscribed

    @property
    def ready(self) -> bool:
        """The subscription's readiness (see the transport)."""
        return self.subscription.ready

    # --- flow and backoff -------------------------------------------------------

    def _set_flow(self) -> None:
        flow = Flow.PAUSED if self._stopping else self._backoff.flow
        self._plain = flow is Flow.OPEN
        self.subscription.set_flow(flow, self.max_in_flight)

    def _arm(self) -> None:
        """One timer armed for the machine's deadline, none without one."""
        self._alarm.set(self._backoff.deadline)

    def _on_timer(self) -> None:
        backoff = self._backoff
        was = backoff.phase
        if backoff.timer(self._clock(), self._probe_running()):
            if backoff.phase is Phase.OPEN:
                log.info("%s: no message to probe with; resuming full flow", self.name)
            elif was is Phase.PAUSED:
                log.debug("%s: backoff pause over, probing (level %d)", self.name, backoff.level)
            self._set_flow()
        self._arm()

    def _probe_running(self) -> bool:
        """Whether a message of the current probe window is still being handled."""
        if self._backoff.phase is not Phase.PROBING or not self._in_flight:
            return False
        since = self._backoff.since
        return any(m.received_at >= since for m in (*self._tasks, *self._deferred, *self._backlog))

    def _backoff_signal(self, msg: Message, success: bool) -> None:
        now = self._clock()
        backoff = self._backoff
        signal = backoff.success if success else backoff.failure
        if signal(msg.received_at, now):
            if backoff.phase is Phase.PAUSED:
                pause = (backoff.deadline or now) - now
                log.warning(
                    "%s: backing off for %.1fs (level %d) after a failure",
                    *(self.name, pause, backoff.level),
                )
            elif backoff.phase is Phase.OPEN:
                log.info("%s: backoff over, resuming full flow", self.name)
            if not self._stopping:
                self._set_flow()
        self._arm()

    def _check_stall(self, now: float) -> None:
        """The safety net: a paused or probing flow past its deadline by a margin (its
        timer lost) is logged once, counted and opened again."""
        backoff = self._backoff
        phase, level = backoff.phase, backoff.level
        due = backoff.deadline if backoff.deadline is not None else backoff.since
        if self._stopping or not backoff.stalled(now, self._probe_running()):
            return
        log.error(
            "%s: consumer backoff stalled: %s at level %d, %.1fs past its deadline "
            "(timer armed: %s); reopening the flow",
            *(self.name, phase.value, level, now - due, self._alarm.armed),
        )
        self._set_flow()
        self._arm()

    # --- keep-alive -------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(KEEP_ALIVE_SWEEP)
            if self._tasks or self._deferred or self._backlog:
                self._sweep(self._clock())
            if self._backoff.phase is not Phase.OPEN:
                self._check_stall(self._clock())

    def _sweep(self, now: float) -> None:
        if self._slow is not None:
            self._slow.look(now, [*self._tasks, *self._deferred], self._deferred)
        if not self._keep_alive:
            return
        sub = self.subscription
        for msg in [*self._tasks, *self._deferred, *self._backlog]:
            stage = msg.stage
            if stage is _ANSWERED or stage is _SETTLED:
                continue
            interval = sub.keep_alive_interval(msg)
            if interval is None:
                continue
            if now >= msg.received_at + interval * (msg.touch_count + 1):
                hold = sub.max_hold(msg)
                if hold is not None and now - msg.received_at >= hold:
                    continue  # the broker ignores keep-alives past its longest hold
                sub.keep_alive(msg)
                msg.touch_count += 1

    def tracked(self) -> list[tuple[Message, str, Any]]:
        """What is in flight beyond the hot path: ``(msg, state, handle)`` with state
        ``running`` (an async handler that suspended: its Task; a sync one in a thread:
        None) or ``waiting`` (over the in-flight bound). Handlers that finish inline are
        never here: they are done before anyone could look."""
        items: list[tuple[Message, str, Any]] = [(m, "running", t) for m, t in self._tasks.items()]
        items += [(m, "running", None) for m in self._deferred]
        items += [(m, "waiting", None) for m in self._backlog]
        return items

    # --- messages (hot path) ---------------------------------------------------

    def deliver(self, msg: Message) -> bool:
        """A delivery from the subscription (on the loop, in its read path). True: the
        handler finished it inline and the transport finishes it now (the common case, with
        nothing else to decide: no call back into the transport on the hot path)."""
        self._in_flight += 1
        if (
            self._stopping
            or msg.attempts > self.max_attempts
            or self._running >= self.max_in_flight
            or msg.__class__ is Undecodable
        ):
            self._admit(msg)
            return False
        # _start, with its most common result handled here (one call less per message).
        self._running += 1
        try:
            result: Any = self._callback(msg)
        except Exception:
            log.exception("%s: callback failed for message %s", self.name, msg.id)
            result = _FAILED
        else:
            if result is not FINISH:
                result = self._follow(msg, result)
        if result is _PENDING:
            return False
        if result is FINISH and self._plain and msg.stage is _NEW:
            # _apply + _release for the common case, when nothing else needs to know.
            msg.stage = _SETTLED  # NEW -> SETTLED: finished inline (Stage, MOVES)
            self.finished += 1
            self._in_flight -= 1
            self._running -= 1
            if self._backlog:
                self._ran_backlog()
            return True
        self._ran(msg, result)
        return False

    def _admit(self, msg: Message) -> None:
        """The rare arrivals: undecodable, while stopping, past max_attempts, or over
        the fence."""
        if isinstance(msg, Undecodable):  # never a handler's; rejected even while stopping
            msg.move(_ANSWERED)
            self._reject(msg, msg.reason)
        elif self._stopping:
            self._settle_now(msg, _DRAIN_RETRY)
        elif msg.attempts > self.max_attempts:
            msg.move(_ANSWERED)
            self._reject(msg, MAX_ATTEMPTS_REASON)
        elif self._running >= self.max_in_flight:
            msg.stage = _WAITING  # a new delivery (NEW -> WAITING, MOVES)
            self._backlog.append(msg)
        else:
            self._run(msg)

    def _run(self, msg: Message) -> None:
        result = self._start(msg)
        if result is not _PENDING:
            self._ran(msg, result)

    def _start(self, msg: Message) -> Any:
        """Run the callback: its outcome if known at once, else _PENDING (a suspended
        coroutine or a future is tracked; a DEFERRED callback calls complete())."""
        stage = msg.stage
        if stage is not _NEW and stage is not _WAITING:  # the moves to RUNNING (MOVES)
            msg.move(_RUNNING)  # raises StageError
        msg.stage = _RUNNING
        self._running += 1
        try:
            result: Any = self._callback(msg)
        except Exception:
            log.exception("%s: callback failed for message %s", self.name, msg.id)
            return _FAILED
        return result if result is FINISH else self._follow(msg, result)

    def _follow(self, msg: Message, result: Any) -> Any:
        """What the callback returned, unless FINISH: a coroutine is run eagerly (and
        tracked if it suspends), a future tracked, DEFERRED noted; else the outcome."""
        try:
            if result.__class__ is _CoroutineType:
                assert self._starter is not None
                done, value = self._starter.start(result, _copy_context())
                if done:  # finished in its first step (nsqworker.eager)
                    return value
                self._track(msg, value)
                return _PENDING
            if result is DEFERRED:
                if msg.stage is _NEW:  # started on the hot path
                    msg.stage = _RUNNING
                self._deferred.add(msg)
                return _PENDING
            if result is not None and not isinstance(result, _OUTCOMES):
                self._track(msg, asyncio.ensure_future(result))
                return _PENDING
            return result
        except Exception:
            log.exception("%s: callback failed for message %s", self.name, msg.id)
            return _FAILED

    def complete(self, msg: Message, outcome: Outcome | None) -> None:
        """The outcome of a callback that returned :data:`DEFERRED` (call on the loop).

        Ignored if the message was already answered (e.g. retried by a drain)."""
        self._deferred.discard(msg)
        self._ran(msg, outcome)

    def _track(self, msg: Message, future: asyncio.Future[Any]) -> None:
        if msg.stage is _NEW:  # started on the hot path (else RUNNING, or answered)
            msg.stage = _RUNNING
        self._tasks[msg] = future
        if self._slow is not None:  # a suspended handler's age counts from here
            self._slow.began(msg, self._clock())
        future.add_done_callback(partial(self._future_done, msg))

    def _future_done(self, msg: Message, future: asyncio.Future[Any]) -> None:
        del self._tasks[msg]
        if self._slow is not None:
            self._slow.ended(msg)
        if future.cancelled():
            result: Any = _DRAIN_RETRY
        elif (exc := future.exception()) is not None:
            log.error("%s: callback failed for message %s", self.name, msg.id, exc_info=exc)
            result = _FAILED
        else:
            result = future.result()
        self._ran(msg, result)

    def _ran(self, msg: Message, result: Any) -> None:
        self._running -= 1
        stage = msg.stage
        if stage is not _ANSWERED and stage is not _SETTLED:
            if result is None:
                log.warning(
                    "%s: callback returned None without answering message %s; retrying",
                    self.name,
                    msg.id,
                )
                result = _FAILED
            msg.stage = _ANSWERED  # from NEW, WAITING or RUNNING: each allowed (MOVES)
            self._apply(msg, result)
        if self._backlog:
            self._ran_backlog()

    def _ran_backlog(self) -> None:
        if self._in_backlog:  # called again by a message it started: the loop below goes on
            return
        self._in_backlog, backlog = True, self._backlog
        try:
            while backlog and self._running < self.max_in_flight:
                self._run(backlog.popleft())
        finally:
            self._in_backlog = False

    def _settle_now(self, msg: Message, outcome: Outcome) -> None:
        msg.move(_ANSWERED)
        self._apply(msg, outcome)

    # --- settling ----------------------------------------------------------------

    def settle(self, msg: Message, outcome: Outcome) -> None:
        """Apply ``outcome`` to a message its handler answered itself
        (``msg.finish()``...; ``Message`` marked it answered). Any thread may call."""
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._apply, msg, outcome)
        else:
            self._apply(msg, outcome)

    def _apply(self, msg: Message, outcome: Outcome) -> None:
        kind = outcome.__class__
        if kind is Finish:  # the common case, with _release inlined
            if msg.stage is not _ANSWERED:  # the only way to SETTLED from here (MOVES)
                msg.move(_SETTLED)  # raises StageError
            msg.stage = _SETTLED
            self._finish(msg)
            self.finished += 1
            if not self._plain:
                if self._backoff.phase is Phase.PROBING:
                    self._backoff_signal(msg, success=True)
                self._release()
            else:
                self._in_flight -= 1
            return
        if isinstance(outcome, Retry):  # a subclass of Retry a handler raised, too
            if outcome.backoff and msg.attempts >= self.max_attempts:  # the last one failed:
                self._backoff_signal(msg, success=False)  # reject now, no retry delay
                self._reject(msg, MAX_ATTEMPTS_REASON)
                return
            delay = outcome.delay
            if delay is None:
                delay = self.retry_delay(msg.attempts)
            msg.move(_SETTLED)
            self.subscription.retry(msg, min(max(delay, 0.0), self._max_retry_delay))
            self.retried += 1
            if outcome.backoff:
                self._backoff_signal(msg, success=False)
        else:
            assert isinstance(outcome, Reject)
            self._reject(msg, outcome.reason or "rejected")
            return
        self._release()

    def retry_delay(self, attempts: int) -> float:
        """Seconds of a retry the handler left to the policy, after ``attempts`` deliveries."""
        p = self.policy
        return retry_delay(attempts, p.retry_delay, p.retry_multiplier, p.max_retry_delay)

    def touch(self, msg: Message) -> None:
        """Keep ``msg`` alive now (for handlers that answer themselves). Any thread."""
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self.touch, msg)
            return
        self.subscription.keep_alive(msg)
        msg.touch_count += 1

    def max_hold(self, msg: Message) -> float | None:
        """The longest ``msg`` may be held (see the transport)."""
        return self.subscription.max_hold(msg)

    def _release(self) -> None:
        self._in_flight -= 1
        if self._stopping and self._in_flight == 0:
            self._drained.set()

    def _reject(self, msg: Message, reason: str) -> None:
        hook = self._on_reject
        try:
            result = hook(msg, reason) if hook is not None else None
        except Exception:
            log.exception("%s: reject hook failed for %s; retrying", self.name, msg.id)
            self._after_reject(msg, failed=True)
            return
        if result is None:
            if hook is None:
                log.warning("%s: rejected message %s: %s", self.name, msg.id, reason)
            self._after_reject(msg, failed=False)
            return
        future = asyncio.ensure_future(result)
        self._tasks[msg] = future
        future.add_done_callback(partial(self._reject_done, msg))

    def _reject_done(self, msg: Message, future: asyncio.Future[Any]) -> None:
        del self._tasks[msg]
        failed = future.cancelled() or future.exception() is not None
        if failed and not future.cancelled():
            log.error(
                "%s: reject hook failed for %s; retrying",
                self.name,
                msg.id,
                exc_info=future.exception(),
            )
        self._after_reject(msg, failed)

    def _after_reject(self, msg: Message, failed: bool) -> None:
        if failed:
            self._apply(msg, Retry(None if not self._stopping else 0.0, backoff=False))
            return
        msg.move(_SETTLED)
        self.subscription.reject(msg)
        self.rejected += 1
        self._release()

    # --- stats -----------------------------------------------------------------

    def stats(self) -> DispatchStats:
        """Counters and gauges of this dispatcher and its subscription."""
        return DispatchStats(
            max_in_flight=self.max_in_flight,
            in_flight=self._in_flight,
            running=self._running,
            received=self.received,
            finished=self.finished,
            requeued=self.retried,
            given_up=self.rejected,
            backoff_level=self._backoff.level,
            backoff_phase=self._backoff.phase.value,
            backoff_stalls=self._backoff.stalls,
            subscription=self.subscription.stats(),
        )
