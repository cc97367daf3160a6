"""The broker sources' throughput into Parquet: ``python -m bench.spark_streaming``.

For each source (RabbitMQ Streams, NATS JetStream, NSQ), in one run on this machine:

1. publish ``--warmup`` bodies of 100 bytes to a stream (topic) of their own and
   ``--messages`` to the measured one;
2. **decode only** (RabbitMQ Streams): the source's chunk decoding into Arrow batches,
   over chunks of 500 such messages built in memory, without a broker;
3. **bare client**: read the measured messages with the source's own reading code in
   one process (the stream's wire client, a JetStream pull consumer, the NSQ held
   consumer with FINs), rows per second;
4. **Spark**: one driver (``local[2]``, ``numPartitions=2``) first runs a query over
   the warm-up messages into Parquet (Spark's Python workers start, the JVM's JIT
   warms), then a query over the measured ones, run until it has read them all and
   checked by counting the Parquet it wrote; rows per second over the batches'
   processing time (Spark's ``triggerExecution``) and over the query's wall time from
   its start.

Goal: 150,000 rows/s from RabbitMQ Streams into Parquet on 2 cores. Needs root (RabbitMQ
runs in a chroot), nats-server and nsqd (``scripts/install-tools nsq nats rabbitmq spark``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nsqworker.settings import Settings
from nsqworker.testing import NsqdProcess
from nsqworker.testing.nats import NatsServerProcess
from nsqworker.testing.rabbitmq import RabbitMQProcess, find_rootfs

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("rabbitmq-stream", "nats", "nsq")
QUERY = """
import json, sys, time
from pyspark.sql import SparkSession
from nsqworker.spark.streaming import register
fmt, runs, output = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
register(spark)
results = []
for name, options, expected in runs:  # the warm-up first, then the measured run
    out = f"{output}/{name}"
    started = time.perf_counter()
    query = (spark.readStream.format(fmt).options(**options).load().writeStream
             .format("parquet").option("checkpointLocation", out + "/_checkpoint")
             .start(out + "/data"))
    rows = ms = batches = 0
    seen = set()
    deadline = time.monotonic() + 600
    while rows < expected and time.monotonic() < deadline:
        query.awaitTermination(0.05)
        for p in query.recentProgress:
            if p["batchId"] not in seen and p["numInputRows"]:
                seen.add(p["batchId"])
                rows += p["numInputRows"]
                ms += p["durationMs"]["triggerExecution"]
                batches += 1
    wall = time.perf_counter() - started
    query.stop()
    written = spark.read.parquet(out + "/data").count()
    results.append({"run": name, "rows": rows, "written": written, "batches": batches,
                    "batch_seconds": ms / 1000, "wall_seconds": wall})
