"""`make run-spark`: the pipeline end to end on this machine, then its results.

Starts nsqlookupd and nsqd (as `make run` does), generates three days of clicks,
runs ``nsqworker run examples.spark_pipeline.tasks`` with the local Spark runner,
publishes one ``clicks_batches`` message a day, waits for the three ``reports_ready``
messages and prints them with the reports read back from Parquet. Then the same
three days again with the session form (``examples.spark_pipeline.session_tasks``:
one long-lived SparkSession in the worker), then once more one day at a time in that
warm session; checks that it wrote the same reports, and prints each day's job time
with spark-submit, in the new session and in the warm one side by side.
Last, the streaming job (``jobs/stream_clicks.py``): the same clicks published to a
NATS JetStream stream, read by a Structured Streaming query into a Parquet table and
sessionized per 30-minute window, exactly once; it prints the rows and their rate.
Everything lands in .run/spark_pipeline/ (worker.log and worker-session.log have the
workers' and Spark's output, stream.log the streaming job's).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from examples.spark_pipeline.generate import generate, write
from nsqworker.testing import NsqdProcess, NsqlookupdProcess, find_binary
from nsqworker.testing.nats import NatsServerProcess

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / ".run" / "spark_pipeline"
DAYS = [date(2026, 11, 21) + timedelta(days=n) for n in range(3)]
TIMEOUT = 600.0
#: The session's conf (session-wide, since every message's jobs share the session): no
#: UI, as tasks.py gives each spark-submit; a local[2] session already has a shuffle
#: partition per core (nsqworker's default), where spark-submit's jobs ask for 4.
SESSION_CONF = json.dumps({"spark.ui.enabled": "false"})


def say(text: str) -> None:
    print(f"run-spark: {text}", flush=True)


def start_worker(
    lookupd: NsqlookupdProcess, log_path: Path, module: str, output: Path
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        NSQWORKER_LOOKUPD_HTTP_ADDRESSES=lookupd.http_address,
        NSQWORKER_LOOKUPD_POLL_INTERVAL="1",
        NSQWORKER_SPARK_MASTER="local[2]",
        NSQWORKER_SPARK_SESSION_CONF=SESSION_CONF,
        NSQWORKER_HEALTH_PORT="0",
        NSQWORKER_LOG_FORMAT="console",
        SPARK_PIPELINE_OUTPUT=str(output),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    argv = [str(Path(sys.executable).parent / "nsqworker"), "run", module]
    say(f"starting the worker ({module}); its log: {log_path.relative_to(ROOT)}")
    out = log_path.open("wb")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)


def read_reports(
    nsqd: NsqdProcess, count: int, worker: subprocess.Popen[bytes]
) -> list[dict[str, object]]:
    """The first ``count`` reports_ready messages (nsq_tail on a channel of its own);
    fails at once if the worker exits first."""
    tail = subprocess.Popen(
        [find_binary("nsq_tail"), f"--nsqd-tcp-address={nsqd.tcp_address}",
         "--topic=reports_ready", "--channel=run-spark", f"-n={count}"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + TIMEOUT
    try:
        while tail.poll() is None:
            if worker.poll() is not None:
                raise SystemExit(f"run-spark: the worker exited ({worker.returncode}); see its log")
            if time.monotonic() > deadline:
                raise SystemExit(f"run-spark: no {count} reports in {TIMEOUT:g}s")
            time.sleep(0.2)
    finally:
        if tail.poll() is None:
            tail.kill()
    assert tail.stdout is not None
    lines = tail.stdout.read().decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def show(report: dict[str, object]) -> None:
    day, output = str(report["day"]), Path(str(report["output"]))
    print(f"\n== {day}: job {report['job_id']} in {report['seconds']}s, rows {report.get('rows')}")
    daily = pq.read_table(output / "daily" / f"day={day}").to_pylist()[0]
    print(
        f"   {daily['sessions']} sessions of {daily['users']} users, {daily['clicks']} clicks; "
        f"{daily['avg_clicks']} clicks and {daily['avg_seconds']}s per session on average"
    )
    top = sorted(
        pq.read_table(output / "top_pages" / f"day={day}").to_pylist(), key=lambda r: r["rank"]
    )
    print("   top pages: " + ", ".join(f"{r['page']} ({r['views']})" for r in top[:5]))


def run_form(
    nsqd: NsqdProcess,
    lookupd: NsqlookupdProcess,
    inputs: dict[date, Path],
    form: str,
    again: bool = False,
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """One day a message through the worker of ``form`` (submit or session); its reports.
    With ``again``, then each day once more, one at a time, in the same worker (a warm
    session): those reports second."""
    module, log_name, output = FORMS[form]
    worker = start_worker(lookupd, RUN / log_name, module, RUN / output)
    started = time.monotonic()
    try:
        for day, path in inputs.items():
            nsqd.publish("clicks_batches", json.dumps({"day": str(day), "input": str(path)}))
        say(f"published {len(inputs)} clicks_batches messages; waiting for reports_ready")
        reports = sorted(read_reports(nsqd, len(inputs), worker), key=lambda r: str(r["day"]))
        say(f"{form}: {len(reports)} reports in {time.monotonic() - started:.1f}s")
        warm = []
        if again:
            for day, path in inputs.items():
                nsqd.publish("clicks_batches", json.dumps({"day": str(day), "input": str(path)}))
                warm += read_reports(nsqd, 1, worker)
            say(f"{form}: the same {len(inputs)} days again, one at a time, in the warm session")
        return reports, warm
    finally:
        stop_worker(worker)


#: form -> (task module, worker log, output directory under RUN)
FORMS = {
    "submit": ("examples.spark_pipeline.tasks", "worker.log", "reports"),
    "session": ("examples.spark_pipeline.session_tasks", "worker-session.log", "reports-session"),
}


def same_reports(day: str) -> bool:
    """Whether both forms wrote the same rows for ``day`` (every table, order aside)."""
    for table in ("sessions", "daily", "top_pages"):
        rows = [
            sorted(map(str, pq.read_table(RUN / out / table / f"day={day}").to_pylist()))
            for out in ("reports", "reports-session")
        ]
        if rows[0] != rows[1]:
            return False
    return True


def run_stream(inputs: dict[date, Path]) -> bool:
    """The clicks into a JetStream stream, then the streaming job over them, once."""
    clicks = [line.encode() for p in inputs.values() for line in p.read_text().splitlines()]
    with NatsServerProcess(binary=str(ROOT / ".tools" / "bin" / "nats-server")) as server:
        asyncio.run(_publish_clicks(server.url, clicks))
        say(f"streaming: {len(clicks)} clicks in the JetStream stream 'clicks' on {server.url}")
        env = dict(os.environ, NSQWORKER_NATS_SERVERS=server.url, SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # fmt: skip
        argv = [sys.executable, str(ROOT / "examples/spark_pipeline/jobs/stream_clicks.py"),
                "--format", "nats", "--stream", "clicks", "--output", str(RUN / "stream"),
                "--checkpoint", str(RUN / "stream-checkpoint"), "--available-now"]  # fmt: skip
        started = time.monotonic()
        with (RUN / "stream.log").open("wb") as log:
            done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log,
                                  timeout=TIMEOUT, check=False)  # fmt: skip
        elapsed = time.monotonic() - started
    for line in done.stdout.decode().splitlines():
        print("   " + line)
    if done.returncode != 0:
        say(f"the streaming job failed ({done.returncode}); see .run/spark_pipeline/stream.log")
        return False
    rows = pq.read_table(RUN / "stream" / "clicks").num_rows
    sessions = pq.read_table(RUN / "stream" / "sessions").num_rows
    say(f"streaming: {rows} clicks and {sessions} closed sessions in Parquet, "
        f"{elapsed:.1f}s with the driver's start")  # fmt: skip
    return rows == len(clicks)


async def _publish_clicks(url: str, clicks: list[bytes]) -> None:
    import nats

    client = await nats.connect(url)
    try:
        js = client.jetstream()
        await js.add_stream(name="clicks", subjects=["clicks"])
        for at in range(0, len(clicks), 500):
            acks = [await js.publish_async("clicks", c) for c in clicks[at : at + 500]]
            await asyncio.gather(*acks)
    finally:
        await client.close()


def main() -> int:
    shutil.rmtree(RUN, ignore_errors=True)
    RUN.mkdir(parents=True)
    inputs = {d: write(RUN / "input" / f"clicks-{d}.jsonl", generate(d)) for d in DAYS}
    say(
        f"generated {sum(len(p.read_text().splitlines()) for p in inputs.values())} clicks over {len(DAYS)} days"
    )
    lookupd = NsqlookupdProcess(data_path=RUN / "nsqlookupd")
    nsqd = NsqdProcess([lookupd], data_path=RUN / "nsqd")
    try:
        lookupd.start()
        nsqd.start()
        say(f"nsqd on {nsqd.tcp_address}, nsqlookupd on {lookupd.http_address}")
        nsqd.create_channel("reports_ready", "run-spark")
        nsqd.create_topic("clicks_batches")
        submitted, _ = run_form(nsqd, lookupd, inputs, "submit")
        for report in submitted:
            show(report)
        print()
        in_session, warm = run_form(nsqd, lookupd, inputs, "session", again=True)
        print("\n   day          spark-submit   session: first   warm   same reports")
        for a, b, c in zip(submitted, in_session, warm, strict=True):
            day = str(a["day"])
            print(f"   {day}   {a['seconds']:>10}s   {b['seconds']:>13}s   "
                  f"{c['seconds']:>4}s   {same_reports(day)}")  # fmt: skip
        print("   (spark-submit: a JVM and a driver each, two days at once; session, first:")
        print("    the three days at once in the worker's new session, its JIT still cold;")
        print("    warm: the same days again, one at a time, in that session)\n")
        streamed = run_stream(inputs)
        return 0 if streamed and all(same_reports(str(r["day"])) for r in submitted) else 1
    finally:
        nsqd.stop()
        lookupd.stop()


if __name__ == "__main__":
    sys.exit(main())
