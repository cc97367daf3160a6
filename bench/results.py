"""What a run measured: one :class:`Series` per row, and the targets checked on them."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Series:
    """One row: a client or figure measured once per run."""

    key: str
    section: str
    label: str
    unit: str
    higher_is_better: bool = True
    values: list[float] = field(default_factory=list)
    raw: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    note: str = ""

    def add(self, value: float, raw: dict[str, Any] | None = None) -> None:
        self.values.append(value)
        self.raw.append(raw or {})

    @property
    def ok(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median, a fraction."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def first(self, name: str, default: Any = None) -> Any:
        """A field of the first raw result that has it."""
        for raw in self.raw:
            if name in raw:
                return raw[name]
        return default


@dataclass
class Target:
    """A promise checked against the measurements; ``passed`` None = not measured."""

    text: str
    short: str
    row: str
    measured: str = "not measured"
    passed: bool | None = None


@dataclass
class Results:
    """Everything one run measured, in the order it was measured."""

    series: dict[str, Series] = field(default_factory=dict)
    references: dict[str, tuple[str, str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def row(
        self,
        key: str,
        section: str,
        label: str,
        unit: str,
        *,
        higher_is_better: bool = True,
        note: str = "",
    ) -> Series:
        """The series ``key``, created on first use."""
        if key not in self.series:
            self.series[key] = Series(key, section, label, unit, higher_is_better, note=note)
        return self.series[key]

    def compare(self, key: str, pynsq: str = "", limit: str = "") -> None:
        """Show ``key`` as a ratio to the pynsq row and to the limit row (NSQ's Go
        tools, or the offline floor) given."""
        self.references[key] = (pynsq, limit)

    def get(self, key: str) -> Series | None:
        series = self.series.get(key)
        return series if series is not None and series.ok else None

    def ratio(self, key: str, reference: str) -> float | None:
        """How many times better ``key`` is than ``reference`` (medians): for rates
        key / reference, for costs reference / key. None when either is missing."""
        a, b = self.get(key), self.get(reference)
        if a is None or b is None:
            return None
        return _better(a.median, b.median, a.higher_is_better)

    def ratio_range(self, key: str, reference: str) -> tuple[float, float] | None:
        """Lowest and highest ratio of runs measured side by side (run i to run i)."""
        a, b = self.get(key), self.get(reference)
        if a is None or b is None or len(a.values) != len(b.values):
            return None
        pairs = zip(a.values, b.values, strict=True)
        ratios = [r for x, y in pairs if (r := _better(x, y, a.higher_is_better)) is not None]
        return (min(ratios), max(ratios)) if ratios else None


def _better(value: float, reference: float, higher_is_better: bool) -> float | None:
    if higher_is_better:
        return value / reference if reference else None
    return reference / value if value else None


# --- targets --------------------------------------------------------------------------

Check = Callable[[Results], tuple[str, bool] | None]


def _at_least_ratio(key: str, reference: str, factor: float) -> Check:
    def check(results: Results) -> tuple[str, bool] | None:
        ratio = results.ratio(key, reference)
        if ratio is None:
            return None
        shown = f"{ratio:.0%}" if factor < 1 else f"{ratio:.1f}x"
        return shown, ratio >= factor

    return check


def _every_run_ratio(key: str, reference: str, factor: float) -> Check:
    """``key`` at least ``factor`` of ``reference`` in each run, run i against run i
    (both measured in the same runs): the worst run decides, not the medians."""

    def check(results: Results) -> tuple[str, bool] | None:
        ratios = results.ratio_range(key, reference)
        median = results.ratio(key, reference)
        if ratios is None or median is None:
            return None
        return f"worst run {ratios[0]:.0%} (median {median:.0%})", ratios[0] >= factor

    return check


def _at_most(key: str, limit: float, unit: str) -> Check:
    def check(results: Results) -> tuple[str, bool] | None:
        series = results.get(key)
        if series is None:
            return None
        return f"{series.median:.2f} {unit} (worst run {series.high:.2f})", series.high <= limit

    return check


TARGETS: list[tuple[str, str, str, Check]] = [
    (
        "out of the box: `nsqworker run --workers 1`, default settings, >= 10x pynsq",
        ">= 10x pynsq",
        "outofbox/run-1",
        _at_least_ratio("outofbox/run-1", "outofbox/pynsq", 10),
    ),
    (
        "out of the box: `nsqworker run --workers 1` >= 90% of bench_reader in every run",
        ">= 90% of Go, every run",
        "outofbox/run-1",
        _every_run_ratio("outofbox/run-1", "outofbox/bench_reader", 0.9),
    ),
    (
        "out of the box: idle RSS of supervisor + 1 worker <= 120 MB",
        "<= 120 MB",
        "outofbox/idle-rss",
        _at_most("outofbox/idle-rss", 120.0, "MB"),
    ),
    (
        "raw Consumer >= 15x pynsq",
        ">= 15x pynsq",
        "consume/consumer",
        _at_least_ratio("consume/consumer", "consume/pynsq", 15),
    ),
    (
        "raw Consumer >= 60% of bench_reader",
        ">= 60% of Go",
        "consume/consumer",
        _at_least_ratio("consume/consumer", "consume/bench_reader", 0.6),
    ),
    (
        "Worker path, async no-op >= 10x pynsq",
        ">= 10x pynsq",
        "consume/worker-async",
        _at_least_ratio("consume/worker-async", "consume/pynsq", 10),
    ),
    (
        "Worker path, sync no-op >= 3x pynsq",
        ">= 3x pynsq",
        "consume/worker-sync",
        _at_least_ratio("consume/worker-sync", "consume/pynsq", 3),
    ),
    (
        "concurrent publishes (1,000 at once) >= 3x pynsq",
        ">= 3x pynsq",
        "publish/concurrent-ours",
        _at_least_ratio("publish/concurrent-ours", "publish/concurrent-pynsq", 3),
    ),
    (
        "MPUB of 100 x 100 B, up to 4 outstanding >= bench_writer (same run)",
        ">= Go",
        "publish/mpub4-ours",
        _at_least_ratio("publish/mpub4-ours", "publish/mpub-go", 1.0),
    ),
    (
        "MPUB of 100 x 100 B, one at a time >= 60% of bench_writer",
        ">= 60% of Go",
        "publish/mpub-ours",
        _at_least_ratio("publish/mpub-ours", "publish/mpub-go", 0.6),
    ),
    (
        "p99 latency <= 5 ms at 1k msg/s",
        "<= 5 ms",
        "latency/1000-p99",
        _at_most("latency/1000-p99", 5.0, "ms"),
    ),
    ("idle RSS <= 80 MB", "<= 80 MB", "memory/idle", _at_most("memory/idle", 80.0, "MB")),
    (
        "tracing, no SDK: < 1 us per message (in process)",
        "< 1 us",
        "telemetry/no-sdk-global-proxies",
        _at_most("telemetry/no-sdk-global-proxies", 1.0, "us"),
    ),
    (
        "tracing, 1% sampled: < 3 us per message (through nsqd)",
        "< 3 us",
        "telemetry/consume-cost-ratio",
        _at_most("telemetry/consume-cost-ratio", 3.0, "us"),
    ),
    (
        "tracing, 100% sampled: <= 5 us more than a bare SDK span (in process)",
        "<= bare + 5 us",
        "telemetry/100-minus-bare-span",
        _at_most("telemetry/100-minus-bare-span", 5.0, "us"),
    ),
    (
        "tracing, 100% sampled: <= 5 us more than a bare SDK span (through nsqd)",
        "<= bare + 5 us",
        "telemetry/consume-full-over-bare",
        _at_most("telemetry/consume-full-over-bare", 5.0, "us"),
    ),
    (
        "the transport seam: `nsqworker run` out of the box, after it, >= 15x pynsq",
        ">= 15x pynsq",
        "seam/run-after",
        _at_least_ratio("seam/run-after", "seam/pynsq", 15),
    ),
    (
        "the transport seam: `nsqworker run` out of the box within 5% of before it",
        ">= 95% of before",
        "seam/run-after",
        _at_least_ratio("seam/run-after", "seam/run-before", 0.95),
    ),
    (
        "the transport seam: in-process Worker, async, within 5% of before it",
        ">= 95% of before",
        "seam/worker-async-after",
        _at_least_ratio("seam/worker-async-after", "seam/worker-async-before", 0.95),
    ),
    (
        "the transport seam: in-process Worker, sync, within 5% of before it",
        ">= 95% of before",
        "seam/worker-sync-after",
        _at_least_ratio("seam/worker-sync-after", "seam/worker-sync-before", 0.95),
    ),
    (
        "the transport seam: Worker async CPU per message (offline feed) within 5% of before",
        ">= 95% of before",
        "seam/cpu-worker-async-after",
        _at_least_ratio("seam/cpu-worker-async-after", "seam/cpu-worker-async-before", 0.95),
    ),
    (
        "NATS: `nsqworker run --transport nats`, default settings, >= 2x FastStream",
        ">= 2x FastStream",
        "nats/nsqworker",
        _at_least_ratio("nats/nsqworker", "nats/faststream", 2),
    ),
    (
        "NATS: `nsqworker run --transport nats` >= 80% of a bare nats-py fetch loop",
        ">= 80% of bare nats-py",
        "nats/nsqworker",
        _at_least_ratio("nats/nsqworker", "nats/bare", 0.8),
    ),
    (
        "NATS: `nsqworker run --transport nats` (@task max_in_flight=500, natscli's window) >= 80% of natscli `nats bench js consume`",
        ">= 80% of natscli",
        "nats/nsqworker",
        _at_least_ratio("nats/nsqworker", "nats/natscli", 0.8),
    ),
    (
        "NATS: p99 publish -> handler <= 5 ms at 1k msg/s",
        "p99 <= 5 ms",
        "nats/p99",
        _at_most("nats/p99", 5.0, "ms"),
    ),
    (
        "RabbitMQ Streams: `nsqworker run --transport rabbitmq-stream` >= 80% of the Java"
        " stream-client consumer",
        ">= 80% of Java",
        "streams/nsqworker",
        _at_least_ratio("streams/nsqworker", "streams/java", 0.8),
    ),
]


def check_targets(results: Results) -> list[Target]:
    """Every target, PASS/MISS where its rows were measured."""
    targets = []
    for text, short, row, check in TARGETS:
        target = Target(text, short, row)
        outcome = check(results)
        if outcome is not None:
            target.measured, target.passed = outcome
        targets.append(target)
    return targets
