"""Test job: per-user event counts and value sums of a JSON-lines file, as Parquet."""

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

source, target = sys.argv[1], sys.argv[2]
spark = SparkSession.builder.getOrCreate()
events = spark.read.json(source)
totals = events.groupBy("user").agg(F.count("*").alias("events"), F.sum("value").alias("total"))
totals.coalesce(1).write.mode("overwrite").parquet(target)
print(f"wrote {totals.count()} users to {target}")
spark.stop()
