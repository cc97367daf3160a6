"""Telemetry: what tracing costs per message, from ``bench/bench_telemetry.py``.

That script (the telemetry engineer's) times ``TaskInstrumentation.start`` + ``end``
in one process, best of ``--repeat`` passes, with no SDK, 1% and 100% sampling, and a
bare SDK span for comparison; it is run here as it is and its lines become rows.
"""

from __future__ import annotations

import re
import sys

from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, run_tool
from bench.results import Results

SCRIPT = ROOT / "bench" / "bench_telemetry.py"
_LINE = re.compile(r"^(?P<label>\S.*?)\s+(?P<us>-?[\d.]+) us/message$")


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
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
