"""Handler features: what typed bodies, hooks, a time limit and publish_to cost per message.

Runs ``bench/bench_handlers.py`` (one process, the worker's own task runner on the
eager path, no broker, no SDK) ``cfg.runs`` times; its lines become rows: the plain
async handler, each feature's per-message time, and each one's cost over plain (a task
with no hooks and no typed body pays nothing for them: it runs the same code as before).
"""

from __future__ import annotations

import re
import sys

from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, run_tool
from bench.results import Results

SCRIPT = ROOT / "bench" / "bench_handlers.py"
_LINE = re.compile(r"^(?P<label>\S.*?)\s+(?P<us>-?[\d.]+) us/message$")
LABELS = {
    "plain": "async handler of the message, no hooks",
    "typed": "async handler of a pydantic model (typed body)",
    "hook-before": "with one before hook",
    "hook-after": "with one after hook",
    "timeout": "with a time limit (not reached)",
    "publish-to": "with publish_to (the result published before the ack; memory transport)",
}


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """``cfg.runs`` runs of bench_handlers.py; each printed line is a row."""
    for i in range(cfg.runs):
        say(f"handlers run {i + 1}/{cfg.runs}: bench/bench_handlers.py")
        argv = [sys.executable, str(SCRIPT), "--messages", "20000", "--repeat", "15"]
        try:
            output = run_tool(argv, timeout=300)
        except BenchError as exc:
            results.row("handlers/error", "handlers", "bench_handlers.py", "us/msg").errors.append(
                str(exc)
            )
            continue
        for line in output.splitlines():
            match = _LINE.match(line.strip())
            if match is None:
                continue
            name = match["label"]
            case, _, over = name.partition(" over ")
            label = LABELS.get(case, case) + (": cost over plain" if over else "")
            key = "handlers/" + re.sub(r"\W+", "-", name.lower()).strip("-")
            row = results.row(key, "handlers", label, "us/msg", higher_is_better=False)
            row.add(float(match["us"]), {"line": line.strip()})
