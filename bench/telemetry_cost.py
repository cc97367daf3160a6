"""Telemetry: what tracing costs per message, two ways.

1. In one process: ``bench/bench_telemetry.py`` times what the worker does around a
   handler (``TaskInstrumentation.start``, Context attach/detach, ``end``), best of
   ``--repeat`` passes, with no SDK, 1% and 100% sampling, beside bare SDK spans; it
   is run as it is and its lines become rows.
2. Through nsqd: the async ``@task`` Worker drains ``telemetry_count`` messages with
   no SDK, with 1% sampling and with every message sampled (SDK, BatchSpanProcessor,
   an exporter that drops), and, untraced, with a handler that makes one bare SDK
   span with the same attributes, ``runs + telemetry_extra_runs`` times interleaved. Cost per
   message = 1e6 / rate - 1e6 / rate without the SDK, from each case's fastest run
   (as in 1, the machine's other load only ever slows a run; the run-by-run figures
   are in the row's note); the fully sampled cost minus the bare span's is what the
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
    runs = cfg.runs + cfg.telemetry_extra_runs
    rates = {}
    for key, label, _ in TRACED:
        rates[key] = results.row(f"telemetry/consume-{key}", "telemetry", label, "msgs/s")
    for i in range(runs):
        for key, label, tracing in TRACED:
            say(f"telemetry consume run {i + 1}/{runs}: {label}")
            extra = {"mode": "async", **({"tracing": tracing} if tracing else {})}
            consume.measure(broker, sized, rates[key], "consume:worker", extra)
    if any(len(series.values) != runs for series in rates.values()):
        return  # a failed run is in its row's errors
    costs = {}
    for key, label, _ in TRACED[1:]:
        costs[key] = _row(results, f"consume-cost-{key}", f"{label}: cost per message")
        costs[key].add(_cost(max(rates[key].values), max(rates["off"].values)))
        by_run = [_cost(r, b) for r, b in zip(rates[key].values, rates["off"].values, strict=True)]
        costs[key].note = _fastest_note(runs, by_run)
    over = _row(results, "consume-full-over-bare", "100% sampled cost minus bare span cost")
    over.add(costs["full"].values[0] - costs["bare"].values[0])
    full_runs = [
        _cost(r, b) for r, b in zip(rates["full"].values, rates["off"].values, strict=True)
    ]
    bare_runs = [
        _cost(r, b) for r, b in zip(rates["bare"].values, rates["off"].values, strict=True)
    ]
    over.note = _fastest_note(runs, [f - b for f, b in zip(full_runs, bare_runs, strict=True)])


def _cost(rate: float, base: float) -> float:
    """Microseconds per message added to the run without the SDK."""
    return 1e6 / rate - 1e6 / base


def _fastest_note(runs: int, by_run: list[float]) -> str:
    shown = ", ".join(f"{value:.2f}" for value in by_run)
    return f"from each case's fastest of {runs} runs; run by run: {shown} us"


def _row(results: Results, key: str, label: str) -> Series:
    return results.row(f"telemetry/{key}", "telemetry", label, "us/msg", higher_is_better=False)


def _in_process(cfg: Config, results: Results, say: Say) -> None:
    for i in range(cfg.runs):
        say(f"telemetry run {i + 1}/{cfg.runs}: bench/bench_telemetry.py")
        argv = [sys.executable, str(SCRIPT), "--messages", "5000", "--repeat", "20"]
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
