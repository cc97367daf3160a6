"""NATS JetStream: ``nsqworker run --transport nats`` against natscli (the limit),
FastStream and bare nats-py.

    python -m bench.nats [--count 100000] [--runs 3] [--json]

One nats-server (from .tools/bin, started here). Each contender runs in its own process
and drains a backlog of ``count`` messages (100 bytes) pre-published to a stream of its
own; the handler is an async no-op, and the clock runs from the first message a handler
saw to the moment the server counts every message acknowledged (its consumer's ack
floor; looked at every 5 ms near the end, less often before, as each look costs the
server CPU). The contenders, interleaved within each run:

* ``nsqworker run --transport nats --nats URL`` with default settings, the task's
  ``max_in_flight=500`` (the window natscli buffers; the NSQ bench's task sets
  bench_reader's 2,500 the same way), and again with the task setting no window (the
  default, 100);
* FastStream's NATS JetStream pull subscriber (``PullSub(batch_size=500)``, a durable
  consumer, its default acking after the handler);
* a bare nats-py loop, no framework: ``pull_subscribe`` then ``fetch(500)`` and
  ``await msg.ack()`` per message;
* the limit: natscli v0.5.0's ``nats bench js consume`` (nats.go, explicit acks, 500
  buffered; its own clock, first to last message received; :mod:`bench.nats_limits`).

Beside the rates, nats-server's own CPU per message while ``nsqworker run`` and natscli
drain (from ``/proc/<pid>/stat``): the server shares the machine's cores with the
consumer, so what it spends per message bounds what any consumer can reach.

Then the publish shapes of our NatsProducer beside natscli's publishers
(:mod:`bench.nats_limits`), ``nats_publish_count`` messages each (``python -m bench``).

Then the latency of ``nsqworker run``: 1,000 msg/s for ``--latency-seconds``, each body
carrying its publish time; the handler records publish -> handler. Goals: nsqworker >= 2x
FastStream, >= 80% of the bare loop and >= 80% of natscli in msgs/s; p99 <= 5 ms at
1k msg/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import nats_limits
from bench.env import ROOT, child_env

POLL = 0.005
"""Seconds between looks at the consumer's ack floor near the end (the clock's
resolution)..."""
POLL_MAX = 0.05
"""...and at most this long while far from it."""
GOALS = {"vs_faststream": 2.0, "vs_bare": 0.8, "vs_natscli": 0.8, "p99_ms": 5.0}
BODY = b"x" * 100

NSQWORKER_TASKS = """
import os, time
from nsqworker import task

_first = []
_LATENCY = os.environ.get("BENCH_LATENCY")

@task(os.environ["BENCH_SUBJECT"], channel="bench", max_in_flight=500)
async def noop(msg):
    if not _first:
        _first.append(time.time())
        with open(os.environ["BENCH_FIRST"], "w") as out:
            out.write(repr(_first[0]))
    if _LATENCY:
        with open(_LATENCY, "a") as out:
            out.write(f"{time.time_ns() - int(msg.body)}\\n")
"""

FASTSTREAM_APP = """
import asyncio, os, time
from faststream.nats import NatsBroker, PullSub

broker = NatsBroker(os.environ["BENCH_URL"], logger=None)
_first = []

@broker.subscriber(
    os.environ["BENCH_SUBJECT"], stream=os.environ["BENCH_STREAM"], durable="fs",
    pull_sub=PullSub(batch_size=500),
)
async def noop(body: bytes) -> None:
    if not _first:
        _first.append(time.time())
        with open(os.environ["BENCH_FIRST"], "w") as out:
            out.write(repr(_first[0]))

async def main() -> None:
    async with broker:
        await broker.start()
        await asyncio.get_running_loop().run_in_executor(None, input)

asyncio.run(main())
"""

BARE_LOOP = """
import asyncio, os, time
import nats

async def main() -> None:
    nc = await nats.connect(os.environ["BENCH_URL"])
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        os.environ["BENCH_SUBJECT"], "bare", stream=os.environ["BENCH_STREAM"]
    )
    first = False
    while True:
        try:
            msgs = await sub.fetch(500, timeout=1)
        except nats.errors.TimeoutError:
            continue
        if not first:
            first = True
            with open(os.environ["BENCH_FIRST"], "w") as out:
                out.write(repr(time.time()))
        for msg in msgs:
            await msg.ack()

