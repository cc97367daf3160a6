"""Telemetry: what tracing costs per message, two ways.

1. In one process: ``bench/bench_telemetry.py`` times what the worker does around a
   handler (``TaskInstrumentation.start``, Context attach/detach, ``end``), best of
   ``--repeat`` passes, with no SDK, 1% and 100% sampling, beside bare SDK spans; it
   is run as it is and its lines become rows.
2. Through nsqd: the async ``@task`` Worker drains ``telemetry_count`` messages with
   no SDK, with 1% sampling and with every message sampled (SDK, BatchSpanProcessor,
   an exporter that drops), and, untraced, with a handler that makes one bare SDK
   span with the same attributes. Cost per message = 1e6 / rate - 1e6 / rate without
   the SDK, run by run; the fully sampled cost minus the bare span's is what the
   framework adds around the SDK.
"""

from __future__ import annotations

import dataclasses
import re
import sys

from bench import consume
from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, run_tool
from bench.results import Results, Series

SCRIPT = ROOT / "bench" / "bench_telemetry.py"
_LINE = re.compile(r"^(?P<label>\S.*?)\s+(?P<us>-?[\d.]+) us/message$")


TRACED = (
    ("off", "Worker async, no SDK", None),
    ("ratio", "Worker async, 1% sampled", "ratio"),
    ("full", "Worker async, 100% sampled", "full"),
    ("bare", "Worker async untraced, handler makes a bare SDK span", "bare"),
)


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """Both measures, ``cfg.runs`` times each."""
    _in_process(cfg, results, say)
    _through_nsqd(broker, cfg, results, say)


def _through_nsqd(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    sized = dataclasses.replace(cfg, consume_count=cfg.telemetry_count)
    rates = {}
    for key, label, _ in TRACED:
        rates[key] = results.row(f"telemetry/consume-{key}", "telemetry", label, "msgs/s")
    for i in range(cfg.runs):
        for key, label, tracing in TRACED:
            say(f"telemetry consume run {i + 1}/{cfg.runs}: {label}")
            extra = {"mode": "async", **({"tracing": tracing} if tracing else {})}
            consume.measure(broker, sized, rates[key], "consume:worker", extra)
    costs = {}
    for key, label, _ in TRACED[1:]:
        if len(rates[key].values) == len(rates["off"].values) == cfg.runs:
            costs[key] = _row(results, f"consume-cost-{key}", f"{label}: cost per message")
            for rate, base in zip(rates[key].values, rates["off"].values, strict=True):
                costs[key].add(1e6 / rate - 1e6 / base)
    if "full" in costs and "bare" in costs:
        over = _row(results, "consume-full-over-bare", "100% sampled cost minus bare span cost")
        for full, bare in zip(costs["full"].values, costs["bare"].values, strict=True):
            over.add(full - bare)


def _row(results: Results, key: str, label: str) -> Series:
    return results.row(f"telemetry/{key}", "telemetry", label, "us/msg", higher_is_better=False)


def _in_process(cfg: Config, results: Results, say: Say) -> None:
    for i in range(cfg.runs):
        say(f"telemetry run {i + 1}/{cfg.runs}: bench/bench_telemetry.py")
        argv = [sys.executable, str(SCRIPT), "--messages", "5000", "--repeat", "10"]
        try:
            output = run_tool(argv, timeout=300)
        except BenchError as exc:
            results.row(
                "telemetry/error", "telemetry", "bench_telemetry.py", "us/msg"
            ).errors.append(str(exc))
            continue
        for line in output.splitlines():
            match = _LINE.match(line.strip())
            if match is None:
                continue
            label = match["label"]
            key = "telemetry/" + re.sub(r"\W+", "-", label.lower()).strip("-")
            row = results.row(key, "telemetry", label, "us/msg", higher_is_better=False)
            row.add(float(match["us"]), {"line": line.strip()})
