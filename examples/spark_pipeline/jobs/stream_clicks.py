"""PySpark streaming job: clicks from a broker into Parquet, and sessions per window.

    python stream_clicks.py --format nats --stream clicks --output out/ --checkpoint ck/
    python stream_clicks.py ... --available-now     # what is there now, then stop

Reads JSON click events (``{"user", "ts", "page"}``, as ``generate.py`` writes them)
from a RabbitMQ stream (``--format rabbitmq-stream``), a JetStream stream (``nats``) or
an NSQ topic (``nsq``), with the connection from the workers' ``NSQWORKER_*``
environment, and runs two queries with their own checkpoints:

- ``<output>/clicks``: every click with the broker's offset, partitioned by ``day``
  (exactly once from RabbitMQ Streams and JetStream, at least once from NSQ);
- ``<output>/sessions``: a user's clicks less than 30 minutes apart as one session
  (start, end, clicks), written once the watermark (event time minus an hour) has
  passed the session's end.
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nsqworker.spark.streaming import register

CLICK = "user string, ts string, page string"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--format", default="rabbitmq-stream")
    parser.add_argument("--stream", required=True, help="stream (or NSQ topic) of clicks")
    parser.add_argument("--output", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument(
        "--shuffle-partitions",
        default="4",
        help="the sessions' state partitions (fixed by the checkpoint once the query ran)",
    )
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"stream-clicks-{args.stream}").getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", args.shuffle_partitions)
    register(spark)
    key = "topic" if args.format == "nsq" else "stream"
    raw = spark.readStream.format(args.format).option(key, args.stream).load()
    clicks = parse_clicks(raw)
    writers = {
        "clicks": clicks.writeStream.format("parquet").partitionBy("day"),
        "sessions": sessionize(clicks).writeStream.format("parquet").outputMode("append"),
    }
    queries = []
    for name, writer in writers.items():
        query = writer.option("checkpointLocation", f"{args.checkpoint}/{name}").start(
            f"{args.output}/{name}"
        )
        if not args.available_now:
            queries.append(query)
            continue
        query.processAllAvailable()  # one query at a time: each starts Python workers
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
        rate = rows / (seconds / 1000) if seconds else 0.0
        print(f"stream_clicks: {name}: {rows} rows read in {seconds / 1000:.1f}s ({rate:,.0f} rows/s)",
              flush=True)  # fmt: skip
        query.stop()
    if queries:
        spark.streams.awaitAnyTermination()


def parse_clicks(raw: DataFrame) -> DataFrame:
    """The broker's rows as clicks: the JSON body's fields, its time, the offset."""
    parsed = F.from_json(F.col("body").cast("string"), CLICK)
    return (
        raw.select(parsed.alias("c"), "offset", "id", F.col("timestamp").alias("received"))
        .select("c.*", "offset", "id", "received")
        .withColumn("ts", F.to_timestamp("ts"))
        .withColumn("day", F.to_date("ts").cast("string"))
        .where(F.col("user").isNotNull())
    )


def sessionize(clicks: DataFrame) -> DataFrame:
    """Sessions: a user's clicks with gaps under 30 minutes (Spark's session windows)."""
    return (
        clicks.withWatermark("ts", "1 hour")
        .groupBy("user", F.session_window("ts", "30 minutes").alias("session"))
        .agg(F.count("*").alias("clicks"))
        .select(
            "user",
            F.col("session.start").alias("start"),
            F.col("session.end").alias("end"),
            "clicks",
        )
    )


if __name__ == "__main__":
    main()