print(json.dumps(results))
"""


def decode_rate(count: int) -> float:
    """Rows/s of the RabbitMQ source's decoding alone: chunks of 500 plain messages of
    the bench's bodies (as the publisher's batches make them) into Arrow batches,
    without a broker or a socket (the second of two passes)."""
    import struct
    import zlib

    from nsqworker.spark.streaming.chunks import HEADER_SIZE, decode_chunk
    from nsqworker.spark.streaming.columns import Rows

    header = struct.Struct(">BbHIqQQiIIB3x")
    payloads = []
    for first in range(0, count, 500):
        records = [
            b"\x00Su\xa0" + bytes((100,)) + body(i) for i in range(first, min(first + 500, count))
        ]
        data = b"".join(struct.pack(">I", len(r)) + r for r in records)
        crc = zlib.crc32(data)
        head = header.pack(0x50, 0, len(records), len(records), 0, 1, first,
                           crc - (1 << 32) if crc >= 1 << 31 else crc, len(data), 0, 0)  # fmt: skip
        assert len(head) == HEADER_SIZE
        payloads.append(b"\x02" + head + data)

    def decode() -> int:
        rows, total = Rows("bench"), 0
        for payload in payloads:
            chunk = decode_chunk(payload)
            bodies = chunk.plain_bodies()
            assert bodies is not None
            rows.add_bodies(bodies, chunk.first_offset, chunk.timestamp_ms * 1000)
            if len(rows) >= 65536:
                total += int(rows.batch().num_rows)
        return total + int(rows.batch().num_rows)

    decode()  # the first pass pays imports, Arrow's kernels' first use, page faults
    started = time.perf_counter()
    total = decode()
    assert total == count, total
    return count / (time.perf_counter() - started)


def body(i: int) -> bytes:
    return (b"%08d" % i) * 12 + b"-" * 4


async def publish_rabbitmq(uri: str, stream: str, count: int) -> None:
    from tests.spark.streaming_cases import publish_rabbitmq

    await publish_rabbitmq(uri, stream, [body(i) for i in range(count)], create=True)


async def publish_nats(url: str, stream: str, count: int) -> None:
    from tests.spark.streaming_cases import publish_nats

    await publish_nats(url, stream, [body(i) for i in range(count)], create=True)


def bare_rabbitmq(settings: Settings, stream: str, count: int) -> float:
    from nsqworker.spark.streaming.rabbitmq import StreamRange, read_range

    started = time.perf_counter()
    rows = sum(b.num_rows for b in read_range(settings, StreamRange(stream, 0, count)))
    assert rows == count, rows
    return count / (time.perf_counter() - started)


def bare_nats(settings: Settings, stream: str, count: int) -> float:
    from nsqworker.spark.streaming.jetstream import SequenceRange, read_sequences

    started = time.perf_counter()
    part = SequenceRange(stream, (f"{stream}.*",), 1, count + 1)
    rows = sum(b.num_rows for b in read_sequences(settings, part))
    assert rows == count, rows
    return count / (time.perf_counter() - started)


def bare_nsq(settings: Settings, nsqd: NsqdProcess, topic: str, count: int) -> float:
    from nsqworker.spark.streaming.nsq_held import HeldConsumer

    started = time.perf_counter()
    consumer = HeldConsumer(settings, [nsqd.tcp_address], topic, "bare", hold=2500)
    done = 0
    try:
        while done < count:
            done += consumer.finish(consumer.received)
            time.sleep(0.005)
    finally:
        consumer.close()
    return count / (time.perf_counter() - started)


def spark_rate(
    fmt: str, runs: list[tuple[str, dict[str, str], int]], env: dict[str, str], work: Path
) -> dict[str, float]:
    """One Spark driver runs each query of ``runs`` in turn (the warm-up first); the
    figures of the last: rows/s over its batches' time and over its wall time."""
    out = work / f"spark-{fmt}"
    environ = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, **env)  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", QUERY, fmt, json.dumps(runs), str(out)],
        env=environ, capture_output=True, timeout=1800, check=False, cwd=ROOT,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"bench.spark_streaming: the {fmt} query failed:\n"
                         + done.stderr.decode(errors="replace")[-3000:])  # fmt: skip
    results = json.loads(done.stdout.decode().strip().splitlines()[-1])
    for result, (_, _, expected) in zip(results, runs, strict=True):
        if result["written"] != expected:
            raise SystemExit(f"bench.spark_streaming: {fmt} wrote {result['written']} of "
                             f"{expected} rows ({result})")  # fmt: skip
    warm, last = results[0], results[-1]
    return {
        "spark": last["rows"] / last["batch_seconds"],
        "spark_wall": last["rows"] / last["wall_seconds"],
        "batches": last["batches"],
        "warmup_wall_s": round(warm["wall_seconds"], 1),
    }


def run(
    count: int, warmup: int, work: Path, sources: tuple[str, ...] = SOURCES
) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    if "rabbitmq-stream" in sources:
        results["rabbitmq-stream"] = {"decode": decode_rate(count)}
        results["rabbitmq-stream"] |= run_rabbitmq(count, warmup, work)
    if "nats" in sources:
        results["nats"] = run_nats(count, warmup, work)
    if "nsq" in sources:
        results["nsq"] = run_nsq(count, warmup, work)
    return results