asyncio.run(main())
"""


async def _publish(url: str, subject: str, count: int) -> str:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    stream = subject.replace(".", "_")
    await js.add_stream(name=stream, subjects=[subject])
    for start in range(0, count, 1000):
        futures = [js.publish(subject, BODY) for _ in range(min(1000, count - start))]
        await asyncio.gather(*futures)
    await nc.close()
    return stream


async def _acked(url: str, stream: str, durable: str, count: int, timeout: float) -> float:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    began: tuple[float, int] | None = None  # the first look that saw acks: when, how many
    try:
        while time.monotonic() < deadline:
            try:
                info = await js.consumer_info(stream, durable)
            except Exception:
                await asyncio.sleep(POLL_MAX)
                continue
            acked = info.ack_floor.stream_seq
            if acked >= count:
                return time.time()
            now = time.monotonic()
            if began is None and acked:
                began = (now, acked)
            delay = POLL
            if began is not None and now > began[0] and acked > began[1]:
                # A third of the time left at the rate so far, within bounds: each look
                # costs the server CPU the contender is measured on.
                rate = (acked - began[1]) / (now - began[0])
                delay = min(max((count - acked) / rate / 3, POLL), POLL_MAX)
            await asyncio.sleep(delay)
    finally:
        await nc.close()
    raise RuntimeError(f"{durable}: not every message acknowledged within {timeout:g}s")


def _contender(
    kind: str, url: str, subject: str, stream: str, tmp: Path
) -> tuple[list[str], dict[str, str]]:
    env = child_env() | {
        "BENCH_URL": url,
        "BENCH_SUBJECT": subject,
        "BENCH_STREAM": stream,
        "BENCH_FIRST": str(tmp / f"first-{kind}"),
        "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}",
    }
    if kind.startswith("nsqworker"):
        tasks = NSQWORKER_TASKS
        if kind == "nsqworker-window100":
            tasks = tasks.replace(", max_in_flight=500", "")
        (tmp / "bench_nats_tasks.py").write_text(tasks)
        env |= {"NSQWORKER_HEALTH_PORT": "0", "NSQWORKER_LOG_LEVEL": "warning"}
        argv = [sys.executable, "-m", "nsqworker", "run", "bench_nats_tasks",
                "--transport", "nats", "--nats", url]  # fmt: skip
    else:
        source = FASTSTREAM_APP if kind == "faststream" else BARE_LOOP
        (tmp / f"bench_{kind}.py").write_text(source)
        argv = [sys.executable, str(tmp / f"bench_{kind}.py")]
    return argv, env


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(
    kind: str, url: str, count: int, run: int, server_pid: int | None = None
) -> tuple[float, float | None]:
    """Msgs/s of one contender draining a fresh backlog of ``count``, and with
    ``server_pid`` nats-server's CPU microseconds per message meanwhile (the contender's
    start and set-up included; the backlog's publishing not)."""
    subject = f"bench.{kind}.r{run}"
    stream = asyncio.run(_publish(url, subject, count))
    before = cpu_seconds(server_pid) if server_pid is not None else 0.0
    rate = _drain(kind, url, subject, stream, count)
    if server_pid is None:
        return rate, None
    return rate, (cpu_seconds(server_pid) - before) / count * 1e6


def _drain(kind: str, url: str, subject: str, stream: str, count: int) -> float:
    if kind == "natscli":
        return nats_limits.natscli_consume(url, stream, count)
    durable = (
        "bench" if kind.startswith("nsqworker") else {"faststream": "fs", "bare": "bare"}[kind]
    )
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        argv, env = _contender(kind, url, subject, stream, tmp)
        proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=(tmp / "stderr").open("wb"),
        )  # fmt: skip
        try:
            end = asyncio.run(_acked(url, stream, durable, count, timeout=120))
            first = float((tmp / f"first-{kind}").read_text())
        except Exception as exc:
            raise RuntimeError(f"{kind}: {exc}\n{(tmp / 'stderr').read_text()[-2000:]}") from exc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    return count / max(end - first, 1e-6)


def latency(url: str, seconds: float, rate: int = 1000) -> dict[str, float]:
    """p50/p99 ms from publish to handler for ``nsqworker run`` at ``rate`` msg/s."""
    subject = "bench.latency"
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        argv, env = _contender("nsqworker", url, subject, "", tmp)
        env["BENCH_LATENCY"] = str(tmp / "latency")
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            asyncio.run(_paced(url, subject, seconds, rate, tmp / "first-nsqworker"))
            time.sleep(1.0)
        finally:
            proc.terminate()
            proc.wait(15)
        samples = [int(x) / 1e6 for x in (tmp / "latency").read_text().split()]
    samples = samples[len(samples) // 10 :]  # the first tenth warms up
    q = statistics.quantiles(samples, n=100)
    return {"p50_ms": q[49], "p99_ms": q[98], "samples": float(len(samples))}


async def _paced(url: str, subject: str, seconds: float, rate: int, ready: Path) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="bench_latency", subjects=[subject])
    await js.publish(subject, str(time.time_ns()).encode())
    while not ready.exists():  # the worker is up and bound
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate)
        for _ in range(due - sent):
            await nc.publish(subject, str(time.time_ns()).encode())
        sent = due
        await asyncio.sleep(0.001)
    await nc.flush()
    await nc.close()


