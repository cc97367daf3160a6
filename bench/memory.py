"""Memory: RSS of an idle Worker, and the peak RSS of each consumer under load.

The idle Worker (:mod:`bench.clients.idle`) runs ``idle_tasks`` async tasks, each
subscribed to its own topic, with no traffic; its VmRSS is read from
``/proc/<pid>/status`` one second after every task is subscribed. Peak RSS under load
is the VmHWM each consume process reports at its end (run the consume case too).
"""

from __future__ import annotations

import signal
import time

from bench.common import memory_fields
from bench.config import Config, Say
from bench.env import BenchError, Broker, Child
from bench.results import Results

SETTLE = 1.0
PEAKS = (
    ("worker-async", "Worker @task, async no-op"),
    ("worker-sync", "Worker @task, sync no-op"),
    ("consumer", "raw Consumer"),
    ("pynsq", "pynsq Reader"),
)


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    label = f"idle Worker, {cfg.idle_tasks} tasks subscribed (VmRSS)"
    series = results.row("memory/idle", "memory", label, "MB", higher_is_better=False)
    for i in range(cfg.runs):
        say(f"memory run {i + 1}/{cfg.runs}: idle Worker with {cfg.idle_tasks} tasks")
        topics = [broker.fresh_topic("idle") for _ in range(cfg.idle_tasks)]
        child = Child(
            "idle:worker", {"address": broker.tcp_address, "topics": topics, "loop": cfg.loop}
        )
        try:
            child.wait_event("ready", timeout=60)
            time.sleep(SETTLE)
            rss = memory_fields(child.pid)["rss_mb"]
            child.signal(signal.SIGTERM)
            series.add(rss, {**child.result(timeout=60), "rss_mb": rss})
        except BenchError as exc:
            series.errors.append(str(exc))
        finally:
            child.close()
            for topic in topics:
                broker.delete_topic(topic)


def add_peaks(results: Results) -> None:
    """Peak RSS (VmHWM) of each consume client, from the consume case's runs."""
    for key, label in PEAKS:
        consume = results.get(f"consume/{key}")
        if consume is None:
            continue
        series = results.row(
            f"memory/peak-{key}",
            "memory",
            f"{label}, peak while consuming (VmHWM)",
            "MB",
            higher_is_better=False,
        )
        for raw in consume.raw:
            series.add(raw["peak_rss_mb"], raw)
