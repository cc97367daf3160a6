"""Sizes of a run: the full one (``make bench``) and ``--quick``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from bench.common import default_loop

SECTIONS = (
    "outofbox", "consume", "publish", "latency", "memory", "scale", "cpu", "telemetry", "handlers",
    "seam", "nats", "streams",
)  # fmt: skip
"""In the order they run and are reported. A section is a module ``bench/<name>.py``
with ``run(broker, cfg, results, say)``; ``bench.runner.SECTION_MODULES`` maps names to
modules (bench/spark.py and bench/rpc.py are added there and here)."""

Say = Callable[[str], None]


@dataclass(frozen=True)
class Config:
    """How much each case does. Durations in seconds."""

    runs: int = 3
    loop: str = dataclasses.field(default_factory=default_loop)
    # consume
    consume_count: int = 200_000
    max_in_flight: int = 2500
    consume_timeout: float = 240.0
    # publish
    publish_seconds: float = 2.0
    concurrent_batch: int = 1000
    mpub_batch: int = 100
    # latency
    latency_rates: tuple[int, ...] = (1000, 10_000)
    latency_seconds: float = 3.0
    # memory
    idle_tasks: int = 10
    # scale
    scale_tasks: int = 100
    scale_per_task: int = 2000
    scale_max_in_flight: int = 100
    nsqd_count: int = 8
    nsqd_max_in_flight: int = 4
    per_nsqd: int = 2000
    # cpu (offline feed)
    cpu_count: int = 200_000
    # telemetry: consume with tracing off, 1%, 100%
    telemetry_count: int = 100_000
    telemetry_extra_runs: int = 2
    outofbox_extra_runs: int = 2
    # nats (bench/nats.py)
    nats_count: int = 100_000
    nats_publish_count: int = 20_000
    nats_latency_seconds: float = 10.0
    # streams (bench/streams.py)
    streams_count: int = 100_000
    """Runs beyond ``runs`` for the out-of-the-box table: the headline ratio, from two
    processes' rates that each vary by a fifth on this machine."""
    """Runs beyond ``runs`` for the through-nsqd tracing costs (differences of rates,
    from each case's fastest run)."""

    @classmethod
    def quick(cls, loop: str | None = None) -> Config:
        """A smoke check: every case, small, once."""
        return cls(
            runs=1,
            loop=loop or default_loop(),
            consume_count=20_000,
            consume_timeout=60.0,
            publish_seconds=0.5,
            latency_seconds=1.0,
            scale_per_task=200,
            per_nsqd=250,
            cpu_count=50_000,
            telemetry_count=10_000,
            telemetry_extra_runs=0,
            outofbox_extra_runs=0,
            nats_count=2000,
            nats_publish_count=1000,
            nats_latency_seconds=2.0,
            streams_count=5000,
        )
