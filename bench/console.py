"""The console: how fast it renders a large fleet, and what its polling costs a worker.

    python -m bench.console [--runs 3] [--count 200000] [--quick] [--json]

1. **Render.** 20 real health servers (each an ``nsqworker run``'s ``/status`` and
   ``/inflight``: one worker process, the same 50 tasks with counters and a last error,
   10 messages held) on loopback; the console's :class:`Fleet` reads them all, then
   the Tasks and Workers pages are requested from the app (in process) 20 times each.
   Reported: the time of one full read of the fleet, and of a page (median and worst);
   the goal is a page under 1 s.
2. **Cost to a worker.** ``nsqworker run --workers 1`` drains ``count`` messages from
   nsqd (bench/outofbox.py's measure: an async no-op task, default settings), with and
   without an ``nsqworker console`` process reading its ``/status`` and ``/inflight``
   every second (``console_poll_interval`` 1), interleaved run by run. Reported: msgs/s
   of each and their ratio (the goal: within the runs' own spread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any
from unittest import mock

import httpx

from bench import outofbox
from bench.config import Config
from bench.env import BenchError, Broker, child_env, cleanup, reap, spawn
from bench.results import Series
from nsqworker.admin.console.app import create_app
from nsqworker.admin.console.discovery import StaticWorkers
from nsqworker.admin.console.fleet import Fleet
from nsqworker.health import HealthServer, WorkerMetrics
from nsqworker.settings import Settings
from nsqworker.testing import free_port

SUPERVISORS = 20
TASKS = 50
HELD = 10
PAGES = 20
RENDER_GOAL_S = 1.0


def fleet_status(index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``/status`` and ``/inflight`` of supervisor ``index``: one worker, :data:`TASKS` tasks."""
    pid = 10_000 + index * 10
    tasks = [
        {
            "task": f"shop.tasks.task_{t:02d}", "topic": f"topic_{t:02d}", "channel": "main",
            "system": "nsq", "received": 1000 * t + index, "finished": 990 * t, "requeued": 7 * t,
            "dead_lettered": t, "in_flight": t % 5, "subscribed": True,
            "dead_letter_topic": f"topic_{t:02d}.dead",
            "last_error": {"error": f"ValueError: bad order {t}", "id": f"{t:016x}",
                           "attempts": 3, "at": time.time() - t, "outcome": "retry"},
        }
        for t in range(TASKS)
    ]  # fmt: skip
    status = {
        "pid": pid, "hostname": f"orders-{index:02d}", "target": "shop.tasks", "transport": "nsq",
        "uptime_s": 3600.0, "memory_bytes": 60 * 2**20, "restarts": 0, "stopping": False,
        "workers": [{"worker": 1, "pid": pid + 1, "ready": True, "uptime_s": 3599.0,
                     "memory_bytes": 80 * 2**20, "in_flight": HELD}],
        "tasks": tasks,
    }  # fmt: skip
    held = [
        {"task": tasks[i]["task"], "id": f"{i:016x}", "attempts": 1, "age_s": 10.0 - i,
         "state": "running", "handler": f"task Task-{i}", "pid": pid + 1, "worker": 1}
        for i in range(HELD)
    ]  # fmt: skip
    return status, {"inflight": held}


def _const(doc: dict[str, Any]) -> Any:
    return lambda: doc


