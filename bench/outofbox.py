"""Out of the box: ``nsqworker run`` as a user runs it, against pynsq's Reader.

The command runs as a subprocess (supervisor + ``--workers`` worker processes) with
default settings: nothing set but ``NSQWORKER_NSQD_TCP_ADDRESSES`` (and a free
``NSQWORKER_HEALTH_PORT``, so ``/metrics`` is served), its stderr (JSON logs, since it
is not a terminal) to a file, the OpenTelemetry SDK installed and not configured. The
task module holds one async no-op task with ``max_in_flight=2500``; its handler notes
when the first message arrived (once per process), which starts the clock.

Each run: start the command on a fresh topic and wait for ``/readyz``; read the idle
RSS of the supervisor and its children; pause the channel; queue ``consume_count``
messages (plus headroom); unpause; the clock stops when nsqd has counted
``consume_count`` FINs on the channel (looked at sparsely at first, every 3 ms near
the end); SIGTERM, and the command
must exit 0. pynsq's Reader (defaults, ``max_in_flight=2500``) drains the same count
from the same nsqd in the same run, interleaved, and so does Go's ``bench_reader`` (the
limit, as in the consume section): each run's ratio to it is that run's own, so "in every
run" is measured, not inferred from medians taken at different times.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import consume
from bench.common import CHANNEL
from bench.config import Config, Say
from bench.env import ROOT, BenchError, Broker, Proc, child_env, reap, spawn, stderr_tail
from bench.results import Results, Series

TASKS = """
import os
import time

from nsqworker import task

_first = []


@task(os.environ["BENCH_TOPIC"], channel="bench", max_in_flight=2500)
async def noop(msg):
    if not _first:
        _first.append(time.time())
        path = os.path.join(os.environ["BENCH_DIR"], f"first-{os.getpid()}")
        with open(path, "w") as out:
            out.write(repr(_first[0]))
