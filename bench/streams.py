"""RabbitMQ Streams: ``nsqworker run --transport rabbitmq-stream`` against bare rstream.

    python -m bench.streams [--count 50000] [--runs 3]

One RabbitMQ 4.0 (the root filesystem of ``scripts/install-tools rabbitmq``, started
here). Each contender runs in its own process and reads a stream of its own holding
``count`` messages of 100 bytes, published before it starts; its handler counts, and the
clock runs from the first message to the last, both noted by the process itself:

* ``nsqworker run --transport rabbitmq-stream --rabbitmq URI``, default settings (the
  whole task layer: window, offset watermark stored every 0.2 s, spans off as by default);
* a bare rstream consumer (no framework): ``subscribe`` with rstream's ``amqp_decoder``
  (its default decoder hands over the raw AMQP bytes, not the body) and a callback that
  counts.

nsqworker reads a message that is one AMQP data section without the general decoder
(:mod:`nsqworker.streams.amqp`), which is why it can be faster than the bare loop.

Goal: nsqworker >= 80% of bare rstream in msgs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.env import ROOT, child_env

GOAL = 0.8
BODY = b"x" * 100
NAMES = {
    "nsqworker": "nsqworker run --transport rabbitmq-stream, default settings",
    "rstream": "bare rstream consumer, amqp_decoder",
}

NSQWORKER_TASKS = """
import os, time
from nsqworker import task

COUNT = int(os.environ["BENCH_COUNT"])
_seen = [0]

@task(os.environ["BENCH_STREAM"], channel="bench")
async def count(msg):
    _seen[0] += 1
    if _seen[0] == 1:
        open(os.environ["BENCH_FIRST"], "w").write(repr(time.time()))
    if _seen[0] == COUNT:
        open(os.environ["BENCH_LAST"], "w").write(repr(time.time()))
"""

RSTREAM_READER = """
import asyncio, os, time
from rstream import Consumer, amqp_decoder

COUNT = int(os.environ["BENCH_COUNT"])
seen = [0]

async def main():
    consumer = Consumer(os.environ["BENCH_HOST"], int(os.environ["BENCH_PORT"]),
                        username="guest", password="guest")
    await consumer.start()
    done = asyncio.Event()

    async def on_message(msg, ctx):
        seen[0] += 1
        if seen[0] == 1:
            open(os.environ["BENCH_FIRST"], "w").write(repr(time.time()))
        if seen[0] == COUNT:
            open(os.environ["BENCH_LAST"], "w").write(repr(time.time()))
            done.set()

    await consumer.subscribe(os.environ["BENCH_STREAM"], on_message, decoder=amqp_decoder)
    await done.wait()
    await consumer.close()

asyncio.run(main())
"""


async def _publish(uri: str, stream: str, count: int) -> None:
    from nsqworker.settings import Settings
    from nsqworker.streams import StreamProducer

    settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri)
    async with StreamProducer(settings=settings, timeout=60) as producer:
        for start in range(0, count, 5000):
            await producer.publish_many(stream, [BODY] * min(5000, count - start))


def drain(kind: str, server: Any, count: int, run: int) -> float:
    """Msgs/s of one contender reading a fresh stream of ``count`` messages."""
    stream = f"bench_{kind}_{run}_{os.getpid()}"
    asyncio.run(_publish(server.uri, stream, count))
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        env = child_env() | {
            "BENCH_STREAM": stream, "BENCH_COUNT": str(count),
            "BENCH_FIRST": str(tmp / "first"), "BENCH_LAST": str(tmp / "last"),
            "BENCH_HOST": "127.0.0.1", "BENCH_PORT": str(server.stream_port),
            "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}",
            "NSQWORKER_HEALTH_PORT": "0", "NSQWORKER_LOG_LEVEL": "warning",
        }  # fmt: skip
        if kind == "nsqworker":
            (tmp / "bench_stream_tasks.py").write_text(NSQWORKER_TASKS)
            argv = [sys.executable, "-m", "nsqworker", "run", "bench_stream_tasks",
                    "--transport", "rabbitmq-stream", "--rabbitmq", server.uri]  # fmt: skip
        else:
            (tmp / "reader.py").write_text(RSTREAM_READER)
            argv = [sys.executable, str(tmp / "reader.py")]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=(tmp / "stderr").open("wb"))  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while not (tmp / "last").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: {(tmp / 'stderr').read_text()[-2000:]}")
                time.sleep(0.01)
            time.sleep(0.01)
            first = float((tmp / "first").read_text())
            last = float((tmp / "last").read_text())
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return count / max(last - first, 1e-6)


def run(broker: Any, cfg: Any, results: Any, say: Any) -> None:
    """The ``streams`` section of ``python -m bench``: its own RabbitMQ (the run's nsqd,
    ``broker``, is not used)."""
    from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

    rows = {k: results.row(f"streams/{k}", "streams", NAMES[k], "msgs/s") for k in NAMES}
    results.compare("streams/nsqworker", "", "streams/rstream")
    with RabbitMQProcess(find_rootfs(ROOT)) as server:
        for i in range(cfg.runs):
            for kind, series in rows.items():
                say(f"streams run {i + 1}/{cfg.runs}: {NAMES[kind]}")
                try:
                    series.add(drain(kind, server, cfg.streams_count, i))
                except Exception as exc:  # one contender failing must not lose the other
                    series.errors.append(f"{type(exc).__name__}: {exc}")


def main() -> None:
    """Run the comparison and print a table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

    rates: dict[str, list[float]] = {k: [] for k in NAMES}
    with RabbitMQProcess(find_rootfs(ROOT)) as server:
        for i in range(args.runs):
            for kind in NAMES:
                rates[kind].append(drain(kind, server, args.count, i))
                print(f"run {i + 1}: {kind} {rates[kind][-1]:,.0f} msgs/s", file=sys.stderr)
    best = {k: statistics.median(v) for k, v in rates.items()}
    for kind, rate in best.items():
        print(f"{NAMES[kind]:<62}{rate:>12,.0f} msgs/s")
    ratio = best["nsqworker"] / best["rstream"]
    print(f"nsqworker / bare rstream: {ratio:.0%} (goal >= {GOAL:.0%})")


if __name__ == "__main__":
    main()
