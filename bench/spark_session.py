"""Spark session mode (``@spark_session_task``): ``python -m bench.spark`` runs it after
the spark-submit figures, or alone: ``python -m bench.spark_session``.

Through a real nsqd and an in-process Worker, for each backend (a local driver in the
worker process, and a local Spark Connect server when its jar is installed), with the
same small job as bench/spark.py (``range(200000)`` grouped by ``id % 7``):

1. **latency**: after warm-up, one message at a time; arrival at the consumer to FIN,
   p50 and p99. Goal: p50 under 1 s.
2. **throughput**: ``--burst`` messages at once with ``max_in_flight=2``: jobs per minute
   sustained, and the event loop's lag (5 ms sleeps) meanwhile. Goals: >= 20 jobs/min,
   lag p99 <= 10 ms.
3. **memory**: the worker's RSS (Python) and, local, its driver JVM's (its children).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.spark import FinTimes, lag_probe, summary, thread_probe
from nsqworker.logging import configure_logging
from nsqworker.message import Message
from nsqworker.settings import Settings
from nsqworker.spark import holder_for, spark_session_task
from nsqworker.spark.connect_server import ConnectServer, connect_jar
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess
from nsqworker.worker import Worker, event_loop_factory

TOPIC, CHANNEL = "bench_spark_session", "session"
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
LOCAL_CONF = CONF | {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


def job(msg: Message, spark: Any) -> int:
    """The benchmark's job: the same work as bench/spark.py's SPARK_APP."""
    count: int = spark.range(200000).selectExpr("id % 7 as k").groupBy("k").count().count()
    return count


class FinProbe(FinTimes):
    """Arrival and FIN times by message id (an ``after`` hook of the registry)."""

    async def wait(self, count: int, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.fin) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench.spark_session: {count} FINs not seen in {timeout:g}s")
            await asyncio.sleep(0.005)


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


async def run_backend(
    nsqd: NsqdProcess, settings: Settings, warmup: int, latency: int, burst: int
) -> dict[str, Any]:
    registry = Registry()
    spark_session_task(TOPIC, channel=CHANNEL, registry=registry, max_in_flight=2)(job)
    holder = holder_for(settings)
    results: dict[str, Any] = {"backend": holder.backend}
    probe = FinProbe(registry)
    started = time.monotonic()
    async with Worker(registry, settings):
        sent = 0
        for _ in range(warmup):  # the session's start and the JVM's JIT
            nsqd.publish(TOPIC, b"{}")
            sent += 1
            await probe.wait(sent)
        results["session_start_and_warmup_s"] = round(time.monotonic() - started, 1)
        first = len(probe.fin)
        for _ in range(latency):
            nsqd.publish(TOPIC, b"{}")
            sent += 1
            await probe.wait(sent)
        ids = list(probe.fin)[first:]
        results["arrival_to_fin_ms"] = summary(
            [(probe.fin[i] - probe.arrived[i]) * 1e3 for i in ids]
        )
        lags: list[float] = []
        thread_lags: list[float] = []
        stop, thread_stop = asyncio.Event(), threading.Event()
        control = threading.Thread(target=thread_probe, args=(thread_lags, thread_stop))
        lagging = asyncio.ensure_future(lag_probe(lags, stop))
        control.start()
        begin = time.monotonic()
        for _ in range(burst):
            nsqd.publish(TOPIC, b"{}")
        sent += burst
        await probe.wait(sent)
        wall = time.monotonic() - begin
        stop.set()
        thread_stop.set()
        await lagging
        control.join()
        results["burst"] = {
            "jobs": burst,
            "max_in_flight": 2,
            "wall_s": round(wall, 1),
            "jobs_per_min": round(burst / wall * 60, 1),
            "loop_lag_ms": summary(lags),
            "thread_sleep_lag_ms": summary(thread_lags),
        }
        results["rss_mb"] = {"python": round(rss_mb(os.getpid()))}
        if holder.backend == "local":  # connect: the JVM is the server's, not ours
            jvm = sum(rss_mb(p) for p in descendants(os.getpid()))
            results["rss_mb"]["jvm"] = round(jvm)
    return results


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    sizes = (args.warmup, args.latency, args.burst)
    base = {"health_port": 0, "backoff_multiplier": 0.0, "msg_timeout": 120.0}
    with NsqdProcess(data_path=work / "nsqd-local") as nsqd:
        settings = Settings(
            nsqd_tcp_addresses=[nsqd.tcp_address], spark_master="local[2]",
            spark_session_conf=LOCAL_CONF, **base,
        )  # fmt: skip
        results["local"] = await run_backend(nsqd, settings, *sizes)
    if connect_jar() is None:
        results["connect"] = (
            "skipped: no Spark Connect jar in pyspark's jars/ (pyspark 4.1 ships it)"
        )
        return results
    server = await asyncio.to_thread(ConnectServer.start, work / "connect-server.log")
    try:
        with NsqdProcess(data_path=work / "nsqd-connect") as nsqd:
            settings = Settings(
                nsqd_tcp_addresses=[nsqd.tcp_address], spark_remote=server.remote,
                spark_session_conf=CONF, **base,
            )  # fmt: skip
            results["connect"] = await run_backend(nsqd, settings, *sizes)
    finally:
        await asyncio.to_thread(server.stop)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--warmup", type=int, default=5, help="session jobs before measuring")
    parser.add_argument("--latency", type=int, default=20, help="session jobs one at a time")
    parser.add_argument("--burst", type=int, default=40, help="session jobs at once")


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The session figures (logging already configured by the caller)."""
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(main_async(args, work))


def report(results: dict[str, Any]) -> None:
    for name, figures in results.items():
        if not isinstance(figures, dict):
            print(f"session {name}: {figures}")
            continue
        burst = figures["burst"]
        print(f"session {name}: arrival -> FIN {figures['arrival_to_fin_ms']} ms (goal p50 < 1000)")
        print(f"session {name}: {burst['jobs_per_min']} jobs/min with max_in_flight=2 (goal >= 20)")
        print(f"session {name}: loop lag {burst['loop_lag_ms']} ms (goal p99 <= 10)")
        if "rss_mb" in figures:
            print(f"session {name}: RSS {figures['rss_mb']} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spark-session-") as tmp:
        work = Path(tmp)
        configure_logging("info", "json", stream=(work / "worker.log").open("w"))
        results = run(args, work)
    report(results)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
