"""Publish: msgs/s acknowledged by nsqd, ours vs pynsq's Writer vs NSQ's bench_writer.

Four shapes (see :mod:`bench.clients.publish`): PUB one at a time, ``concurrent_batch``
publishes at once (their limit: as many PUBs written at once on a bare socket), MPUB of ``mpub_batch`` one at a time, and (ours only) the same MPUBs
pipelined, up to ``MPUB_PIPELINE`` outstanding. bench_writer only sends MPUB, so
it is the Go reference for the MPUB shape (same batch size) and, with a batch of 1,
for the one-at-a-time shape. It runs with one connection (``GOMAXPROCS=1``), like our
Producer and pynsq's Writer, so all three wait for the same round trips.
"""

from __future__ import annotations

from typing import Any

from bench import gotools
from bench.config import Config, Say
from bench.env import BenchError, Broker, run_child
from bench.results import Results, Series

MODES = (
    ("pub", "PUB, one at a time"),
    ("concurrent", "{n} publishes at once"),
    ("mpub", "MPUB of {m}, one at a time"),
    ("mpub4", "MPUB of {m}, up to 4 outstanding"),
)
CLIENTS = (("ours", "Producer"), ("pynsq", "pynsq Writer"))
MPUB_PIPELINE = 4
"""MPUBs a pipelined Producer keeps in flight (bench_writer waits for each one)."""


def _clients(mode: str) -> tuple[tuple[str, str], ...]:
    return CLIENTS[:1] if mode == "mpub4" else CLIENTS


def _go(mode: str) -> str:
    """The limit row a shape is compared with: bench_writer's, or for publishes at once
    a bare socket's (a PUB each, all written at once)."""
    return {
        "pub": "publish/pub-go",
        "concurrent": "publish/concurrent-raw",
        "mpub": "publish/mpub-go",
        "mpub4": "publish/mpub-go",
    }[mode]


def _batch(cfg: Config, mode: str) -> int:
    sizes = {"pub": 1, "concurrent": cfg.concurrent_batch, "mpub": cfg.mpub_batch}
    return sizes.get(mode, cfg.mpub_batch)


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """Each shape with each client, ``cfg.runs`` times, interleaved."""
    for mode, title in MODES:
        shape = title.format(n=cfg.concurrent_batch, m=cfg.mpub_batch)
        go = _go(mode)
        for client, name in _clients(mode):
            key = f"publish/{mode}-{client}"
            results.row(key, "publish", f"{name}: {shape}", "msgs/s")
            results.compare(key, f"publish/{mode}-pynsq" if mode != "mpub4" else "", go)
        if go == f"publish/{mode}-go":
            label = f"bench_writer (Go): MPUB of {_batch(cfg, mode)}, one at a time"
            results.row(go, "publish", label, "msgs/s")
            results.compare(go, f"publish/{mode}-pynsq")
        elif go == f"publish/{mode}-raw":
            label = f"bare socket: {cfg.concurrent_batch:,} PUBs per write, the limit of a PUB each"
            results.row(go, "publish", label, "msgs/s")
            results.compare(go, f"publish/{mode}-pynsq")
    for i in range(cfg.runs):
        for mode, _ in MODES:
            for client, name in _clients(mode):
                say(f"publish run {i + 1}/{cfg.runs}: {name}, {mode}")
                _measure(broker, cfg, results.series[f"publish/{mode}-{client}"], client, mode)
            if _go(mode) == f"publish/{mode}-go":
                say(f"publish run {i + 1}/{cfg.runs}: bench_writer, {mode}")
                _measure_writer(broker, cfg, results.series[f"publish/{mode}-go"], mode)
            elif _go(mode) == f"publish/{mode}-raw":
                say(f"publish run {i + 1}/{cfg.runs}: bare socket, {mode}")
                _measure(broker, cfg, results.series[f"publish/{mode}-raw"], "raw", mode)


def _measure(broker: Broker, cfg: Config, series: Series, client: str, mode: str) -> None:
    topic = broker.fresh_topic("publish")
    params: dict[str, Any] = {
        "address": broker.tcp_address,
        "topic": topic,
        "mode": mode,
        "batch": _batch(cfg, mode),
        "pipeline": MPUB_PIPELINE,
        "seconds": cfg.publish_seconds,
        "loop": cfg.loop,
    }
    try:
        result = run_child(f"publish:{client}", params, cfg.publish_seconds + 60)
        series.add(result["rate"], result)
    except BenchError as exc:
        series.errors.append(str(exc))
    finally:
        broker.delete_topic(topic)


def _measure_writer(broker: Broker, cfg: Config, series: Series, mode: str) -> None:
    topic = broker.fresh_topic("publish")
    try:
        result = gotools.bench_writer(broker, topic, cfg.publish_seconds, _batch(cfg, mode))
        series.add(result["rate"], result)
    except (BenchError, ValueError) as exc:
        series.errors.append(str(exc))
    finally:
        broker.delete_topic(topic)
