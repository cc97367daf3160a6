"""Scale: many tasks in one Worker, and one task over many nsqd with a small window.

* ``scale_tasks`` async no-op tasks in one process, one topic each on the run's nsqd,
  each pre-loaded with ``scale_per_task`` messages: time from ``Worker.start()`` until
  every task is subscribed, the rate over all of them, and how evenly it is spread
  (each task's own rate: its messages over the time its last one arrived).
* ``nsqd_count`` more nsqd, each pre-loaded with ``per_nsqd`` messages, and one task
  with ``max_in_flight`` = ``nsqd_max_in_flight`` (fewer than connections, so RDY
  rotates): time until all are drained, counted from ``Worker.start()``, and each
  nsqd's share of the messages handled when half of them were (fair: 1/``nsqd_count``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bench.config import Config, Say
from bench.env import BenchError, Broker, run_child
from bench.results import Results


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    n = cfg.scale_tasks
    ready = results.row(
        "scale/tasks-ready",
        "scale",
        f"{n} tasks: start to all subscribed",
        "s",
        higher_is_better=False,
    )
    rate = results.row("scale/tasks-rate", "scale", f"{n} tasks: msgs/s over all", "msgs/s")
    slowest = results.row(
        "scale/tasks-slowest", "scale", f"{n} tasks: slowest task's rate / median", "%"
    )
    m, w = cfg.nsqd_count, cfg.nsqd_max_in_flight
    drain = results.row(
        "scale/nsqd-drain",
        "scale",
        f"{m} nsqd, max_in_flight {w}: start to all drained",
        "s",
        higher_is_better=False,
    )
    share = results.row(
        "scale/nsqd-share", "scale", f"{m} nsqd: smallest share at half-way (fair {1 / m:.1%})", "%"
    )
    with _brokers(m) as brokers:
        for i in range(cfg.runs):
            say(f"scale run {i + 1}/{cfg.runs}: {n} tasks in one Worker")
            try:
                result = _many_tasks(broker, cfg)
                ready.add(result["ready_s"], result)
                rate.add(result["rate"], result)
                slowest.add(100 * result["task_rate_min"] / result["task_rate_median"], result)
            except BenchError as exc:
                for series in (ready, rate, slowest):
                    series.errors.append(str(exc))
            say(f"scale run {i + 1}/{cfg.runs}: {m} nsqd, max_in_flight {w}")
            try:
                result = _many_nsqd(brokers, cfg)
                drain.add(result["elapsed"], result)
                share.add(100 * result["share_min"], result)
            except BenchError as exc:
                for series in (drain, share):
                    series.errors.append(str(exc))
    share.note = "shares by nsqd at half-way: " + "; ".join(
        "/".join(f"{100 * s:.0f}" for s in raw["shares"]) + " %" for raw in share.raw
    )
    drain.note = "each nsqd drained at: " + "; ".join(
        "/".join(f"{t:.2f}" for t in raw["drained_at"]) + " s" for raw in drain.raw
    )


@contextlib.contextmanager
def _brokers(count: int) -> Iterator[list[Broker]]:
    brokers: list[Broker] = []
    try:
        for _ in range(count):
            brokers.append(Broker())
        yield brokers
    finally:
        for broker in brokers:
            broker.close()


def _many_tasks(broker: Broker, cfg: Config) -> dict[str, Any]:
    topics = [broker.fresh_topic("tasks") for _ in range(cfg.scale_tasks)]
    try:
        broker.preload_many(topics, cfg.scale_per_task)
        params = {
            "address": broker.tcp_address,
            "topics": topics,
            "per_task": cfg.scale_per_task,
            "max_in_flight": cfg.scale_max_in_flight,
            "timeout": 120,
            "loop": cfg.loop,
        }
        return run_child("scale:many_tasks", params, 180)
    finally:
        for topic in topics:
            broker.delete_topic(topic)


def _many_nsqd(brokers: list[Broker], cfg: Config) -> dict[str, Any]:
    topic = brokers[0].fresh_topic("spread")
    try:
        for broker in brokers:
            broker.preload(topic, cfg.per_nsqd)
        params = {
            "addresses": [b.tcp_address for b in brokers],
            "topic": topic,
            "per_nsqd": cfg.per_nsqd,
            "max_in_flight": cfg.nsqd_max_in_flight,
            "timeout": 120,
            "loop": cfg.loop,
        }
        return run_child("scale:many_nsqd", params, 180)
    finally:
        for broker in brokers:
            broker.delete_topic(topic)
