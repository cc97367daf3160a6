"""What one worker process reports: per-task counters, gauges and handler durations.

Plain, picklable data: the supervisor aggregates it for ``/metrics`` and ``/readyz``,
and the OpenTelemetry observable instruments read the same numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from nsqworker.transport import SubscriptionStats

__all__ = [
    "DURATION_BUCKETS",
    "FINE_BUCKETS",
    "DispatchStats",
    "DurationHistogram",
    "TaskStats",
    "WorkerStats",
    "coarse_counts",
]

#: Upper bounds (seconds) of the handler-duration histogram: 1 ms handlers to 1 h jobs.
DURATION_BUCKETS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
DURATION_BUCKETS += (600, 1800, 3600)

_STEPS = 16
#: Finer bounds a task records durations in, for its summary line and slow-handler
#: threshold: each DURATION_BUCKETS interval split in 16 geometric steps (a few percent
#: wide), so a quantile interpolated inside one is close to the real figure (a 100 ms
#: handler shows p50 ~100 ms, not the 0.1-0.5 s bucket's middle). Every coarse bound is
#: one of them, so the coarse histogram is a sum of fine counts (:func:`coarse_counts`).
FINE_BUCKETS: tuple[float, ...] = (
    DURATION_BUCKETS[0],
    *(
        low * (high / low) ** (step / _STEPS) if step < _STEPS else high
        for low, high in pairwise(DURATION_BUCKETS)
        for step in range(1, _STEPS + 1)
    ),
)
_COARSE_OF = [sum(1 for bound in DURATION_BUCKETS if bound < fine) for fine in FINE_BUCKETS] + [
    len(DURATION_BUCKETS)
]


def coarse_counts(fine: list[int]) -> list[int]:
    """Counts over :data:`FINE_BUCKETS` (plus +Inf) summed into DURATION_BUCKETS'."""
    counts = [0] * (len(DURATION_BUCKETS) + 1)
    for index, count in enumerate(fine):
        if count:
            counts[_COARSE_OF[index]] += count
    return counts


@dataclass
class DurationHistogram:
    """Handler run times: ``counts[i]`` ran at most ``buckets[i]`` s; the last is +Inf."""

    buckets: list[float]
    counts: list[int]
    sum: float = 0.0
    count: int = 0


def _empty_histogram() -> DurationHistogram:
    return DurationHistogram(list(DURATION_BUCKETS), [0] * (len(DURATION_BUCKETS) + 1))


@dataclass
class TaskStats:
    """One task's numbers: the dispatcher's counters, the subscription's gauges and the
    worker's own."""

    name: str
    topic: str
    channel: str
    subscribed: bool = False
    ready: bool = False
    max_in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    dead_lettered: int = 0
    in_flight: int = 0
    running: int = 0
    rdy: int = 0
    """The flow-control window the broker may fill (RDY on NSQ)."""
    connections: int = 0
    buffered: int = 0
    """nsqd read on their buffered connection (adaptive output buffering, under load)."""
    backoff_level: int = 0
    backoff_stalls: int = 0
    """Times the stall detector had to reopen a paused or probing flow (never, normally)."""
    duration: DurationHistogram = field(default_factory=_empty_histogram)
    connection_errors: dict[str, int] = field(default_factory=dict)
    system: str = "nsq"
    """The transport's ``messaging.system`` (nsq, nats, rabbitmq...)."""
    dead_letter_topic: str | None = None
    """Where the task publishes its dead letters, if anywhere (the console lists it)."""
    last_error: dict[str, Any] | None = None
    """The latest handler failure: ``error`` (type and message, cut), ``id``, ``at``
    (Unix seconds) and ``outcome`` (retry or reject); None before the first."""


@dataclass
class WorkerStats:
    """A snapshot of one worker process; plain data, picklable."""

    pid: int
    ready: bool
    tasks: dict[str, TaskStats]
    recycle: str | None = None
    """Why the process asks to be replaced after a drain, or None."""
    inflight: list[dict[str, Any]] = field(default_factory=list)
    """Messages in flight beyond the hot path (``Worker.inflight``), oldest first."""

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-ready dicts and lists."""
        return asdict(self)


@dataclass
class DispatchStats:
    """A snapshot of one dispatcher: its counters and its subscription's view."""

    max_in_flight: int
    in_flight: int
    running: int
    received: int
    finished: int
    requeued: int
    given_up: int
    backoff_level: int
    backoff_phase: str
    backoff_stalls: int = 0
    subscription: SubscriptionStats = field(default_factory=SubscriptionStats)

    @property
    def rdy(self) -> int:
        """The flow-control window the broker may fill (RDY on NSQ)."""
        return self.subscription.window

    @property
    def connected(self) -> int:
        """Open connections."""
        return self.subscription.connected

    @property
    def connections(self) -> list[Any]:
        """Per-connection detail from the transport."""
        return self.subscription.connections
