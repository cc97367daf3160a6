"""PySpark job: sessionize a day of clicks per user and write daily reports as Parquet.

    spark-submit sessionize.py --input clicks.jsonl --day 2026-11-23 --output out/

A session is a user's clicks with less than 30 minutes between consecutive ones.
Writes, partitioned by ``day``:

- ``<output>/sessions``: one row per session (user, start, end, clicks, seconds);
- ``<output>/daily``: one row per day (sessions, users, clicks, average clicks and
  seconds per session);
- ``<output>/top_pages``: the day's 10 most viewed pages with views and rank;

and ``<output>/_counts/day=<day>.json`` with the row counts of each, for the task.
Partitions are overwritten, so running a day again replaces it (the job is idempotent).
"""

from __future__ import annotations

import argparse
import json
import os
import uuid

from pyspark.sql import Observation, SparkSession, Window
from pyspark.sql import functions as F

GAP_SECONDS = 30 * 60
CLICKS = "user string, ts string, page string"
"""The input's schema (generate.py writes it)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", required=True)
    parser.add_argument("--day", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    spark = SparkSession.builder.appName(f"sessionize-{args.day}").getOrCreate()
    counts = sessionize_day(spark, args.input, args.day, args.output)
    print(f"sessionize {args.day}: {json.dumps(counts)}")
    spark.stop()


def sessionize_day(spark: SparkSession, source: str, day: str, output: str) -> dict[str, int]:
    """Sessionize ``day`` of the clicks in ``source`` into ``output``; returns the row
    counts. Also what the session form of the task (session_tasks.py) calls, in the
    worker's long-lived session: so both write the same Parquet.

    Three queries, one a table: the clicks' schema is given (inferring it would read
    the input once more), and each table's rows are counted while it is written (an
    ``Observation``), not by a second job."""
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    ts = F.to_timestamp("ts")
    clicks = (
        spark.read.schema(CLICKS)
        .json(source)
        .select("user", "page", ts.alias("ts"), F.to_date(ts).cast("string").alias("day"))
        .where(F.col("day") == day)
    )
    by_user = Window.partitionBy("user").orderBy("ts")
    epoch = F.col("ts").cast("long")
    gap = epoch - F.lag(epoch).over(by_user)
    new = F.when(gap.isNull() | (gap > GAP_SECONDS), 1).otherwise(0)
    so_far = by_user.rowsBetween(Window.unboundedPreceding, 0)
    sessions = (
        clicks.select("day", "user", "ts", new.alias("new"))
        .select("day", "user", "ts", F.sum("new").over(so_far).alias("session"))
        .groupBy("day", "user", "session")
        .agg(F.min("ts").alias("start"), F.max("ts").alias("end"), F.count("*").alias("clicks"))
        .withColumn("seconds", F.col("end").cast("long") - F.col("start").cast("long"))
    ).cache()
    daily = sessions.groupBy("day").agg(
        F.count("*").alias("sessions"),
        F.countDistinct("user").alias("users"),
        F.sum("clicks").alias("clicks"),
        F.round(F.avg("clicks"), 2).alias("avg_clicks"),
        F.round(F.avg("seconds"), 1).alias("avg_seconds"),
    )
    views = clicks.groupBy("day", "page").agg(F.count("*").alias("views"))
    by_views = Window.partitionBy("day").orderBy(F.desc("views"), "page")
    top_pages = views.withColumn("rank", F.row_number().over(by_views)).where("rank <= 10")

    counts = {}
    for name, frame in (("sessions", sessions), ("daily", daily), ("top_pages", top_pages)):
        rows = Observation(f"{name}-{uuid.uuid4().hex}")  # unique: two days may run at once
        counted = frame.observe(rows, F.count(F.lit(1)).alias("rows"))
        counted.coalesce(1).write.mode("overwrite").partitionBy("day").parquet(
            os.path.join(output, name)
        )
        counts[name] = int(rows.get["rows"])
    sessions.unpersist()  # a long-lived session would keep every day's cache
    if "://" not in output or output.startswith("file://"):
        folder = os.path.join(output.removeprefix("file://"), "_counts")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"day={day}.json"), "w") as out:
            json.dump(counts, out)
    return counts


if __name__ == "__main__":
    main()
