"""One topic/channel subscription over many nsqd: flow control, backoff, drain.

The consumer owns the connections to every nsqd that has the topic (given directly or
found through nsqlookupd), spreads max_in_flight over them as RDY windows (see
:mod:`nsqworker.nsq.rdy`), runs the callback for each message and turns its outcome into
FIN or REQ. It knows nothing about tasks: the layer above hands it a callback.

Hot path: a message frame goes from the connection's read callback straight into the
callback. A coroutine callback is started eagerly in its own contextvars Context; if
it finishes without suspending (a handler that does not await), its FIN is written in
the same read burst and no Task is ever made. Only coroutines that suspend become
Tasks, and only those (plus futures from thread pools) are tracked for TOUCH and drain.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import time
import types
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from nsqworker.errors import ConfigurationError
from nsqworker.nsq import protocol
from nsqworker.nsq.backoff import BackoffPhase, BackoffState, requeue_delay
from nsqworker.nsq.connection import ConnectionConfig
from nsqworker.nsq.eager import finish_in_task
from nsqworker.nsq.lanes import BULK_BUFFER, BULK_TIMEOUT
from nsqworker.nsq.lookupd import LookupdPoller
from nsqworker.nsq.message import FINISH, Finish, GiveUp, Message, Outcome, Requeue
from nsqworker.nsq.rdy import Mode, plan
from nsqworker.nsq.subscriptions import (
    ConnectionStats,
    ConsumerStats,
    Subscriptions,
    _Link,
    _Session,
)

if TYPE_CHECKING:
    from nsqworker.settings import Settings

__all__ = ["DEFERRED", "Callback", "ConnectionStats", "Consumer", "ConsumerStats", "GiveUpHook"]

log = logging.getLogger("nsqworker.nsq.consumer")

Callback = Callable[[Message], "Outcome | Awaitable[Outcome | None] | None"]
GiveUpHook = Callable[[Message, str], "Awaitable[None] | None"]

TICK = 0.05


class _Deferred:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


#: Returned by a callback that will call :meth:`Consumer.complete` later (on the loop).
DEFERRED: Final = _Deferred()
MAX_ATTEMPTS_REASON = "max attempts exceeded"
_FAILED = Requeue(None, backoff=True)
_DRAIN_REQUEUE = Requeue(0.0, backoff=False)
_CoroutineType = types.CoroutineType
_OUTCOMES = (Finish, Requeue, GiveUp)
_PENDING: Final = object()  # the callback's outcome arrives later
_copy_context = contextvars.copy_context
_monotonic = time.monotonic


class Consumer(Subscriptions):
    """Consumes one topic/channel from every nsqd that has it.

    ``callback(msg)`` returns an :data:`~nsqworker.nsq.message.Outcome`, None when it
    answered the message itself, or an awaitable of either. ``on_give_up(msg, reason)``
    runs for messages past ``max_attempts`` and for ``GiveUp`` outcomes, before the FIN;
    if it raises, the message is requeued instead, never lost.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        callback: Callback,
        settings: Settings,
        *,
        max_in_flight: int | None = None,
        max_attempts: int | None = None,
        requeue_delay: float | None = None,
        on_give_up: GiveUpHook | None = None,
        connection_config: ConnectionConfig | None = None,
        name: str | None = None,
    ) -> None:
        self.topic = protocol.check_topic(topic)
        self.channel = protocol.check_channel(channel)
        self.name = name or f"{topic}/{channel}"
        self._callback = callback
        self._settings = settings
        self.max_in_flight = max_in_flight or settings.max_in_flight
        self.max_attempts = max_attempts or settings.max_attempts
        self._requeue_delay = settings.requeue_delay if requeue_delay is None else requeue_delay
        self._on_give_up = on_give_up
        self._config = connection_config or ConnectionConfig.from_settings(settings)
        self._bulk_config = None
        if self._config.output_buffer_size is None and settings.output_buffer_size is None:
            # Adaptive: unbuffered, with a buffered lane under load (nsq/lanes.py).
            explicit = "output_buffer_timeout" in self._config.explicit
            timeout = self._config.output_buffer_timeout if explicit else BULK_TIMEOUT
            self._bulk_config = dataclasses.replace(
                self._config, output_buffer_size=BULK_BUFFER, output_buffer_timeout=timeout
            )
            self._config = dataclasses.replace(self._config, output_buffer_size=-1)
        if not settings.nsqd_tcp_addresses and not settings.lookupd_http_addresses:
            raise ConfigurationError(
                "no nsqd to consume from: set nsqd_tcp_addresses (NSQWORKER_NSQD_TCP_ADDRESSES)"
                " or lookupd_http_addresses (NSQWORKER_LOOKUPD_HTTP_ADDRESSES)"
            )
        self._backoff = BackoffState(settings.backoff_multiplier, settings.max_backoff_duration)
        self._links: dict[str, _Link] = {}
        self._sessions: list[_Session] = []
        self._tasks: dict[Message, asyncio.Future[Any]] = {}
        self._deferred: set[Message] = set()  # callbacks that will call complete()
        self._backlog: deque[Message] = deque()
        self._in_flight = 0
        self._running = 0
        self._retired = ConnectionStats("retired", False, 0, 0, 0, 0, 0, 0, 0)
        self.connection_errors = {}
        self._unsatisfied = False
        # True while a FIN needs no bookkeeping beyond counters (see _replan).
        self._plain = True
        self._plan_scheduled = False
        self._stopping = False
        self._started = False
        self._drained = asyncio.Event()
        #: Set when :meth:`stop` begins; a handler whose work can continue without it
        #: (a Kubernetes Spark job) waits on it to hand the message back at once.
        self.draining = asyncio.Event()
        self._poller: LookupdPoller | None = None
        self._background: list[asyncio.Task[Any]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        self._first_attempts: list[asyncio.Future[Any]] | None = []
        self._stop_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # One clock for arrivals, turns and touches: monotonic, like asyncio's default.
        self._time: Callable[[], float] = _monotonic
        self._next_touch_sweep = 0.0

    # --- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Connect to the direct nsqd and poll lookupd once; returns after those first
        attempts (failed ones keep retrying in the background)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        settings = self._settings
        for address in settings.nsqd_tcp_addresses:
            link = self._links.setdefault(address, _Link(address, direct=True))
            link.direct = True
        for link in list(self._links.values()):
            self._maintain(link)
        if settings.lookupd_http_addresses:
            self._poller = LookupdPoller(
                settings.lookupd_http_addresses,
                self.topic,
                self._on_producers,
                interval=settings.lookupd_poll_interval,
                jitter=settings.lookupd_poll_jitter,
                allow=getattr(settings, "lookupd_allowed_nsqd", ()),  # security, issue 29
            )
            await self._poller.poll()
            self._background.append(asyncio.create_task(self._poller.run(poll_first=False)))
        self._ticker = asyncio.create_task(self._tick())
        first, self._first_attempts = self._first_attempts or [], None
        if first:
            await asyncio.wait(first, timeout=self._config.dial_timeout + 1.0)
        for attempt in first:  # a setting nsqd refuses is an error at start
            if attempt.done() and attempt.exception() is not None:
                raise attempt.exception()  # type: ignore[misc]

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Drain and close: RDY 0 everywhere, let running handlers finish (TOUCHing them)
        for up to ``drain_timeout`` seconds, REQ what did not finish, CLS, close."""
        if self._stop_task is None:
            timeout = self._settings.drain_timeout if drain_timeout is None else drain_timeout
            self._stop_task = asyncio.ensure_future(self._stop(timeout))
        await asyncio.shield(self._stop_task)

    async def _stop(self, timeout: float) -> None:
        # 1. Take no more: RDY 0 everywhere, stop discovery and reconnects.
        self._stopping = True
        self.draining.set()
        for task in self._background:
            task.cancel()
        for link in self._links.values():
            if link.task is not None and link.session is None:
                link.task.cancel()
        self._replan()
        # 2. Messages waiting for a handler slot have not started: give them back now.
        while self._backlog:
            self._settle_now(self._backlog.popleft(), _DRAIN_REQUEUE)
        # 3. Let running handlers finish; the tick keeps touching them.
        if self._in_flight > 0 and timeout > 0:
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except TimeoutError:
                pass
        if self._ticker is not None:
            self._ticker.cancel()
        # 4. REQ what did not finish; cancel what can be cancelled and let the
        # cancellations (and give-up hooks turned into REQ) reach the wire before CLS.
        for msg in list(self._deferred):  # in a thread: cannot be cancelled, only answered
            if not msg._responded:
                self._settle_now(msg, _DRAIN_REQUEUE)
        unfinished = list(self._tasks.items())
        for msg, future in unfinished:
            if not msg._responded:
                self._settle_now(msg, _DRAIN_REQUEUE)
            future.cancel()
        if unfinished:
            await asyncio.wait([f for _, f in unfinished], timeout=1.0)
        if self._in_flight:
            log.warning("%s: %d messages still in flight at close", self.name, self._in_flight)
        # 5. CLS and close every connection.
        sessions = [s for s in self._sessions if s.open]
        await asyncio.gather(*(s.conn.close() for s in sessions), return_exceptions=True)
        for link in self._links.values():
            for keeper in (link.task, link.bulk_task):
                if keeper is not None:
                    keeper.cancel()
        if self._poller is not None:
            await self._poller.close()

    def force_stop(self) -> None:
        """Cut a running drain short: requeue what is still running and close now."""
        self._drained.set()

    @property
    def subscribed(self) -> bool:
        """True while at least one nsqd connection is subscribed."""
        return any(s.open for s in self._sessions)

    # --- RDY -------------------------------------------------------------------

    def _mode(self) -> Mode:
        if self._stopping:
            return Mode.PAUSED
        phase = self._backoff.phase
        if phase is BackoffPhase.PAUSED:
            return Mode.PAUSED
        if phase is BackoffPhase.PROBING:
            return Mode.PROBING
        return Mode.NORMAL

    def _replan(self) -> None:
        self._plan_scheduled = False
        now = self._time()
        self._backoff.tick(now)
        sessions = [s for s in self._sessions if s.open]
        slots = [s.slot for s in sessions]
        changes = plan(slots, self.max_in_flight, now, self._mode())
        for slot, count in changes:
            session: _Session = slot.key  # type: ignore[assignment]
            session.conn.rdy(count)
        wanted = self.max_in_flight if self._mode() is Mode.NORMAL else 1
        total = sum(s.rdy for s in slots)
        lanes = sum(1 for s in slots if not s.standby)
        self._unsatisfied = bool(lanes) and total < min(wanted, lanes * 2500) and not self._stopping
        self._plain = (
            not self._unsatisfied
            and not self._stopping
            and self._backoff.phase is BackoffPhase.NORMAL
            and not any(slot.retiring for slot in slots)
        )

    def _schedule_plan(self) -> None:
        if not self._plan_scheduled and self._loop is not None:
            self._plan_scheduled = True
            self._loop.call_soon(self._replan)

    async def _tick(self) -> None:
        """Rotation turns, backoff timers, held windows and TOUCH, every TICK seconds."""
        while True:
            await asyncio.sleep(TICK)
            now = self._time()
            if (
                self._unsatisfied
                or self._backoff.phase is BackoffPhase.PAUSED
                or len(self._sessions) > self.max_in_flight
            ):
                self._replan()
            if now >= self._next_touch_sweep:
                self._touch_sweep(now)
                self._next_touch_sweep = now + 0.25
            for session in list(self._sessions):
                if now >= session.check_at:  # a lane with no message in its window
                    self._check_lane(session, now)

    def _touch_sweep(self, now: float) -> None:
        for msg in [*self._tasks, *self._deferred, *self._backlog]:
            if msg._responded:
                continue
            session: _Session = msg._conn
            if not session.open:
                continue
            interval = session.touch_interval
            if now >= msg.received_at + interval * (msg.touch_count + 1):
                if now - msg.received_at >= session.max_msg_timeout:
                    continue  # nsqd ignores TOUCH past --max-msg-timeout
                session.conn.touch(msg.id_bytes)
                msg.touch_count += 1

    # --- messages (hot path) ---------------------------------------------------

    def _on_message(
        self, session: _Session, timestamp: int, attempts: int, message_id: bytes, body: bytes
    ) -> None:
        now = _monotonic()
        msg = Message(
            message_id, body, timestamp, attempts, self.topic, self.channel,
            session.address, self, session, now,
        )  # fmt: skip
        slot = session.slot
        slot.in_flight += 1
        slot.last_message = now
        self._in_flight += 1
        link = session.link
        link.received += 1
        if now >= session.check_at:
            self._check_lane(session, now)
        if self._stopping or attempts > self.max_attempts or self._running >= self.max_in_flight:
            self._admit(msg)
            return
        result = self._start(msg)
        if result is _PENDING:
            return
        if result is FINISH and self._plain and not msg._responded and session.open:
            # settle + _release for the common case, when nothing else needs to know.
            msg._responded = True
            session.conn.fin(message_id)
            link.finished += 1
            slot.in_flight -= 1
            self._in_flight -= 1
            self._running -= 1
            if self._backlog:
                self._ran_backlog()
            return
        self._ran(msg, result)

    def _admit(self, msg: Message) -> None:
        """The rare arrivals: while stopping, past max_attempts, or over the fence."""
        if self._stopping:
            self._settle_now(msg, _DRAIN_REQUEUE)
        elif msg.attempts > self.max_attempts:
            msg._responded = True
            self._give_up(msg, MAX_ATTEMPTS_REASON)
        elif self._running >= self.max_in_flight:
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
        self._running += 1
        try:
            result: Any = self._callback(msg)
            if result is FINISH:
                return result
            if result.__class__ is _CoroutineType:
                context = _copy_context()
                try:
                    yielded = context.run(result.send, None)
                except StopIteration as stop:
                    return stop.value
                assert self._loop is not None
                self._track(
                    msg, self._loop.create_task(finish_in_task(result, yielded), context=context)
                )
                return _PENDING
            if result is DEFERRED:
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

        Ignored if the message was already answered (e.g. requeued by a drain)."""
        self._deferred.discard(msg)
        self._ran(msg, outcome)

    def _track(self, msg: Message, future: asyncio.Future[Any]) -> None:
        self._tasks[msg] = future
        future.add_done_callback(partial(self._future_done, msg))

    def _future_done(self, msg: Message, future: asyncio.Future[Any]) -> None:
        del self._tasks[msg]
        if future.cancelled():
            result: Any = _DRAIN_REQUEUE
        elif (exc := future.exception()) is not None:
            log.error("%s: callback failed for message %s", self.name, msg.id, exc_info=exc)
            result = _FAILED
        else:
            result = future.result()
        self._ran(msg, result)

    def _ran(self, msg: Message, result: Any) -> None:
        self._running -= 1
        if not msg._responded:
            if result is None:
                log.warning(
                    "%s: callback returned None without answering message %s; requeueing",
                    self.name,
                    msg.id,
                )
                result = _FAILED
            msg._responded = True
            self.settle(msg, result)
        if self._backlog:
            self._ran_backlog()

    def _ran_backlog(self) -> None:
        backlog = self._backlog
        while backlog and self._running < self.max_in_flight:
            self._run(backlog.popleft())

    def _settle_now(self, msg: Message, outcome: Outcome) -> None:
        msg._responded = True
        self.settle(msg, outcome)

    def settle(self, msg: Message, outcome: Outcome) -> None:
        """Send the outcome of ``msg`` to nsqd (the Message calls this; so does the
        consumer for callbacks that return an outcome)."""
        session: _Session = msg._conn
        kind = outcome.__class__
        if kind is Finish:
            if session.open:
                session.conn.fin(msg.id_bytes)
            session.link.finished += 1
            if self._backoff.phase is BackoffPhase.PROBING:
                self._backoff_signal(msg, success=True)
        elif kind is Requeue:
            assert isinstance(outcome, Requeue)
            delay = outcome.delay
            if delay is None:
                delay = self.requeue_delay(msg.attempts)
            if session.open:
                ms = min(max(int(delay * 1000), 0), protocol.DEFAULT_MAX_REQ_TIMEOUT_MS)
                session.conn.req(msg.id_bytes, ms)
            session.link.requeued += 1
            if outcome.backoff:
                self._backoff_signal(msg, success=False)
        else:
            assert isinstance(outcome, GiveUp)
            self._give_up(msg, outcome.reason)
            return
        self._release(msg)

    def requeue_delay(self, attempts: int) -> float:
        """Seconds of a REQ the handler left to the policy, after ``attempts`` deliveries."""
        s = self._settings
        return requeue_delay(
            attempts, self._requeue_delay, s.requeue_multiplier, s.max_requeue_delay
        )

    def touch(self, msg: Message) -> None:
        """TOUCH ``msg`` now (for handlers that answer themselves)."""
        session: _Session = msg._conn
        if session.open:
            session.conn.touch(msg.id_bytes)
        msg.touch_count += 1

    def _release(self, msg: Message) -> None:
        session: _Session = msg._conn
        slot = session.slot
        slot.in_flight -= 1
        self._in_flight -= 1
        if self._unsatisfied:
            self._schedule_plan()
        if slot.retiring and slot.in_flight == 0:
            self._retired_idle(session)
        if self._stopping and self._in_flight == 0:
            self._drained.set()

    def _backoff_signal(self, msg: Message, success: bool) -> None:
        now = self._time()
        backoff = self._backoff
        changed = (
            backoff.on_success(msg.received_at, now)
            if success
            else backoff.on_failure(msg.received_at, now)
        )
        if changed:
            if backoff.phase is BackoffPhase.PAUSED:
                log.warning(
                    "%s: backing off for %.1fs (level %d) after a failure",
                    self.name,
                    backoff.resume_at - now,
                    backoff.level,
                )
            else:
                log.info("%s: backoff over, resuming full flow", self.name)
            self._replan()

    def _give_up(self, msg: Message, reason: str) -> None:
        hook = self._on_give_up
        try:
            result = hook(msg, reason) if hook is not None else None
        except Exception:
            log.exception("%s: give-up hook failed for %s; requeueing", self.name, msg.id)
            self._after_give_up(msg, failed=True)
            return
        if result is None:
            if hook is None:
                log.warning("%s: giving up on message %s: %s", self.name, msg.id, reason)
            self._after_give_up(msg, failed=False)
            return
        future = asyncio.ensure_future(result)
        self._tasks[msg] = future
        future.add_done_callback(partial(self._give_up_done, msg))

    def _give_up_done(self, msg: Message, future: asyncio.Future[Any]) -> None:
        del self._tasks[msg]
        failed = future.cancelled() or future.exception() is not None
        if failed and not future.cancelled():
            log.error(
                "%s: give-up hook failed for %s; requeueing",
                self.name,
                msg.id,
                exc_info=future.exception(),
            )
        self._after_give_up(msg, failed)

    def _after_give_up(self, msg: Message, failed: bool) -> None:
        session: _Session = msg._conn
        if failed:
            self.settle(msg, Requeue(None if not self._stopping else 0.0, backoff=False))
            return
        if session.open:
            session.conn.fin(msg.id_bytes)
        session.link.given_up += 1
        self._release(msg)

    # --- stats -----------------------------------------------------------------

    def stats(self) -> ConsumerStats:
        """Counters and gauges for this consumer and each nsqd it knows."""
        conns = [link.stats() for link in self._links.values()]
        r = self._retired
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            max_in_flight=self.max_in_flight,
            in_flight=self._in_flight,
            running=self._running,
            received=r.received + sum(c.received for c in conns),
            finished=r.finished + sum(c.finished for c in conns),
            requeued=r.requeued + sum(c.requeued for c in conns),
            given_up=r.given_up + sum(c.given_up for c in conns),
            backoff_level=self._backoff.level,
            backoff_phase=self._backoff.phase.value,
            rdy=sum(c.rdy for c in conns),
            connected=sum(c.connected for c in conns),
            connections=conns,
        )


__all__ += ["FINISH"]
