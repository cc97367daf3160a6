"""Publish a RabbitMQ stream's bodies to each broker's sink, twice, each time from a
fresh checkpoint (the second run replays batch 0 with the same dedup ids); exits 0.

Usage: sink_query.py SOURCE_STREAM SINKS_JSON WORKDIR
where SINKS_JSON is a list of [format, options].
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from nsqworker.spark.streaming import register


def main() -> None:
    source, sinks, workdir = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    register(spark)
    for run in (1, 2):
        for fmt, options in sinks:
            query = (
                spark.readStream.format("rabbitmq-stream")
                .option("stream", source)
                .load()
                .select("body")
                .writeStream.format(fmt)
                .options(**options)
                .option("checkpointLocation", str(workdir / f"{fmt}-{run}"))
                .start()
            )
            query.processAllAvailable()
            query.stop()
            print(f"run {run}: {fmt} done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