async def render() -> dict[str, float]:
    """One fleet of :data:`SUPERVISORS` health servers: read time and page times."""
    servers = []
    for i in range(SUPERVISORS):
        status, inflight = fleet_status(i)
        server = HealthServer(
            "127.0.0.1", 0, lambda: True, lambda: (True, {}), WorkerMetrics(),
            _const(inflight), _const(status),
        )  # fmt: skip
        server.start()
        servers.append(server)
    urls = [f"http://127.0.0.1:{s.port}" for s in servers]
    fleet = Fleet(StaticWorkers(urls), None, 3600.0)  # pages render from the last read
    app = create_app(Settings(console_workers=urls), fleet)
    try:
        reads = []
        for _ in range(5):
            started = time.perf_counter()
            view = await fleet.refresh()
            reads.append(time.perf_counter() - started)
        assert len(view.tasks) == TASKS and view.processes == SUPERVISORS, "fleet not read whole"
        times: dict[str, list[float]] = {"/": [], "/workers": []}
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as web:
            for _ in range(PAGES):
                for path, spent in times.items():
                    started = time.perf_counter()
                    page = await web.get(path)
                    spent.append(time.perf_counter() - started)
                    page.raise_for_status()
    finally:
        await fleet.close()
        for server in servers:
            server.stop()
    return {
        "read_s": statistics.median(reads),
        "tasks_median_s": statistics.median(times["/"]),
        "tasks_worst_s": max(times["/"]),
        "workers_median_s": statistics.median(times["/workers"]),
        "workers_worst_s": max(times["/workers"]),
    }


def throughput(broker: Broker, cfg: Config, series: Series, with_console: bool) -> None:
    """One ``nsqworker run`` drain, with or without a console polling it every second."""
    port = free_port()
    console = None
    if with_console:
        env = child_env()
        env.update(NSQWORKER_CONSOLE_POLL_INTERVAL="1", NSQWORKER_LOG_LEVEL="warning")
        listen = free_port()
        console = spawn(
            [sys.executable, "-m", "nsqworker", "console", "--worker", f"http://127.0.0.1:{port}",
             "--nsqd", broker.tcp_address, "--port", str(listen)],
            env=env,
        )  # fmt: skip
        _wait_up(listen)  # its start-up is not what is measured: its polling is
    try:
        with mock.patch.object(outofbox, "_free_port", lambda: port):
            outofbox.measure(broker, cfg, series, 1, None)
        if console is not None and console.popen.poll() is not None:
            raise BenchError("the console exited during the run")
    finally:
        if console is not None:
            reap(console)


def _wait_up(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/livez", timeout=2, trust_env=False).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise BenchError(f"the console did not answer on port {port} within {timeout:g} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=None, help="messages per drain")
    parser.add_argument("--quick", action="store_true", help="1 run of 20,000 messages")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    runs = 1 if args.quick else args.runs
    if args.count:
        cfg = Config(**{**vars(cfg), "consume_count": args.count})
    figures: dict[str, Any] = asyncio.run(render())
    broker = Broker()
    plain = Series("console/without", "console", "nsqworker run, no console", "msgs/s")
    polled = Series("console/with", "console", "nsqworker run, console polling 1/s", "msgs/s")
    try:
        for i in range(runs):  # alternate which goes first
            order = [(plain, False), (polled, True)][:: 1 if i % 2 == 0 else -1]
            for series, with_console in order:
                throughput(broker, cfg, series, with_console)
    finally:
        broker.close()
        cleanup()
    figures |= {
        "without_msgs_s": [round(v) for v in plain.values], "with_msgs_s": [round(v) for v in polled.values],
        "errors": plain.errors + polled.errors, "count": cfg.consume_count,
    }  # fmt: skip
    if plain.values and polled.values:
        figures["ratio"] = statistics.median(polled.values) / statistics.median(plain.values)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"console over {SUPERVISORS} supervisors x 1 worker process, {TASKS} tasks each:")
    print(f"  one read of the fleet        {figures['read_s'] * 1000:8.1f} ms")
    for page in ("tasks", "workers"):
        median, worst = figures[f"{page}_median_s"], figures[f"{page}_worst_s"]
        print(f"  {page + ' page':<13} median {median * 1000:8.1f} ms, worst {worst * 1000:.1f} ms"
              f" (goal < {RENDER_GOAL_S:g} s)")  # fmt: skip
    print(f"nsqworker run --workers 1 draining {cfg.consume_count} messages, msgs/s per run:")
    print(f"  without a console  {figures['without_msgs_s']}")
    print(f"  console polling/s  {figures['with_msgs_s']}")
    if "ratio" in figures:
        print(f"  with / without (medians): {figures['ratio']:.3f}")
    for error in figures["errors"]:
        print(f"  error: {error}")
    return 1 if figures["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
