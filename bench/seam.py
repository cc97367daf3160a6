"""The transport seam, before and after, in one run on one nsqd.

The tree of :data:`BASELINE` (the last commit before the transport seam: NSQ's
consumer held the task policy) is extracted with ``git archive`` into a temporary
directory; the same ``.venv`` serves it (no dependency changed for it), with that tree
first on ``PYTHONPATH`` and as the working directory of its processes, so its own
``nsqworker`` and ``bench`` are imported. Run by run, interleaved, each tree drains the
same count of fresh messages (the tree going first alternates run by run) with:

* ``nsqworker run --workers 1`` out of the box (bench/outofbox.py's measure, default
  settings), beside pynsq's Reader, for the ratio the issue asks to hold (>= 15x);
* the in-process ``Worker``, an async no-op ``@task`` and a sync one (the
  ``consume:worker`` child of bench/clients/consume.py), whose after/before ratio must
  stay within 5%;
* the same two Worker paths and the raw Consumer on the offline feed (bench/cpu.py's
  ``offline:feed``: pre-encoded frames into the connection, no nsqd, no socket): CPU
  microseconds per message, the least noisy comparison of the two hot paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench import consume, outofbox
from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, run_child
from bench.results import Results, Series

BASELINE = os.environ.get("BENCH_SEAM_BASELINE", "dc43164")
"""The commit before the transport seam (``nsqworker/nsq/consumer.py`` held the task
policy; the seam moved it to ``nsqworker/dispatch.py``); ``BENCH_SEAM_BASELINE`` names
another to compare with, e.g. the tree before a redesign step."""
TREES = ("before", "after")
CPU_PATHS = (
    ("worker-async", "Worker async"),
    ("worker-sync", "Worker sync"),
    ("consumer", "raw Consumer"),
)


def extract(commit: str) -> Path:
    """The tree of ``commit`` in a new temporary directory (removed by the caller)."""
    folder = Path(tempfile.mkdtemp(prefix=f"nsqworker-{commit}-"))
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise BenchError(f"git archive {commit}: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """Both trees, ``cfg.runs`` times, interleaved."""
    try:
        baseline = extract(BASELINE)
    except BenchError as exc:
        results.row("seam/error", "seam", f"the tree of {BASELINE}", "msgs/s").errors.append(
            str(exc)
        )
        return
    trees = {"before": baseline, "after": ROOT}
    try:
        _rows(results)
        for i in range(cfg.runs):
            # ABBA: the trees take turns going first, so what ran just before a case
            # (the other tree's CPU-bound offline feed, or pynsq) does not favour one.
            order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                say(f"seam run {i + 1}/{cfg.runs}: nsqworker run, {name} ({tree.name})")
                outofbox.measure(broker, cfg, results.series[f"seam/run-{name}"], 1, None, tree)
                for mode in ("async", "sync"):
                    say(f"seam run {i + 1}/{cfg.runs}: Worker {mode}, {name}")
                    series = results.series[f"seam/worker-{mode}-{name}"]
                    consume.measure(broker, cfg, series, "consume:worker", {"mode": mode}, tree)
                for path, label in CPU_PATHS:
                    say(f"seam run {i + 1}/{cfg.runs}: {label}, offline feed, {name}")
                    _cpu(cfg, results.series[f"seam/cpu-{path}-{name}"], path, tree)
            say(f"seam run {i + 1}/{cfg.runs}: pynsq Reader")
            consume.measure(broker, cfg, results.series["seam/pynsq"], "consume:pynsq_reader", {})
        _ratios(results)
    finally:
        shutil.rmtree(baseline, ignore_errors=True)


def _cpu(cfg: Config, series: Series, path: str, tree: Path) -> None:
    params = {"path": path, "count": cfg.cpu_count, "loop": cfg.loop}
    try:
        series.add(run_child("offline:feed", params, 300, tree)["us_per_msg"])
    except BenchError as exc:
        series.errors.append(str(exc))


def _rows(results: Results) -> None:
    for name in TREES:
        label = f"{name} the seam" + (f" ({BASELINE})" if name == "before" else " (this commit)")
        key = f"seam/run-{name}"
        results.row(key, "seam", f"nsqworker run --workers 1, {label}", "msgs/s")
        results.compare(key, "seam/pynsq")
        for mode in ("async", "sync"):
            key = f"seam/worker-{mode}-{name}"
            results.row(key, "seam", f"Worker @task, {mode} no-op, {label}", "msgs/s")
            results.compare(key, "seam/pynsq")
    results.row("seam/pynsq", "seam", "pynsq Reader, its defaults", "msgs/s")
    for path, label in CPU_PATHS:
        for name in TREES:
            results.row(
                f"seam/cpu-{path}-{name}", "seam", f"{label}, offline feed, {name} the seam",
                "us/msg", higher_is_better=False,
            )  # fmt: skip


def _ratios(results: Results) -> None:
    """after/before of each pair, from the medians, with the run-by-run figures."""
    for what, label in (
        ("run", "nsqworker run"),
        ("worker-async", "Worker async"),
        ("worker-sync", "Worker sync"),
        *((f"cpu-{path}", f"{name}, CPU per message") for path, name in CPU_PATHS),
    ):
        before = results.get(f"seam/{what}-before")
        after = results.get(f"seam/{what}-after")
        if before is None or after is None:
            continue
        row = results.row(
            f"seam/{what}-ratio", "seam", f"{label}: after / before the seam", "ratio"
        )
        pairs = list(zip(after.values, before.values, strict=False))
        row.add(after.median / before.median)
        row.note = "run by run: " + ", ".join(f"{a / b:.3f}" for a, b in pairs)
