"""An in-memory transport for testing handlers without any server.

What Dramatiq's ``StubBroker`` and FastStream's ``TestBroker`` give their users: run a
tasks module's handlers through the real worker (the same dispatcher, retries, dead
letters, hooks and telemetry as on NSQ), then look at what happened::

    from nsqworker import Settings, Worker
    from nsqworker.memory import MemoryTransport

    broker = MemoryTransport()
    async with Worker(registry, Settings(transport="memory"), transport=broker):
        await broker.publish("clicks", b'{"id": 1}')
        await broker.run_until_idle()
    assert [d.body for d in broker.finished("clicks", "archive")] == [b'{"id": 1}']

It behaves as a broker would: each channel of a topic gets every message (messages
published before a channel exists wait in the topic, as on NSQ), deliveries count their
attempts, an unanswered delivery is delivered again after ``ack_wait`` unless kept alive,
retries wait their delay, and flow control is honoured. Time is virtual: the transport's
clock runs with real time, and :meth:`MemoryTransport.run_until_idle` jumps it forward
whenever nothing is running and something waits (a 30 s retry, a backoff pause), so a
test does not sleep through delays. One process only: the supervisor's worker processes
cannot share it (use it with an embedded ``Worker``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from nsqworker.errors import ConfigurationError
from nsqworker.message import Message, to_bytes
from nsqworker.names import check_channel, check_topic
from nsqworker.transport import (
    MAX_RETRY_DELAY,
    Capabilities,
    Flow,
    Receiver,
    SubscriptionStats,
)

__all__ = ["CAPABILITIES", "Delivered", "MemorySubscription", "MemoryTransport", "Retried"]

CAPABILITIES = Capabilities(
    name="memory",
    system="memory",
    attribute_prefix="messaging.memory",
    max_retry_delay=MAX_RETRY_DELAY,
    keep_alive=True,
    max_hold=None,
    headers=False,
    delayed_publish=True,
    reply_address=False,
)
Settle = Literal["finish", "retry", "reject"]
"""How a subscription answered a delivery: the task layer's three outcomes."""
ADDRESS = "memory"
"""``Message.address`` of every delivery."""


@dataclass(frozen=True)
class Delivered:
    """A message as a channel saw it settled: body, id and the delivery's attempts."""

    body: bytes
    id: str
    attempts: int


@dataclass(frozen=True)
class Retried(Delivered):
    """A delivery answered with a retry, and its delay in seconds."""

    delay: float = 0.0


@dataclass(eq=False)
class _Entry:
    """One message in one channel, across its deliveries."""

    id: bytes
    body: bytes
    timestamp: int
    attempts: int = 0
    deadline: float = 0.0
    delivery: int = 0  # which delivery is current; a late answer to an older one is ignored
    holder: MemorySubscription | None = None


@dataclass
class _Channel:
    ready: deque[_Entry] = field(default_factory=deque)
    delayed: list[tuple[float, int, _Entry]] = field(default_factory=list)
    in_flight: dict[bytes, _Entry] = field(default_factory=dict)
    subscriptions: list[MemorySubscription] = field(default_factory=list)
    turn: int = 0
    finished: list[Delivered] = field(default_factory=list)
    retried: list[Retried] = field(default_factory=list)
    rejected: list[Delivered] = field(default_factory=list)
    timed_out: int = 0


@dataclass
class _Topic:
    channels: dict[str, _Channel] = field(default_factory=dict)
    waiting: list[_Entry] = field(default_factory=list)  # published before any channel
    published: list[bytes] = field(default_factory=list)