def run_rabbitmq(count: int, warmup: int, work: Path) -> dict[str, float]:
    results: dict[str, dict[str, float]] = {"rabbitmq-stream": {}}
    rabbit = RabbitMQProcess(find_rootfs(ROOT)).start()
    try:
        settings = Settings(rabbitmq_stream_uri=rabbit.uri)
        asyncio.run(publish_rabbitmq(rabbit.uri, "warmup", warmup))
        asyncio.run(publish_rabbitmq(rabbit.uri, "bench", count))
        results["rabbitmq-stream"]["bare"] = bare_rabbitmq(settings, "bench", count)
        results["rabbitmq-stream"] |= spark_rate(
            "rabbitmq-stream",
            [("warmup", {"stream": "warmup"}, warmup), ("bench", {"stream": "bench"}, count)],
            {"NSQWORKER_RABBITMQ_STREAM_URI": rabbit.uri}, work,
        )  # fmt: skip
    finally:
        rabbit.close()
    return results["rabbitmq-stream"]


def run_nats(count: int, warmup: int, work: Path) -> dict[str, float]:
    results: dict[str, dict[str, float]] = {}
    with NatsServerProcess(binary=str(ROOT / ".tools" / "bin" / "nats-server")) as server:
        settings = Settings(nats_servers=[server.url])
        asyncio.run(publish_nats(server.url, "warmup", warmup))
        asyncio.run(publish_nats(server.url, "bench", count))
        results["nats"] = {"bare": bare_nats(settings, "bench", count)}
        results["nats"] |= spark_rate(
            "nats",
            [("warmup", {"stream": "warmup"}, warmup), ("bench", {"stream": "bench"}, count)],
            {"NSQWORKER_NATS_SERVERS": server.url}, work,
        )  # fmt: skip
    return results["nats"]


def run_nsq(count: int, warmup: int, work: Path) -> dict[str, float]:
    results: dict[str, dict[str, float]] = {}
    nsqd = NsqdProcess(data_path=work / "nsqd")
    nsqd.start()
    try:
        settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
        nsqd.create_channel("warmup", "spark")
        for channel in ("bare", "spark"):
            nsqd.create_channel("bench", channel)
        for topic, total in (("warmup", warmup), ("bench", count)):
            for at in range(0, total, 5000):
                nsqd.mpublish(topic, [body(i) for i in range(at, min(at + 5000, total))])
        results["nsq"] = {"bare": bare_nsq(settings, nsqd, "bench", count)}
        held = {"channel": "spark", "maxRecordsPerBatch": "2000"}
        results["nsq"] |= spark_rate(
            "nsq",
            [("warmup", {"topic": "warmup", **held}, warmup),
             ("bench", {"topic": "bench", **held}, count)],
            {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address}, work,
        )  # fmt: skip
    finally:
        nsqd.stop()
    return results["nsq"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--warmup", type=int, default=20_000,
                        help="messages of the warm-up query, run first in the same driver")  # fmt: skip
    parser.add_argument("--sources", default=",".join(SOURCES),
                        help="comma-separated: " + ", ".join(SOURCES))  # fmt: skip
    args = parser.parse_args(argv)
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    if unknown := set(sources) - set(SOURCES):
        parser.error(f"unknown sources: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="bench-spark-streaming-") as work:
        results = run(args.messages, args.warmup, Path(work), sources)
    print(f"\n{args.messages:,} messages of 100 bytes after a warm-up query of "
          f"{args.warmup:,}, rows/s (2 cores, local[2], numPartitions 2)")  # fmt: skip
    print("| source | decode only | bare client | Spark into Parquet (batches) | (wall) | goal |")
    print("|---|---|---|---|---|---|")
    for source, f in results.items():
        goal = ">= 150,000" if source == "rabbitmq-stream" else ""
        decode = f"{f['decode']:,.0f}" if "decode" in f else ""
        print(f"| {source} | {decode} | {f['bare']:,.0f} | {f['spark']:,.0f} "
              f"({f['batches']:.0f} batches) | {f['spark_wall']:,.0f} | {goal} |")  # fmt: skip
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
