"""RabbitMQ Streams: ``nsqworker run --transport rabbitmq-stream`` and nsqworker's
``StreamProducer`` beside the official Java client (``com.rabbitmq:stream-client``, the
limit), and bare rstream.

    python -m bench.streams [--count 100000] [--runs 3] [--seconds 2]

One RabbitMQ 4.0 (the root filesystem of ``scripts/install-tools rabbitmq``, started
here). Consume: each run publishes ``count`` messages of 100 bytes to a fresh stream,
then each contender, in its own process started for it, reads that same stream from its
first offset (the same chunks for all); its handler counts, and the process notes the
time of the first and the last message itself:

* ``nsqworker run --transport rabbitmq-stream --rabbitmq URI``, default settings (the
  whole task layer: window, offset watermark stored every 0.2 s, spans off as by
  default), a channel of its own per run;
* the Java client's consumer with its defaults and a handler that takes the body and
  counts (``bench/java/StreamConsume.java``): the limit;
* a bare rstream consumer with rstream's ``amqp_decoder`` and a counting callback.

Publish: 100-byte bodies for ``seconds`` to a fresh stream, confirmed, in three shapes
(one at a time; 1,000 at once; batches of 100 one at a time), by ``StreamProducer``
(``publish``, ``asyncio.gather`` of 1,000 ``publish``, ``publish_many``) and by the Java
client's producer (its defaults; at most 1 or 1,000 unconfirmed; 100 sent, then every
confirmation awaited: ``bench/java/StreamPublish.java``).

Goal: nsqworker >= 80% of the Java consumer in msgs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
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
JAVA_LIB = ROOT / ".tools" / "java" / "lib"
JAVA_DIR = Path(__file__).with_name("java")
NAMES = {
    "nsqworker": "nsqworker run --transport rabbitmq-stream, default settings",
    "java": "Java stream-client 1.11.0 consumer, its defaults (the limit)",
    "rstream": "bare rstream consumer, amqp_decoder",
}
SHAPES = {
    "one": ("one at a time", 1, 0),
    "concurrent": ("1,000 at once", 1000, 0),
    "batch": ("batches of 100, one at a time", 0, 100),
}
"""Publish shapes: (title, most unconfirmed, batch size)."""

NSQWORKER_TASKS = """
import os, time
from nsqworker import task

COUNT = int(os.environ["BENCH_COUNT"])
_seen = [0]

@task(os.environ["BENCH_STREAM"], channel=os.environ["BENCH_CHANNEL"])
async def count(msg):
    _seen[0] += 1
    if _seen[0] == 1:
        open(os.environ["BENCH_FIRST"], "w").write(repr(time.time()))
    if _seen[0] == COUNT:
        open(os.environ["BENCH_LAST"], "w").write(repr(time.time()))
"""

RSTREAM_READER = """
import asyncio, os, time
from rstream import Consumer, ConsumerOffsetSpecification, OffsetType, amqp_decoder

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

    await consumer.subscribe(os.environ["BENCH_STREAM"], on_message, decoder=amqp_decoder,
                             offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
    await done.wait()
    await consumer.close()

asyncio.run(main())
"""

PUBLISHER = """
import asyncio, os, sys, time
from nsqworker.settings import Settings
from nsqworker.streams import StreamProducer

BODY = b"x" * 100

async def main(uri, stream, seconds, window, batch):
    settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri)
    async with StreamProducer(settings=settings, timeout=60) as producer:
        await producer.publish_many(stream, [BODY] * 1000)  # warm-up: connect, create
        count, started = 0, time.perf_counter()
        until = started + seconds
        while time.perf_counter() < until:
            if batch:
                await producer.publish_many(stream, [BODY] * batch)
                count += batch
            elif window == 1:
                await producer.publish(stream, BODY)
                count += 1
            else:
                await asyncio.gather(*(producer.publish(stream, BODY) for _ in range(window)))
                count += window
        print(count, time.perf_counter() - started)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]),
                 int(sys.argv[5])))
