"""A streaming query from broker sources (their union) into Parquet with a checkpoint;
runs until it is killed (the streaming tests kill -9 it mid-batch and start it again).

Usage: stream_query.py SOURCES_JSON OUTPUT CHECKPOINT [connect REMOTE]
where SOURCES_JSON is a list of [format, options].
"""

from __future__ import annotations

import json
import signal
import sys
import time

from pyspark.sql import SparkSession

from nsqworker.spark.streaming import register


def main() -> None:
    sources, output, checkpoint = sys.argv[1:4]
    if len(sys.argv) > 5 and sys.argv[4] == "connect":
        spark = SparkSession.builder.remote(sys.argv[5]).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    register(spark)
    frames = [spark.readStream.format(f).options(**o).load() for f, o in json.loads(sources)]
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    query = (
        union.writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start(output)
    )
    print("query started", flush=True)
    # SIGTERM stops the query (over Spark Connect it runs in the server, past this client)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while query.isActive:
            time.sleep(0.2)
        query.awaitTermination()  # raises the error that ended the query
    finally:
        query.stop()
        print("query stopped", flush=True)


if __name__ == "__main__":
    main()
