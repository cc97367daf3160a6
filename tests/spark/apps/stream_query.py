"""A streaming query from a broker source into Parquet with a checkpoint; runs until
it is killed (the streaming tests kill -9 it mid-batch and start it again).

Usage: stream_query.py FORMAT OPTIONS_JSON OUTPUT CHECKPOINT [connect REMOTE]
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from nsqworker.spark.streaming import register


def main() -> None:
    fmt, options, output, checkpoint = sys.argv[1:5]
    if len(sys.argv) > 6 and sys.argv[5] == "connect":
        spark = SparkSession.builder.remote(sys.argv[6]).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
    register(spark)
    query = (
        spark.readStream.format(fmt)
        .options(**json.loads(options))
        .load()
        .writeStream.format("parquet")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start(output)
    )
    print("query started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