class _Timer:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class MemoryTransport:
    """A broker in this process; see the module docstring.

    Args:
        settings: ignored apart from being accepted (``Settings(transport="memory")``
            builds one through the transport registry).
        ack_wait: seconds a delivery may stay unanswered (without keep-alive) before it
            is delivered again, like nsqd's msg_timeout.
    """

    capabilities = CAPABILITIES

    def __init__(self, settings: Any = None, *, ack_wait: float = 60.0) -> None:
        if not ack_wait > 0:
            raise ConfigurationError(f"ack_wait must be positive seconds, got {ack_wait!r}")
        self.ack_wait = float(ack_wait)
        self._offset = 0.0
        self._topics: dict[str, _Topic] = {}
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self._changed: asyncio.Event | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._subscriptions: list[MemorySubscription] = []

    def __repr__(self) -> str:
        return f"<MemoryTransport topics={sorted(self._topics)}>"

    # --- the clock ---------------------------------------------------------------

    def clock(self) -> float:
        """Virtual seconds: monotonic time plus every jump :meth:`advance` made."""
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Jump the clock forward; what falls due runs at once."""
        if seconds < 0:
            raise ValueError(f"the clock only goes forward, not by {seconds!r}")
        self._offset += seconds
        self._wake()

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        """``callback`` after ``delay`` seconds of :meth:`clock`, on the loop."""
        timer = _Timer(self.clock() + max(delay, 0.0), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        self._wake()
        return timer

    # --- the Transport protocol ----------------------------------------------------

    def check_topic(self, topic: str) -> str:
        """The portable name rule (:mod:`nsqworker.names`)."""
        return check_topic(topic)

    def check_channel(self, channel: str) -> str:
        """The portable name rule (:mod:`nsqworker.names`)."""
        return check_channel(channel)

    def subscribe(
        self, topic: str, channel: str, *, name: str, max_in_flight: int
    ) -> MemorySubscription:
        """A subscription of ``channel`` on ``topic`` (created on start)."""
        return MemorySubscription(self, topic, channel, name, max_in_flight)

    def publisher(self, near: Message | None = None) -> MemoryTransport:
        """The transport itself publishes."""
        return self

    def describe(self) -> dict[str, str]:
        """Nothing to connect to."""
        return {"memory": "this process"}

    async def close(self) -> None:
        """Stop the delivery pump (the messages stay, for inspection)."""
        if self._pump_task is not None and not self._subscriptions:
            self._pump_task.cancel()
            self._pump_task = None

    # --- publishing ----------------------------------------------------------------

    async def publish(self, topic: str, body: Any, delay: float | None = None) -> None:
        """Publish one message, delivered to every channel of ``topic``."""
        self.publish_nowait(topic, body, delay)

    async def publish_many(self, topic: str, bodies: Iterable[Any]) -> None:
        """Publish several messages in order."""
        for body in bodies:
            self.publish_nowait(topic, body)

    async def publish_json(self, topic: str, obj: Any, delay: float | None = None) -> None:
        """Publish ``obj`` as compact UTF-8 JSON, as the brokers' producers do."""
        self.publish_nowait(topic, _json(obj), delay)

    def publish_nowait(self, topic: str, body: Any, delay: float | None = None) -> None:
        """:meth:`publish` for sync code (a test's setup, a sync handler); ``body`` is
        bytes, str, a pydantic model or a dataclass instance (its JSON, as the NSQ
        producer sends it)."""
        check_topic(topic)
        data = to_bytes(body)
        if not data:
            raise ValueError("message body is empty; a broker would refuse it")
        state = self._topics.setdefault(topic, _Topic())
        state.published.append(data)
        msg_id = f"{next(self._ids):016x}".encode()
        entry = _Entry(msg_id, data, time.time_ns())
        if not state.channels:
            state.waiting.append(entry)
        for channel in state.channels.values():
            copy = _Entry(msg_id, data, entry.timestamp)
            if delay:
                self._delay(channel, copy, delay)
            else:
                channel.ready.append(copy)
        self._wake()

    # --- what happened --------------------------------------------------------------

    def messages(self, topic: str) -> list[bytes]:
        """Every body published to ``topic`` so far (dead-letter topics too)."""
        state = self._topics.get(topic)
        return list(state.published) if state is not None else []

    def finished(self, topic: str, channel: str) -> list[Delivered]:
        """Deliveries the channel's handlers finished, in order."""
        return list(self._channel(topic, channel).finished)

    def acked(self, topic: str, channel: str) -> list[Delivered]:
        """Deprecated: the old name of :meth:`finished`."""
        return self.finished(topic, channel)

    def retried(self, topic: str, channel: str) -> list[Retried]:
        """Deliveries answered with a retry, with their delays, in order."""
        return list(self._channel(topic, channel).retried)

    def rejected(self, topic: str, channel: str) -> list[Delivered]:
        """Deliveries rejected (their dead-letter chain ran), in order."""
        return list(self._channel(topic, channel).rejected)

    def pending(self, topic: str, channel: str) -> int:
        """Messages not settled yet: waiting, delayed or in flight."""
        ch = self._channel(topic, channel)
        return len(ch.ready) + len(ch.delayed) + len(ch.in_flight)

    def timed_out(self, topic: str, channel: str) -> int:
        """Deliveries that outlived ``ack_wait`` unanswered and were delivered again."""
        return self._channel(topic, channel).timed_out

    async def run_until_idle(
        self, timeout: float = 30.0, until: Callable[[], bool] | None = None
    ) -> None:
        """Deliver until nothing is ready, in flight or waiting (or until ``until()`` is
        true), jumping the virtual clock over delays and pauses while no handler runs.

        Raises:
            TimeoutError: still busy after ``timeout`` real seconds (a handler that never
                returns, or a message that keeps coming back).
        """
        deadline = time.monotonic() + timeout
        while True:
            self._pump()
            await asyncio.sleep(0)
            if until is not None and until():
                return
            if self._busy():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"still busy after {timeout:g}s: {self._summary()}")
                await asyncio.sleep(0.001)
                continue
            due = self._next_due()
            if due is None:
                await asyncio.sleep(0)  # let settles made in this turn land
                if not self._busy() and self._next_due() is None:
                    return
                continue
            self.advance(max(due - self.clock(), 0.0))

    # --- inside ------------------------------------------------------------------------

    def _channel(self, topic: str, channel: str) -> _Channel:
        state = self._topics.setdefault(topic, _Topic())
        ch = state.channels.get(channel)
        if ch is None:
            ch = state.channels[channel] = _Channel()
        return ch

    # --- what a MemorySubscription asks of its broker ----------------------------------

    def attach(self, sub: MemorySubscription) -> None:
        """Let ``sub`` take deliveries of its channel (created if new); starts the pump."""
        ch = self._channel(sub.topic, sub.channel)
        ch.subscriptions.append(sub)
        self._subscriptions.append(sub)
        if self._pump_task is None or self._pump_task.done():
            self._changed = asyncio.Event()
            self._pump_task = asyncio.create_task(self._run_pump())
        self._wake()

    def detach(self, sub: MemorySubscription) -> None:
        """Stop delivering to ``sub``; what it holds unanswered goes back to the front of
        its channel, as nsqd requeues a closed connection's messages."""
        ch = self._channel(sub.topic, sub.channel)
        if sub in ch.subscriptions:
            ch.subscriptions.remove(sub)
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
        for entry in [e for e in ch.in_flight.values() if e.holder is sub]:
            del ch.in_flight[entry.id]
            ch.ready.appendleft(entry)
        self._wake()

    def flow_changed(self) -> None:
        """A subscription's flow or window changed: the pump looks again."""
        self._wake()

    def settle(self, msg: Message, outcome: Settle, delay: float = 0.0) -> bool:
        """Record the answer to ``msg``: ``"finish"``, ``"retry"`` (back to its channel
        after ``delay`` virtual seconds) or ``"reject"``. False, and nothing recorded,
        when ``msg`` is no longer the current delivery (it outlived ``ack_wait`` and was
        delivered again: a late answer)."""
        entry: _Entry
        delivery: int
        entry, delivery = msg.receipt
        ch = self._channel(msg.topic, msg.channel)
        if ch.in_flight.get(entry.id) is not entry or entry.delivery != delivery:
            return False
        del ch.in_flight[entry.id]
        entry.holder = None
        if outcome == "finish":
            ch.finished.append(Delivered(entry.body, msg.id, msg.attempts))
        elif outcome == "retry":
            ch.retried.append(Retried(entry.body, msg.id, msg.attempts, delay))
            self._delay(ch, entry, delay)
        else:
            ch.rejected.append(Delivered(entry.body, msg.id, msg.attempts))
        self._wake()
        return True

    def keep_alive(self, msg: Message) -> None:
        """Push ``msg``'s deadline ``ack_wait`` further, if it is the current delivery."""
        entry, delivery = msg.receipt
        if entry.delivery == delivery:
            entry.deadline = self.clock() + self.ack_wait

    def _delay(self, ch: _Channel, entry: _Entry, delay: float) -> None:
        heapq.heappush(ch.delayed, (self.clock() + delay, next(self._seq), entry))

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _run_pump(self) -> None:
        assert self._changed is not None
        while True:
            self._pump()
            due = self._next_due(include_deadlines=True)
            wait = None if due is None else max(due - self.clock(), 0.0) + 0.0005
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), wait)
            except TimeoutError:
                pass

    def _pump(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.callback()
        for state in list(self._topics.values()):
            if state.waiting and state.channels:
                # Like nsqd's topic: what waited for a channel goes to every channel
                # there is when the topic next pumps (those of one worker's start).
                for ch in state.channels.values():
                    ch.ready.extend(_Entry(e.id, e.body, e.timestamp) for e in state.waiting)
                state.waiting.clear()
            for ch in state.channels.values():
                self._pump_channel(ch, now)

    def _pump_channel(self, ch: _Channel, now: float) -> None:
        while ch.delayed and ch.delayed[0][0] <= now:
            ch.ready.append(heapq.heappop(ch.delayed)[2])
        for entry in [e for e in ch.in_flight.values() if e.deadline <= now]:
            del ch.in_flight[entry.id]  # unanswered in time: delivered again
            ch.timed_out += 1
            ch.ready.append(entry)
        subs = ch.subscriptions
        while ch.ready and subs:
            for _ in range(len(subs)):
                sub = subs[ch.turn % len(subs)]
                ch.turn += 1
                if sub.room():
                    break
            else:
                return
            entry = ch.ready.popleft()
            entry.attempts += 1
            entry.delivery += 1
            entry.deadline = now + self.ack_wait
            entry.holder = sub
            ch.in_flight[entry.id] = entry
            sub.hand_over(entry, entry.delivery, now)

    def _busy(self) -> bool:
        for state in self._topics.values():
            for ch in state.channels.values():
                if ch.in_flight:
                    return True
                if ch.ready and any(s.room() for s in ch.subscriptions):
                    return True
        return any(s.running for s in self._subscriptions)

    def _next_due(self, include_deadlines: bool = False) -> float | None:
        times = [t[0] for t in self._timers if not t[2].cancelled]
        for state in self._topics.values():
            for ch in state.channels.values():
                if ch.delayed and ch.subscriptions:
                    times.append(ch.delayed[0][0])
                if include_deadlines:
                    times += [e.deadline for e in ch.in_flight.values()]
        return min(times) if times else None

    def _summary(self) -> str:
        parts = []
        for topic, state in self._topics.items():
            for name, ch in state.channels.items():
                parts.append(
                    f"{topic}/{name}: {len(ch.ready)} ready, {len(ch.in_flight)} in flight, "
                    f"{len(ch.delayed)} delayed"
                )
        return "; ".join(parts) or "no topics"


class MemorySubscription:
    """One channel of a :class:`MemoryTransport` topic, for one receiver."""

    def __init__(
        self, broker: MemoryTransport, topic: str, channel: str, name: str, max_in_flight: int
    ) -> None:
        self.broker = broker
        self.topic = topic
        self.channel = channel
        self.name = name
        self.window = max_in_flight
        self.flow = Flow.OPEN
        self.running = 0  # delivered and not settled, this subscription's
        self._receiver: Receiver | None = None
        self._stopped = False

    async def start(self, receiver: Receiver) -> None:
        """Attach to the channel; deliveries start on the next loop turn."""
        self._receiver = receiver
        self.broker.attach(self)

    def set_flow(self, flow: Flow, window: int) -> None:
        """Honoured by the pump: open up to ``window``, probe one, or none."""
        self.flow, self.window = flow, window
        self.broker.flow_changed()

    def room(self) -> bool:
        """Whether flow control lets one more delivery through."""
        if self._receiver is None or self._stopped or self.flow is Flow.PAUSED:
            return False
        limit = 1 if self.flow is Flow.PROBE else self.window
        return self.running < limit

    def hand_over(self, entry: _Entry, delivery: int, now: float) -> None:
        assert self._receiver is not None
        self.running += 1
        msg = Message(
            entry.id, entry.body, entry.timestamp, entry.attempts, self.topic, self.channel,
            ADDRESS, self._receiver, (entry, delivery), now,
        )  # fmt: skip
        if self._receiver.deliver(msg):
            self.finish(msg)

    async def stop(self) -> None:
        """No more deliveries."""
        self._stopped = True

    async def close(self) -> None:
        """Detach; anything still unanswered goes back to the channel."""
        self._stopped = True
        self.broker.detach(self)

    @property
    def ready(self) -> bool:
        """True once started and until stopped."""
        return self._receiver is not None and not self._stopped

    @property
    def subscribed(self) -> bool:
        """Same as :attr:`ready`."""
        return self.ready

    def stats(self) -> SubscriptionStats:
        """The window and this subscription's unanswered deliveries."""
        window = 0 if not self.room() and self.flow is Flow.PAUSED else self.window
        return SubscriptionStats(
            connected=int(self.subscribed), window=window, in_flight=self.running
        )

    def clock(self) -> float:
        """The transport's virtual clock."""
        return self.broker.clock()

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        """A timer on the virtual clock."""
        return self.broker.call_later(delay, callback)

    def _settle(self, msg: Message, outcome: Settle, delay: float = 0.0) -> None:
        self.running -= 1
        self.broker.settle(msg, outcome, delay)

    def finish(self, msg: Message) -> None:
        """Done: recorded in :meth:`MemoryTransport.finished`."""
        self._settle(msg, "finish")

    def retry(self, msg: Message, delay: float) -> None:
        """Back to the channel after ``delay`` virtual seconds."""
        self._settle(msg, "retry", delay)

    def reject(self, msg: Message) -> None:
        """Rejected: recorded in :meth:`MemoryTransport.rejected`."""
        self._settle(msg, "reject")

    def keep_alive(self, msg: Message) -> None:
        """Push the delivery's deadline ``ack_wait`` further."""
        self.broker.keep_alive(msg)

    def keep_alive_interval(self, msg: Message) -> float | None:
        """Half of ``ack_wait``."""
        return self.broker.ack_wait / 2

    def max_hold(self, msg: Message) -> float | None:
        """No limit."""
        return None


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
