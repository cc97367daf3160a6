"""Consume: drain pre-loaded messages with each client, first message to last.

Each client runs in its own process (:mod:`bench.clients.consume`) on a fresh topic
holding ``consume_count`` messages of 100 bytes (plus a few more, see :func:`headroom`)
and is timed from its first message to its ``consume_count``-th; NSQ's Go
``bench_reader`` is the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import gotools
from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, run_child
from bench.results import Results, Series

CLIENTS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("worker-async", "Worker @task, async no-op", "consume:worker", {"mode": "async"}),
    ("worker-sync", "Worker @task, sync no-op", "consume:worker", {"mode": "sync"}),
    ("consumer", "raw Consumer, no-op callback", "consume:consumer", {}),
    ("pynsq", "pynsq Reader, tornado", "consume:pynsq_reader", {}),
)
READER_GUESS = 300_000.0
"""msgs/s bench_reader is assumed to reach before its first run (sets its --runfor)."""
MIN_RUNFOR = 0.25


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """Every client drains ``cfg.consume_count`` fresh messages, ``cfg.runs`` times,
    interleaved (run 1 of each client, then run 2...)."""
    for key, label, _, _ in CLIENTS:
        results.row(f"consume/{key}", "consume", label, "msgs/s")
        results.compare(f"consume/{key}", "consume/pynsq", "consume/bench_reader")
    results.row("consume/bench_reader", "consume", "bench_reader (Go), the limit", "msgs/s")
    results.compare("consume/bench_reader", "consume/pynsq")
    reader_rate = READER_GUESS
    for i in range(cfg.runs):
        for key, label, target, extra in CLIENTS:
            say(f"consume run {i + 1}/{cfg.runs}: {label}")
            measure(broker, cfg, results.series[f"consume/{key}"], target, extra)
        say(f"consume run {i + 1}/{cfg.runs}: bench_reader")
        reader_rate = measure_reader(
            broker, cfg, results.series["consume/bench_reader"], reader_rate
        )
    _notes(results)


def _notes(results: Results) -> None:
    sync = results.series["consume/worker-sync"]
    threads = [raw["threads_running"] for raw in sync.raw if "threads_running" in raw]
    if threads:
        sync.note = f"threads in the process while consuming (loop thread + pool): {threads}"
    reader = results.series["consume/bench_reader"]
    if reader.raw:
        first = reader.raw[0]
        runfor = ", ".join(f"{raw['runfor']:.2f}s" for raw in reader.raw)
        reader.note = f"{first['connections']} connections x RDY {first['rdy']}, --runfor {runfor}"


def headroom(cfg: Config) -> int:
    """Messages queued beyond the ``consume_count`` timed, so the queue never runs dry
    while the clock runs: nsqd holds the last few messages of a drained queue in its
    output buffer until its flush timer fires (up to 250 ms), which would be timed too."""
    return 2 * cfg.max_in_flight + cfg.consume_count // 20


def measure(
    broker: Broker,
    cfg: Config,
    series: Series,
    target: str,
    extra: dict[str, Any],
    tree: Path = ROOT,
) -> None:
    topic = broker.fresh_topic("consume")
    try:
        broker.preload(topic, cfg.consume_count + headroom(cfg))
        params = {
            "address": broker.tcp_address,
            "topic": topic,
            "count": cfg.consume_count,
            "max_in_flight": cfg.max_in_flight,
            "timeout": cfg.consume_timeout,
            "loop": cfg.loop,
            **extra,
        }
        result = run_child(target, params, cfg.consume_timeout + 30, tree)
        series.add(result["rate"], result)
    except BenchError as exc:
        series.errors.append(str(exc))
    finally:
        broker.delete_topic(topic)


def measure_reader(broker: Broker, cfg: Config, series: Series, expected: float) -> float:
    """bench_reader runs for a fixed time: it gets one that should consume about half
    of the queue (at least MIN_RUNFOR, with more messages queued if needed), and its
    result only counts if the queue never ran dry."""
    connections = gotools.cpus()
    for _ in range(3):
        runfor = min(max(0.5 * cfg.consume_count / expected, MIN_RUNFOR), 5.0)
        count = max(cfg.consume_count, int(2 * expected * runfor))
        topic = broker.fresh_topic("consume")
        try:
            broker.preload(topic, count)
            result = gotools.bench_reader(broker, topic, runfor, cfg.max_in_flight, connections)
            drained = broker.depth(topic) == 0
        except (BenchError, ValueError) as exc:
            series.errors.append(str(exc))
            return expected
        finally:
            broker.delete_topic(topic)
        if not drained:
            series.add(result["rate"], result)
            return float(result["rate"])
        # It emptied the queue within runfor, so it is faster than that; aim higher.
        expected = 2 * max(result["rate"], count / runfor)
    series.errors.append("bench_reader drained the queue in every try")
    return expected
