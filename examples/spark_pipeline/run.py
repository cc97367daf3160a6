"""`make run-spark`: the pipeline end to end on this machine, then its results.

Starts nsqlookupd and nsqd (as `make run` does), generates three days of clicks,
runs ``nsqworker run examples.spark_pipeline.tasks`` with the local Spark runner,
publishes one ``clicks_batches`` message a day, waits for the three ``reports_ready``
messages and prints them with the reports read back from Parquet. Everything lands
in .run/spark_pipeline/ (worker.log has the worker's and Spark's output).
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / ".run" / "spark_pipeline"
DAYS = [date(2026, 11, 21) + timedelta(days=n) for n in range(3)]
TIMEOUT = 600.0


def say(text: str) -> None:
    print(f"run-spark: {text}", flush=True)


def start_worker(lookupd: NsqlookupdProcess, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(
        NSQWORKER_LOOKUPD_HTTP_ADDRESSES=lookupd.http_address,
        NSQWORKER_LOOKUPD_POLL_INTERVAL="1",
        NSQWORKER_SPARK_MASTER="local[2]",
        NSQWORKER_HEALTH_PORT="0",
        NSQWORKER_LOG_FORMAT="console",
        SPARK_PIPELINE_OUTPUT=str(RUN / "reports"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    argv = [str(Path(sys.executable).parent / "nsqworker"), "run", "examples.spark_pipeline.tasks"]
    say(f"starting the worker; its log: {log_path.relative_to(ROOT)}")
    out = log_path.open("wb")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)


def read_reports(nsqd: NsqdProcess, count: int) -> list[dict[str, object]]:
    """The first ``count`` reports_ready messages (nsq_tail on a channel of its own)."""
    tail = subprocess.run(
        [find_binary("nsq_tail"), f"--nsqd-tcp-address={nsqd.tcp_address}",
         "--topic=reports_ready", "--channel=run-spark", f"-n={count}"],
        capture_output=True, timeout=TIMEOUT, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in tail.stdout.decode().splitlines() if line.strip()]


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


def main() -> int:
    shutil.rmtree(RUN, ignore_errors=True)
    RUN.mkdir(parents=True)
    inputs = {d: write(RUN / "input" / f"clicks-{d}.jsonl", generate(d)) for d in DAYS}
    say(
        f"generated {sum(len(p.read_text().splitlines()) for p in inputs.values())} clicks over {len(DAYS)} days"
    )
    lookupd = NsqlookupdProcess(data_path=RUN / "nsqlookupd")
    nsqd = NsqdProcess([lookupd], data_path=RUN / "nsqd")
    worker = None
    started = time.monotonic()
    try:
        lookupd.start()
        nsqd.start()
        say(f"nsqd on {nsqd.tcp_address}, nsqlookupd on {lookupd.http_address}")
        nsqd.create_channel("reports_ready", "run-spark")
        nsqd.create_topic("clicks_batches")
        worker = start_worker(lookupd, RUN / "worker.log")
        for day, path in inputs.items():
            nsqd.publish("clicks_batches", json.dumps({"day": str(day), "input": str(path)}))
        say(f"published {len(inputs)} clicks_batches messages; waiting for reports_ready")
        reports = read_reports(nsqd, len(inputs))
        say(f"{len(reports)} reports in {time.monotonic() - started:.1f}s")
        for report in sorted(reports, key=lambda r: str(r["day"])):
            show(report)
        print()
        return 0
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        nsqd.stop()
        lookupd.stop()


if __name__ == "__main__":
    sys.exit(main())
