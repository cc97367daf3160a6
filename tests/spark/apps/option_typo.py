"""Start one query whose ``nats`` source has a misspelt option and one whose ``nats``
sink has one, and print the error each query ends with, one line each (exits 0).

Usage: option_typo.py WORKDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from nsqworker.spark.streaming import register


def failure(frame: DataFrame, fmt: str, checkpoint: Path, **options: str) -> str:
    """The error the query on ``frame`` writing to ``fmt`` ends with, on one line."""
    query = frame.writeStream.format(fmt).options(**options)
    try:
        started = query.option("checkpointLocation", str(checkpoint)).start()
        started.processAllAvailable()
        started.stop()
    except Exception as exc:
        return " ".join(str(exc).split())
    return "no error"


def main() -> None:
    workdir = Path(sys.argv[1])
    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    session = spark.getOrCreate()
    register(session)
    source = (
        session.readStream.format("nats")
        .option("stream", "orders")
        .option("maxRecordPerBatch", "5")
        .load()
    )
    print("source:", failure(source, "noop", workdir / "source"), flush=True)
    rows = session.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS body")
    print("sink:", failure(rows, "nats", workdir / "sink", subject="out", producerNmae="p"))
    session.stop()


if __name__ == "__main__":
    main()
