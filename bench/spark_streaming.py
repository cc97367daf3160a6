"""The broker sources' throughput into Parquet: ``python -m bench.spark_streaming``.

For each source (RabbitMQ Streams, NATS JetStream, NSQ), in one run on this machine:

1. publish ``--messages`` bodies of 100 bytes;
2. **bare client**: read them all with the source's own reading code in one process
   (the stream's wire client, a JetStream pull consumer, the NSQ held consumer with
   FINs), rows per second;
3. **Spark**: a Structured Streaming query (``local[2]``, ``numPartitions=2``) from the
   source into Parquet with a checkpoint, run until it has read them all; rows per
   second over the batches' processing time (Spark's ``triggerExecution``; the driver's
   start is left out).

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
QUERY = """
import json, sys, time
from pyspark.sql import SparkSession
from nsqworker.spark.streaming import register
fmt, options, output, expected = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
register(spark)
query = (spark.readStream.format(fmt).options(**options).load().writeStream.format("parquet")
         .option("checkpointLocation", output + "/_checkpoint").start(output + "/data"))
rows = ms = 0
seen = set()
while rows < expected:
    query.awaitTermination(0.5)
    for p in query.recentProgress:
        if p["batchId"] not in seen and p["numInputRows"]:
            seen.add(p["batchId"])
            rows += p["numInputRows"]
            ms += p["durationMs"]["triggerExecution"]
query.stop()
print(json.dumps({"rows": rows, "seconds": ms / 1000}))
"""


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
    fmt: str, options: dict[str, str], env: dict[str, str], count: int, work: Path
) -> float:
    out = work / f"spark-{fmt}"
    environ = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable, **env)  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", QUERY, fmt, json.dumps(options), str(out), str(count)],
        env=environ, capture_output=True, timeout=900, check=True, cwd=ROOT,
    )  # fmt: skip
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return float(result["rows"] / result["seconds"])


def run(count: int, work: Path) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    rabbit = RabbitMQProcess(find_rootfs(ROOT)).start()
    try:
        settings = Settings(rabbitmq_stream_uri=rabbit.uri)
        asyncio.run(publish_rabbitmq(rabbit.uri, "bench", count))
        results["rabbitmq-stream"] = {
            "bare": bare_rabbitmq(settings, "bench", count),
            "spark": spark_rate("rabbitmq-stream", {"stream": "bench"},
                                {"NSQWORKER_RABBITMQ_STREAM_URI": rabbit.uri}, count, work),
        }  # fmt: skip
    finally:
        rabbit.close()
    with NatsServerProcess(binary=str(ROOT / ".tools" / "bin" / "nats-server")) as server:
        settings = Settings(nats_servers=[server.url])
        asyncio.run(publish_nats(server.url, "bench", count))
        results["nats"] = {
            "bare": bare_nats(settings, "bench", count),
            "spark": spark_rate("nats", {"stream": "bench"},
                                {"NSQWORKER_NATS_SERVERS": server.url}, count, work),
        }  # fmt: skip
    nsqd = NsqdProcess(data_path=work / "nsqd")
    nsqd.start()
    try:
        settings = Settings(nsqd_tcp_addresses=[nsqd.tcp_address])
        for channel in ("bare", "spark"):
            nsqd.create_channel("bench", channel)
        for at in range(0, count, 5000):
            nsqd.mpublish("bench", [body(i) for i in range(at, min(at + 5000, count))])
        results["nsq"] = {
            "bare": bare_nsq(settings, nsqd, "bench", count),
            "spark": spark_rate("nsq", {"topic": "bench", "channel": "spark",
                                        "maxRecordsPerBatch": "2000"},
                                {"NSQWORKER_NSQD_TCP_ADDRESSES": nsqd.tcp_address}, count, work),
        }  # fmt: skip
    finally:
        nsqd.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-spark-streaming-") as work:
        results = run(args.messages, Path(work))
    print(f"\n{args.messages:,} messages of 100 bytes, rows/s (2 cores, local[2])")
    print("| source | bare client | Spark into Parquet | goal |")
    print("|---|---|---|---|")
    for source, figures in results.items():
        goal = ">= 150,000" if source == "rabbitmq-stream" else ""
        print(f"| {source} | {figures['bare']:,.0f} | {figures['spark']:,.0f} | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