"""


def java_command(source: str, *args: Any) -> list[str]:
    """``java -cp .tools/java/lib/* bench/java/<source> args...``.

    Raises:
        RuntimeError: no Java, or no stream-client jars (``scripts/install-java``).
    """
    java = shutil.which("java")
    if java is None or not (JAVA_LIB / "stream-client-1.11.0.jar").exists():
        raise RuntimeError(
            "the Java limit needs java 17+ and .tools/java/lib (scripts/install-java)"
        )
    return [java, "-cp", f"{JAVA_LIB}/*", str(JAVA_DIR / source), *map(str, args)]


async def _publish(uri: str, stream: str, count: int) -> None:
    from nsqworker.settings import Settings
    from nsqworker.streams import StreamProducer

    settings = Settings(transport="rabbitmq-stream", rabbitmq_stream_uri=uri)
    async with StreamProducer(settings=settings, timeout=60) as producer:
        for start in range(0, count, 5000):
            await producer.publish_many(stream, [BODY] * min(5000, count - start))


def fill(server: Any, count: int, run: int) -> str:
    """A fresh stream holding ``count`` messages of 100 bytes."""
    stream = f"bench_streams_{run}_{os.getpid()}_{time.monotonic_ns()}"
    asyncio.run(_publish(server.uri, stream, count))
    return stream


def drain(kind: str, server: Any, stream: str, count: int, run: int) -> float:
    """Msgs/s of one contender reading ``stream`` (``count`` messages) from its start."""
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        env = child_env() | {
            "BENCH_STREAM": stream, "BENCH_COUNT": str(count), "BENCH_CHANNEL": f"bench{run}",
            "BENCH_FIRST": str(tmp / "first"), "BENCH_LAST": str(tmp / "last"),
            "BENCH_HOST": "127.0.0.1", "BENCH_PORT": str(server.stream_port),
            "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}",
            "NSQWORKER_HEALTH_PORT": "0", "NSQWORKER_LOG_LEVEL": "warning",
        }  # fmt: skip
        if kind == "java":
            argv = java_command("StreamConsume.java", "127.0.0.1", server.stream_port, stream,
                                count, 120)  # fmt: skip
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
            if out.returncode != 0:
                raise RuntimeError(f"java: {out.stderr[-2000:]}")
            return count / max(float(out.stdout.split()[-1]), 1e-6)
        if kind == "nsqworker":
            (tmp / "bench_stream_tasks.py").write_text(NSQWORKER_TASKS)
            argv = [sys.executable, "-m", "nsqworker", "run", "bench_stream_tasks",
                    "--transport", "rabbitmq-stream", "--rabbitmq", server.uri]  # fmt: skip
        else:
            (tmp / "reader.py").write_text(RSTREAM_READER)
            argv = [sys.executable, str(tmp / "reader.py")]
        # cwd: not this checkout, whose nsqworker `python -m` would put first on the path
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, cwd=tmp,
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


def publish(kind: str, shape: str, server: Any, seconds: float) -> float:
    """Confirmed msgs/s of one publisher in one shape, to a fresh stream."""
    _, window, batch = SHAPES[shape]
    stream = f"bench_publish_{kind}_{shape}_{os.getpid()}_{time.monotonic_ns()}"
    if kind == "java":
        argv = java_command("StreamPublish.java", "127.0.0.1", server.stream_port, stream,
                            seconds, window, batch)  # fmt: skip
    else:
        argv = [sys.executable, "-c", PUBLISHER, server.uri, stream, str(seconds),
                str(window), str(batch)]  # fmt: skip
    env = child_env() | {"PYTHONPATH": str(ROOT)}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} publish: {out.stderr[-2000:]}")
    confirmed, elapsed = out.stdout.split()[-2:]
    return float(confirmed) / max(float(elapsed), 1e-6)


def run(broker: Any, cfg: Any, results: Any, say: Any) -> None:
    """The ``streams`` section of ``python -m bench``: its own RabbitMQ (the run's nsqd,
    ``broker``, is not used)."""
    from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

    rows = {k: results.row(f"streams/{k}", "streams", NAMES[k], "msgs/s") for k in NAMES}
    results.compare("streams/nsqworker", "", "streams/java")
    results.compare("streams/rstream", "", "streams/java")
    pubs = {}
    for shape, (title, _, _) in SHAPES.items():
        for kind, who in (("ours", "StreamProducer"), ("java", "Java stream-client producer")):
            key = f"streams/publish-{shape}-{kind}"
            pubs[key] = results.row(key, "streams", f"{who}: {title}", "msgs/s")
        results.compare(f"streams/publish-{shape}-ours", "", f"streams/publish-{shape}-java")
    with RabbitMQProcess(find_rootfs(ROOT)) as server:
        for i in range(cfg.runs):
            stream = fill(server, cfg.streams_count, i)
            for kind, series in rows.items():
                say(f"streams run {i + 1}/{cfg.runs}: {NAMES[kind]}")
                try:
                    series.add(drain(kind, server, stream, cfg.streams_count, i))
                except Exception as exc:  # one contender failing must not lose the other
                    series.errors.append(f"{type(exc).__name__}: {exc}")
            for key, series in pubs.items():
                _, shape, kind = key.split("-")
                say(f"streams run {i + 1}/{cfg.runs}: {series.label}")
                try:
                    series.add(publish(kind, shape, server, cfg.publish_seconds))
                except Exception as exc:
                    series.errors.append(f"{type(exc).__name__}: {exc}")


def main() -> None:
    """Run the consume comparison (and the publish one) and print a table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.0, help="publish too, this long")
    parser.add_argument("--only", default=",".join(NAMES), help="consumers to run")
    args = parser.parse_args()
    from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

    kinds = [k for k in NAMES if k in args.only.split(",")]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    with RabbitMQProcess(find_rootfs(ROOT)) as server:
        for i in range(args.runs):
            stream = fill(server, args.count, i)
            for kind in kinds:
                rates[kind].append(drain(kind, server, stream, args.count, i))
                print(f"run {i + 1}: {kind} {rates[kind][-1]:,.0f} msgs/s", file=sys.stderr)
            for shape in SHAPES if args.seconds else ():
                for kind in ("ours", "java"):
                    rate = publish(kind, shape, server, args.seconds)
                    rates.setdefault(f"publish {shape} {kind}", []).append(rate)
                    print(
                        f"run {i + 1}: publish {shape} {kind} {rate:,.0f} msgs/s", file=sys.stderr
                    )
    best = {k: statistics.median(v) for k, v in rates.items()}
    for kind, rate in best.items():
        print(f"{NAMES.get(kind, kind):<62}{rate:>12,.0f} msgs/s")
    if "nsqworker" in best and "java" in best:
        ratio = best["nsqworker"] / best["java"]
        print(f"nsqworker / Java stream-client: {ratio:.0%} (goal >= {GOAL:.0%})")


if __name__ == "__main__":
    main()
