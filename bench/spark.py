"""Spark runner overhead: ``python -m bench.spark``.

Through a real nsqd and an in-process Worker with the local runner:

1. **overhead**: for jobs that do nothing (a Python script that exits at once, still a
   real spark-submit and JVM), the time from the message's arrival at the consumer
   to spark-submit's process existing, and from the worker seeing the process exit
   to the FIN being written. Goal: each under 50 ms.
2. **concurrency**: 4 real Spark jobs at once (``max_in_flight=4``, ``local[1]`` each,
   their output streamed into the worker's log) while a probe measures how late the
   event loop wakes from 5 ms sleeps. Goal: at most 10 ms of loop lag.

3. **session**: the same job in session mode (``@spark_session_task``, one long-lived
   SparkSession: a local driver, then a local Spark Connect server), beside spark-submit
   (bench/spark_session.py: arrival to FIN, jobs/min with ``max_in_flight=2``, loop lag,
   RSS). ``--no-session`` leaves it out.

Figures are printed as one JSON object (and a line each). The machine's load matters:
4 JVMs on 2 cores starve every process, the worker's loop included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nsqworker.logging import configure_logging
from nsqworker.message import Finish, Message
from nsqworker.settings import Settings
from nsqworker.spark import SparkJob, runner_for, spark_task
from nsqworker.spark.local import LocalJob, LocalRunner
from nsqworker.task import Registry
from nsqworker.testing import NsqdProcess
from nsqworker.worker import Worker, event_loop_factory

TOPIC, CHANNEL = "bench_spark", "spark"
NOOP_APP = "import sys\nsys.exit(0)\n"
SPARK_APP = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
print("rows", spark.range(200000).selectExpr("id % 7 as k").groupBy("k").count().count())
spark.stop()
"""


class FinTimes:
    """Arrival and FIN times by message id, from an ``after`` hook of the registry: it
    runs on the loop once a message's outcome is decided, just before it is settled."""

    def __init__(self, registry: Registry) -> None:
        self.arrived: dict[str, float] = {}
        self.fin: dict[str, float] = {}
        registry.after(self.finished)

    def finished(self, msg: Message, outcome: Any, error: Any, duration: float) -> None:
        if isinstance(outcome, Finish):
            self.fin[msg.id] = time.monotonic()
            self.arrived[msg.id] = msg.received_at


class Probe(FinTimes):
    """Timestamps of arrivals, spawns, exits and FINs by message id."""

    def __init__(self, runner: LocalRunner, registry: Registry) -> None:
        super().__init__(registry)
        self.spawned: dict[str, float] = {}
        self.exited: dict[str, float] = {}
        self._install(runner)

    def _install(self, runner: LocalRunner) -> None:
        submit, wait = runner.submit, runner.wait
        probe = self

        async def timed_submit(job: SparkJob, ctx: Any) -> LocalJob:
            handle = await submit(job, ctx)
            probe.spawned[ctx.message_id] = handle.spawned_at
            handle.message_id = ctx.message_id  # type: ignore[attr-defined]
            return handle

        async def timed_wait(handle: LocalJob) -> Any:
            result = await wait(handle)
            probe.exited[handle.message_id] = handle.exited_at  # type: ignore[attr-defined]
            return result

        runner.submit = timed_submit  # type: ignore[method-assign]
        runner.wait = timed_wait  # type: ignore[method-assign]

    def overheads(self) -> tuple[list[float], list[float]]:
        ids = [i for i in self.fin if i in self.spawned and i in self.exited]
        to_spawn = [(self.spawned[i] - self.arrived[i]) * 1e3 for i in ids]
        to_fin = [(self.fin[i] - self.exited[i]) * 1e3 for i in ids]
        return to_spawn, to_fin


def thread_probe(samples: list[float], stop: threading.Event, period: float = 0.005) -> None:
    """The same 5 ms sleeps in a plain thread: how late the OS alone wakes a thread."""
    while not stop.is_set():
        before = time.monotonic()
        time.sleep(period)
        samples.append((time.monotonic() - before - period) * 1e3)


async def lag_probe(samples: list[float], stop: asyncio.Event, period: float = 0.005) -> None:
    while not stop.is_set():  # time.monotonic: uvloop's loop.time() has 1 ms steps
        before = time.monotonic()
        await asyncio.sleep(period)
        samples.append((time.monotonic() - before - period) * 1e3)


def settings_for(nsqd: NsqdProcess, max_in_flight: int, app_root: Path) -> Settings:
    return Settings(
        nsqd_tcp_addresses=[nsqd.tcp_address], spark_master="local[1]", health_port=0,
        max_in_flight=max_in_flight, backoff_multiplier=0.0, spark_app_roots=[str(app_root)],
    )  # fmt: skip