"""
WORKERS = (1, 2)
POLL = 0.003
"""Seconds between looks at nsqd's FIN count near the end (the clock's resolution)..."""
POLL_MAX = 0.05
"""...and at most this long while far from it: each look costs nsqd and this process
CPU on the two cores the measured command runs on (looking every 5 ms throughout took
about a tenth off its rate)."""


def run(broker: Broker, cfg: Config, results: Results, say: Say) -> None:
    """``nsqworker run --workers N`` for each N and pynsq's Reader, ``cfg.runs +
    cfg.outofbox_extra_runs`` times, interleaved."""
    for n in WORKERS:
        key = f"outofbox/run-{n}"
        results.row(key, "outofbox", f"nsqworker run --workers {n}, default settings", "msgs/s")
        results.compare(key, "outofbox/pynsq", "outofbox/bench_reader")
    results.row("outofbox/pynsq", "outofbox", "pynsq Reader, its defaults", "msgs/s")
    results.compare("outofbox/pynsq", "", "outofbox/bench_reader")
    reader = results.row(
        "outofbox/bench_reader", "outofbox", "bench_reader (Go), the limit, same runs", "msgs/s"
    )
    results.compare("outofbox/bench_reader", "outofbox/pynsq")
    reader_rate = consume.READER_GUESS
    idle = results.row(
        "outofbox/idle-rss",
        "outofbox",
        "idle RSS, supervisor + 1 worker (VmRSS, summed)",
        "MB",
        higher_is_better=False,
    )
    runs = cfg.runs + cfg.outofbox_extra_runs
    for i in range(runs):
        for n in WORKERS:
            say(f"out of the box run {i + 1}/{runs}: nsqworker run --workers {n}")
            measure(broker, cfg, results.series[f"outofbox/run-{n}"], n, idle if n == 1 else None)
        say(f"out of the box run {i + 1}/{runs}: pynsq Reader")
        consume.measure(broker, cfg, results.series["outofbox/pynsq"], "consume:pynsq_reader", {})
        say(f"out of the box run {i + 1}/{runs}: bench_reader")
        reader_rate = consume.measure_reader(broker, cfg, reader, reader_rate)
    if idle.raw:
        idle.note = "processes: " + ", ".join(idle.raw[0]["processes"])


def measure(
    broker: Broker,
    cfg: Config,
    series: Series,
    workers: int,
    idle: Series | None,
    tree: Path = ROOT,
    tasks: str = TASKS,
    extra_env: dict[str, str] | None = None,
) -> None:
    """One run of ``nsqworker run --workers N`` (of ``tree``: this checkout by default)
    on the module ``tasks`` (default: the one no-op task), with ``extra_env``."""
    topic = broker.fresh_topic("outofbox")
    with tempfile.TemporaryDirectory(prefix="nsqworker-outofbox-") as tmp:
        folder = Path(tmp)
        (folder / "bench_tasks.py").write_text(tasks)
        port = _free_port()
        env = child_env(tree)
        env.update(
            PYTHONPATH=f"{folder}{os.pathsep}{env['PYTHONPATH']}",
            NSQWORKER_NSQD_TCP_ADDRESSES=broker.tcp_address,
            NSQWORKER_HEALTH_PORT=str(port),
            NSQWORKER_HEALTH_HOST="127.0.0.1",
            BENCH_TOPIC=topic,
            BENCH_DIR=str(folder),
        )
        if workers != 1:
            env["NSQWORKER_WORKERS"] = str(workers)
        env.update(extra_env or {})
        argv = [sys.executable, "-m", "nsqworker", "run", "bench_tasks"]
        proc = spawn(argv, env=env, cwd=tree)
        try:
            _wait_ready(proc, port, timeout=60)
            if idle is not None:
                time.sleep(1.0)  # settled: imports done, first polls and stats sent
                rss, names = _tree_rss(proc.pid)
                idle.add(rss, {"processes": names})
            _get(port, "/metrics")  # served, as it would be scraped
            broker.post("/channel/pause", topic=topic, channel=CHANNEL)
            broker.preload(topic, cfg.consume_count + consume.headroom(cfg))
            broker.post("/channel/unpause", topic=topic, channel=CHANNEL)
            ended = _wait_finished(broker, topic, cfg.consume_count, cfg.consume_timeout)
            started = min(float(p.read_text()) for p in folder.glob("first-*"))
            elapsed = ended - started
            lines = _stop(proc)
            series.add((cfg.consume_count - 1) / elapsed, {"elapsed": elapsed, "log_lines": lines})
        except (BenchError, OSError, ValueError, httpx.HTTPError) as exc:
            series.errors.append(f"{type(exc).__name__}: {exc}\n{stderr_tail(proc)}")
        finally:
            reap(proc)
            broker.delete_topic(topic)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5, trust_env=False)


def _wait_ready(proc: Proc, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise BenchError(f"nsqworker run exited with {proc.popen.returncode}")
        try:
            if _get(port, "/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise BenchError("nsqworker run was not ready in time")


def _wait_finished(broker: Broker, topic: str, count: int, timeout: float) -> float:
    """Wall time (time.time) when nsqd first reported ``count`` FINs on the channel."""
    began = time.monotonic()
    deadline = began + timeout
    with httpx.Client(base_url=broker.nsqd.http_address, trust_env=False, timeout=10) as http:
        params = {"format": "json", "topic": topic, "channel": CHANNEL, "include_clients": "false"}
        while time.monotonic() < deadline:
            stats = http.get("/stats", params=params).json()
            finished = sum(_finished(ch) for ch in _channels(stats))
            if finished >= count:
                return time.time()
            # Sleep about a third of the time left at the rate so far, within bounds.
            rate = finished / max(time.monotonic() - began, 1e-3)
            left = (count - finished) / rate if rate > 0 else POLL_MAX
            time.sleep(min(max(left / 3, POLL), POLL_MAX))
    raise BenchError(f"fewer than {count} messages finished in {timeout:g}s")


def _channels(stats: dict[str, Any]) -> list[dict[str, Any]]:
    # nsqd >= 1.0 answers {"topics": ...}; older ones wrap it in {"data": ...}.
    topics = stats.get("topics") or stats.get("data", {}).get("topics", [])
    return [ch for t in topics for ch in t.get("channels", []) if ch["channel_name"] == CHANNEL]


def _finished(channel: dict[str, Any]) -> int:
    """Messages that left the channel for good: FINed (nothing is REQed or timed out
    by a no-op handler; those would be back in depth or deferred)."""
    waiting = channel["depth"] + channel["in_flight_count"] + channel["deferred_count"]
    return int(channel["message_count"]) - int(waiting)


def _tree_rss(pid: int) -> tuple[float, list[str]]:
    """Summed VmRSS (MB) of ``pid`` and its descendants, and who they are."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        names[int(entry.name)] = name
    total, seen, todo = 0.0, [], [pid]
    while todo:
        current = todo.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
        except OSError:
            continue
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        total += kb / 1024
        seen.append(f"{names.get(current, '?')} {kb / 1024:.1f} MB")
        todo.extend(children.get(current, []))
    return total, seen


def _stop(proc: Proc) -> int:
    """SIGTERM the command; it must drain and exit 0. Returns its log line count."""
    proc.popen.terminate()
    try:
        code = proc.popen.wait(30)
    except Exception as exc:
        raise BenchError("nsqworker run did not stop within 30 s") from exc
    if code != 0:
        raise BenchError(f"nsqworker run exited with {code} on SIGTERM")
    proc.stderr.seek(0)
    lines = proc.stderr.read().decode("utf-8", "replace").splitlines()
    for line in lines:
        json.loads(line)  # every line is one JSON object
    return len(lines)
