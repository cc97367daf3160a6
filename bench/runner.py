"""``python -m bench``: start nsqd, run the cases, print the table, write the docs."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from bench import memory, report
from bench.common import default_loop, loop_label
from bench.config import SECTIONS, Config
from bench.env import MEM_QUEUE_SIZE, ROOT, Broker, cleanup, nsqd_version
from bench.method import method
from bench.results import Results

DOCS = ROOT / "docs"
TABLE_WIDTH = 170
"""Columns of the table when stdout is not a terminal (a log file, a pipe)."""
SECTION_MODULES: dict[str, str] = {
    "outofbox": "bench.outofbox",
    "consume": "bench.consume",
    "publish": "bench.publish",
    "latency": "bench.latency",
    "memory": "bench.memory",
    "scale": "bench.scale",
    "cpu": "bench.cpu",
    "telemetry": "bench.telemetry_cost",
    "handlers": "bench.handlers",
    "seam": "bench.seam",
    "nats": "bench.nats",
    "streams": "bench.streams",
    # Next: "spark": "bench.spark", "rpc": "bench.rpc" (and their names in
    # config.SECTIONS, their targets in results.TARGETS, titles in report.SECTION_TITLES).
}
"""Each section's module; its ``run(broker, cfg, results, say)`` measures the section."""


def runner(section: str) -> Callable[[Broker, Config, Results, Callable[[str], None]], None]:
    """The ``run`` function of a section, imported when the section runs."""
    run: Callable[[Broker, Config, Results, Callable[[str], None]], None]
    run = importlib.import_module(SECTION_MODULES[section]).run
    return run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="nsqworker benchmarks against a real nsqd; see docs/benchmarks.md.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke check")
    parser.add_argument(
        "--only", default="", help=f"comma-separated sections to run ({','.join(SECTIONS)})"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs of each case (default 3)")
    parser.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default=default_loop(), help="for our clients"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write benchmarks.md and .png here (default: docs/ for a full run, else nowhere)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every raw result")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in only] if only else list(SECTIONS)
    if args.out is None and not args.quick and not only:
        args.out = DOCS
    return args


def config(args: argparse.Namespace) -> Config:
    cfg = Config.quick(args.loop) if args.quick else Config(loop=args.loop)
    if args.runs is not None:
        cfg = dataclasses.replace(cfg, runs=max(1, args.runs))
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config(args)
    console = Console(stderr=True, width=None if sys.stderr.isatty() else TABLE_WIDTH)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    results = Results(meta=_meta(cfg, argv))
    started = time.monotonic()

    def say(text: str) -> None:
        console.print(f"[dim]{time.monotonic() - started:6.1f}s[/dim] {text}")

    try:
        broker = Broker()
        say(
            f"nsqd on {broker.tcp_address} (pid {broker.pid}); sections: {', '.join(args.sections)}"
        )
        for section in args.sections:
            try:
                runner(section)(broker, cfg, results, say)
            except Exception as exc:  # one broken section must not lose the others
                say(f"[red]{section} failed[/red]: {type(exc).__name__}: {exc}")
                failed = results.row(f"{section}/failed", section, f"{section} section", "")
                failed.errors.append(f"{type(exc).__name__}: {exc}")
        if "consume" in args.sections and "memory" in args.sections:
            memory.add_peaks(results)
    finally:
        cleanup()
    results.meta["load_after"] = _load()
    results.meta["seconds"] = round(time.monotonic() - started)
    report.print_table(results, Console(width=None if sys.stdout.isatty() else TABLE_WIDTH))
    _write(args, cfg, results, console)
    return 0 if all(s.ok for s in results.series.values()) else 1


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _write(args: argparse.Namespace, cfg: Config, results: Results, console: Console) -> None:
    if args.json is not None:
        data = {
            "meta": results.meta,
            "series": [dataclasses.asdict(s) for s in results.series.values()],
        }
        args.json.write_text(json.dumps(data, indent=1, default=str))
    out: Path | None = args.out
    if out is None:
        if not args.quick:
            return
        out = Path(tempfile.mkdtemp(prefix="nsqworker-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    png = out / "benchmarks.png"
    drawn = report.chart(results, png)
    text = report.markdown(
        results, png.name if drawn else None, method(cfg, loop_label(cfg.loop), MEM_QUEUE_SIZE)
    )
    (out / "benchmarks.md").write_text(text)
    console.print(f"wrote {out / 'benchmarks.md'}" + (f" and {png}" if drawn else ""))


# --- describing the run -------------------------------------------------------------------


def _meta(cfg: Config, argv: Sequence[str] | None) -> dict[str, Any]:
    command = (
        "make bench"
        if not (argv or sys.argv[1:])
        else "python -m bench " + " ".join(argv or sys.argv[1:])
    )
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "load_before": _load(),
        "python": platform.python_version(),
        "loop": loop_label(cfg.loop),
        "pynsq": _pynsq_label(),
        "nsqd": nsqd_version(),
        "runs": cfg.runs,
        "config": dataclasses.asdict(cfg),
    }


def _commit() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" + uncommitted changes" if git("status", "--porcelain") else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _pynsq_label() -> str:
    try:
        from importlib.metadata import version

        return f"tornado {version('tornado')} (asyncio), pynsq {version('pynsq')}"
    except Exception:
        return "pynsq (not installed)"