async def run_jobs(nsqd: NsqdProcess, app: Path, count: int, concurrent: int) -> dict[str, Any]:
    registry = Registry()

    @spark_task(TOPIC, channel=CHANNEL, registry=registry, max_in_flight=concurrent)
    def job(msg: Message) -> SparkJob:
        return SparkJob(str(app), conf={"spark.ui.enabled": False})

    settings = settings_for(nsqd, concurrent, app.parent)  # the apps are in a temp dir
    runner = runner_for(settings)
    assert isinstance(runner, LocalRunner)
    probe = Probe(runner, registry)
    lags: list[float] = []
    thread_lags: list[float] = []
    stop = asyncio.Event()
    thread_stop = threading.Event()
    control = threading.Thread(target=thread_probe, args=(thread_lags, thread_stop), daemon=True)
    started = time.monotonic()
    async with Worker(registry, settings):
        lagging = asyncio.ensure_future(lag_probe(lags, stop))
        control.start()
        for n in range(count):
            nsqd.publish(TOPIC, json.dumps({"n": n}))
        while len(probe.fin) < count:
            if time.monotonic() - started > 600:
                raise SystemExit("bench.spark: jobs did not finish in 10 minutes")
            await asyncio.sleep(0.05)
        stop.set()
        thread_stop.set()
        await lagging
        control.join()
    to_spawn, to_fin = probe.overheads()
    lags.sort()
    wall = time.monotonic() - started
    return {
        "jobs": count,
        "wall_s": round(wall, 1),
        "jobs_per_min": round(count / wall * 60, 1),
        "arrival_to_fin_ms": summary([(probe.fin[i] - probe.arrived[i]) * 1e3 for i in probe.fin]),
        "arrival_to_submit_ms": summary(to_spawn),
        "exit_to_fin_ms": summary(to_fin),
        "loop_lag_ms": summary(lags),
        "thread_sleep_lag_ms": summary(thread_lags),
    }


def side_by_side(submit: dict[str, Any], session: dict[str, Any]) -> str:
    """spark-submit and session mode, one row each: arrival to FIN, jobs/min, loop lag."""
    rows = [("spark-submit (4 at once)", submit["arrival_to_fin_ms"], submit["jobs_per_min"],
             submit["loop_lag_ms"])]  # fmt: skip
    for name, figures in session.items():
        if isinstance(figures, dict):
            burst = figures["burst"]
            rows.append((f"session {name} (2 at once)", figures["arrival_to_fin_ms"],
                         burst["jobs_per_min"], burst["loop_lag_ms"]))  # fmt: skip
    lines = [f"{'mode':28} {'arrival->FIN p50 ms':>20} {'jobs/min':>9} {'loop lag p99 ms':>16}"]
    for name, fin, rate, lag in rows:
        lines.append(f"{name:28} {fin.get('median', 0):>20} {rate:>9} {lag.get('p99', 0):>16}")
    return "\n".join(lines)


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "median": round(statistics.median(ordered), 2),
        "p99": round(p99, 2),
        "max": round(ordered[-1], 2),
    }


async def main_async(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    noop, spark = work / "noop.py", work / "spark_job.py"
    noop.write_text(NOOP_APP)
    spark.write_text(SPARK_APP)
    results: dict[str, Any] = {}
    with NsqdProcess(data_path=work / "nsqd") as nsqd:
        results["overhead"] = await run_jobs(nsqd, noop, args.jobs, 1)
    with NsqdProcess(data_path=work / "nsqd2") as nsqd:
        results["concurrent"] = await run_jobs(nsqd, spark, 4, 4)
    return results


def main(argv: list[str] | None = None) -> int:
    from bench import spark_session  # it imports this module's probes

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="no-op jobs for the overhead")
    parser.add_argument("--no-session", action="store_true", help="spark-submit figures only")
    spark_session.add_arguments(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        work = Path(tmp)
        log_file = (work / "worker.log").open("w")
        configure_logging("info", "json", stream=log_file)  # Spark's lines, as in production
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:  # uvloop, as workers
            results = runner.run(main_async(args, work))
        lines = sum(1 for _ in (work / "worker.log").open())
        if not args.no_session:
            results["session"] = spark_session.run(args, work)
    results["concurrent"]["log_lines"] = lines
    over, conc = results["overhead"], results["concurrent"]
    print(f"arrival -> spark-submit started: {over['arrival_to_submit_ms']} ms (goal < 50)")
    print(f"job exit -> FIN:                 {over['exit_to_fin_ms']} ms (goal < 50)")
    print(f"4 concurrent jobs, loop lag:      {conc['loop_lag_ms']} ms (goal <= 10)")
    print(f"  same sleeps in a plain thread:  {conc['thread_sleep_lag_ms']} ms (the machine)")
    if "session" in results:
        spark_session.report(results["session"])
        print(side_by_side(conc, results["session"]))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
