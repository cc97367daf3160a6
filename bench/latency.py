"""Latency: publish-to-handler p50/p99 at fixed offered rates, through the Worker.

nsqd buffers what it writes to a consumer: it flushes when ``output_buffer_size``
bytes are waiting or every ``output_buffer_timeout``, so at low rates a message can
wait for that timer. Each rate is measured with nsqworker's default (adaptive: an
unbuffered connection, and a buffered one only under load), which the target is
checked on, and with nsqd's own batching (16 KiB, 250 ms), to show what it costs.
"""

from __future__ import annotations

from typing import Any

from bench.config import Config, Say
from bench.env import BenchError, Broker, Child
from bench.results import Results

SETTINGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("", "default (adaptive)", {}),
    (
        "-batched",
        "nsqd's batching (16 KiB, 250 ms)",
        {"output_buffer_size": 16384, "output_buffer_timeout": 0.25},
    ),
)
QUANTILES = (("p50", "p50"), ("p99", "p99"))


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    for rate in cfg.latency_rates:
        for suffix, label, _ in SETTINGS:
            for name, _ in QUANTILES:
                results.row(
                    f"latency/{rate}{suffix}-{name}",
                    "latency",
                    f"{name} at {rate:,} msg/s, {label}",
                    "ms",
                    higher_is_better=False,
                )
    for i in range(cfg.runs):
        for rate in cfg.latency_rates:
            for suffix, label, settings in SETTINGS:
                say(f"latency run {i + 1}/{cfg.runs}: {rate} msg/s, {label}")
                _measure(broker, cfg, results, rate, f"latency/{rate}{suffix}", settings)


def _measure(
    broker: Broker,
    cfg: Config,
    results: Results,
    rate: int,
    prefix: str,
    settings: dict[str, Any],
) -> None:
    topic = broker.fresh_topic("latency")
    count = int(rate * cfg.latency_seconds)
    common = {"address": broker.tcp_address, "topic": topic, "count": count, "loop": cfg.loop}
    broker.nsqd.create_channel(topic, "bench")
    worker = Child(
        "latency:worker",
        {
            **common,
            "settings": settings,
            "max_in_flight": 2500,
            "timeout": cfg.latency_seconds + 30,
        },
    )
    try:
        worker.wait_event("ready", timeout=30)
        sent = Child("latency:publisher", {**common, "rate": rate}).result(cfg.latency_seconds + 60)
        result = {**worker.result(timeout=60), "offered_rate": sent["offered_rate"]}
        for name, field in QUANTILES:
            results.series[f"{prefix}-{name}"].add(result[f"{field}_ms"], result)
    except BenchError as exc:
        for name, _ in QUANTILES:
            results.series[f"{prefix}-{name}"].errors.append(str(exc))
    finally:
        worker.close()
        broker.delete_topic(topic)