def run(broker: Any, cfg: Any, results: Any, say: Any) -> None:
    """The ``nats`` section of ``python -m bench``: its own nats-server (the run's nsqd,
    ``broker``, is not used)."""
    from nsqworker.testing.nats import NatsServerProcess

    rows = {kind: results.row(f"nats/{kind}", "nats", NAMES[kind], "msgs/s") for kind in NAMES}
    # What the server spends on each message is CPU the consumer cannot have on two cores
    served = {
        kind: results.row(
            f"nats/server-cpu-{kind}", "nats",
            f"nats-server CPU per message while {kind} drains", "us/msg",
            higher_is_better=False,
        )
        for kind in ("nsqworker", "natscli")
    }  # fmt: skip
    results.compare("nats/nsqworker", "", "nats/natscli")
    results.compare("nats/nsqworker-window100", "", "nats/natscli")
    results.compare("nats/faststream", "", "nats/natscli")
    results.compare("nats/bare", "", "nats/natscli")
    pubs = _publish_rows(results)
    label = "nsqworker run, publish -> handler {} at 1k msg/s"
    p50 = results.row("nats/p50", "nats", label.format("p50"), "ms", higher_is_better=False)
    p99 = results.row("nats/p99", "nats", label.format("p99"), "ms", higher_is_better=False)
    with NatsServerProcess() as server:
        for i in range(cfg.runs):
            for kind, series in rows.items():
                say(f"nats run {i + 1}/{cfg.runs}: {NAMES[kind]}")
                try:
                    rate, server_us = drain(kind, server.url, cfg.nats_count, i, server.pid)
                    series.add(rate)
                    if kind in served and server_us is not None:
                        served[kind].add(server_us)
                except Exception as exc:  # one contender failing must not lose the others
                    series.errors.append(f"{type(exc).__name__}: {exc}")
            for key, (series, measure) in pubs.items():
                say(f"nats run {i + 1}/{cfg.runs}: publish {key}")
                try:
                    series.add(measure(server.url, f"pub_{key}_r{i}", cfg.nats_publish_count))
                except Exception as exc:
                    series.errors.append(f"{type(exc).__name__}: {exc}")
        say("nats: latency at 1k msg/s")
        lat = latency(server.url, cfg.nats_latency_seconds)
        p50.add(lat["p50_ms"])
        p99.add(lat["p99_ms"])


def _publish_rows(results: Any) -> dict[str, tuple[Any, Any]]:
    """Our publish shapes and natscli's publishers, each a row and what measures it."""
    rows: dict[str, tuple[Any, Any]] = {}
    for kind, label in nats_limits.NATSCLI_PUBLISH.items():
        series = results.row(f"nats/pub-{kind}-natscli", "nats", label, "msgs/s")

        def limit(url: str, stream: str, count: int, kind: str = kind) -> float:
            return nats_limits.natscli_publish(url, kind, stream, count)

        rows[f"{kind}-natscli"] = (series, limit)
    for mode, (label, against) in nats_limits.PUBLISH_MODES.items():
        key = f"nats/pub-{mode}-ours"
        series = results.row(key, "nats", label, "msgs/s")
        results.compare(key, "", f"nats/pub-{against}-natscli")

        def ours(url: str, stream: str, count: int, mode: str = mode) -> float:
            return nats_limits.ours_publish(url, mode, f"{stream}.in", count)

        rows[f"{mode}-ours"] = (series, ours)
    return rows


NAMES = {
    "nsqworker": "nsqworker run --transport nats, default settings, @task max_in_flight=500",
    "nsqworker-window100": "nsqworker run --transport nats, default settings, @task window unset (100)",
    "natscli": "natscli `nats bench js consume` (explicit acks, batch 500)",
    "faststream": "FastStream NATS PullSub(batch_size=500)",
    "bare": "bare nats-py fetch(500) loop",
}


def main() -> None:
    """Run the comparison and print a table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from nsqworker.testing.nats import NatsServerProcess

    rates: dict[str, list[float]] = {kind: [] for kind in NAMES}
    with NatsServerProcess() as server:
        for run in range(args.runs):
            for kind in rates:
                rate, server_us = drain(kind, server.url, args.count, run, server.pid)
                rates[kind].append(rate)
                print(f"run {run + 1}: {kind} {rate:,.0f} msgs/s, nats-server CPU "
                      f"{server_us:.1f} us/msg", file=sys.stderr)  # fmt: skip
        lat = latency(server.url, args.latency_seconds)
    best = {k: statistics.median(v) for k, v in rates.items()}
    result: dict[str, Any] = {
        "msgs_per_s": best,
        "runs": rates,
        "vs_faststream": best["nsqworker"] / best["faststream"],
        "vs_bare": best["nsqworker"] / best["bare"],
        "vs_natscli": best["nsqworker"] / best["natscli"],
        "latency": lat,
        "goals": GOALS,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{'contender':<50}{'msgs/s (median of ' + str(args.runs) + ')':>24}")
    for kind, rate in best.items():
        print(f"{NAMES[kind]:<50}{rate:>24,.0f}")
    print(
        f"nsqworker / FastStream {result['vs_faststream']:.2f}x (goal >= 2); "
        f"nsqworker / bare {result['vs_bare']:.0%} (goal >= 80%); "
        f"nsqworker / natscli {result['vs_natscli']:.0%} (goal >= 80%); "
        f"publish -> handler at 1k msg/s: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms"
        " (goal <= 5)"
    )


if __name__ == "__main__":
    main()
