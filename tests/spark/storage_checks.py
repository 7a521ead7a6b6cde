"""What the cluster-storage tests run against a file system (HDFS, S3 through s3a): in the test's own Spark
session, or as the driver of an application of its own (``python -m tests.spark.storage_checks``, for
settings that need a new JVM, such as ``spark.jars``, or for a standalone master).

``parquet_and_checkpoint(spark, base)``: a Parquet write and read back; then a streaming query (a Parquet
file source, one file per micro-batch, ``availableNow``) with its checkpoint under ``base``, run twice: the
second run must take only the file added after the first, which it can only know from the checkpoint it
reads back from the cluster storage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

SCHEMA = StructType([StructField("id", LongType()), StructField("batch", StringType())])
ROWS_PER_FILE = 5


def list_names(spark: SparkSession, uri: str) -> list[str]:
    """The names in the directory ``uri``, sorted, listed through Hadoop's FileSystem of the session."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return sorted(str(status.getPath().getName()) for status in fs.listStatus(path))


def _input_file(spark: SparkSession, base: str, number: int) -> None:
    rows = [(number * 100 + i, f"file-{number}") for i in range(ROWS_PER_FILE)]
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("append").parquet(f"{base}/in")


def _run_stream(spark: SparkSession, base: str) -> None:
    stream: DataFrame = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(f"{base}/in")
    query = (stream.writeStream.format("parquet").option("path", f"{base}/out")
             .option("checkpointLocation", f"{base}/checkpoint").trigger(availableNow=True).start())
    query.awaitTermination(240)
    if query.isActive:
        query.stop()
        raise AssertionError(f"the streaming query on {base} did not end within 240 s")
    if query.exception() is not None:
        raise AssertionError(f"the streaming query on {base} failed: {query.exception()}")


def parquet_and_checkpoint(spark: SparkSession, base: str) -> dict[str, Any]:
    """Run the checks on ``base`` (a fresh directory URI); return what a test asserts on (JSON-able)."""
    spark.range(0, 1000, numPartitions=4).withColumn("twice", F.col("id") * 2).write.parquet(f"{base}/table")
    table = spark.read.parquet(f"{base}/table")
    parquet = {"rows": table.count(), "sum_twice": table.agg(F.sum("twice")).first()[0],  # type: ignore[index]
               "files": [n for n in list_names(spark, f"{base}/table") if n.endswith(".parquet")]}

    for number in (1, 2):
        _input_file(spark, base, number)
    _run_stream(spark, base)
    first = {"offsets": list_names(spark, f"{base}/checkpoint/offsets"),
             "commits": list_names(spark, f"{base}/checkpoint/commits")}
    _input_file(spark, base, 3)
    _run_stream(spark, base)
    second = {"offsets": list_names(spark, f"{base}/checkpoint/offsets"),
              "commits": list_names(spark, f"{base}/checkpoint/commits")}
    out = spark.read.schema(SCHEMA).parquet(f"{base}/out")
    rows = sorted([int(r["id"]), str(r["batch"])] for r in out.collect())
    return {"parquet": parquet, "first_run": first, "second_run": second, "stream_rows": rows,
            "checkpoint": list_names(spark, f"{base}/checkpoint")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a cluster-storage check as a Spark application of its own")
    parser.add_argument("check", choices=["parquet-and-checkpoint"])
    parser.add_argument("--master", required=True)
    parser.add_argument("--base", required=True, help="a fresh directory URI (hdfs://..., s3a://...)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable), as spark_jobs take them")
    parser.add_argument("--result", type=Path, required=True, help="where the JSON result goes")
    args = parser.parse_args(argv)
    from controlmsg.spark import spark_session

    conf = dict(setting.split("=", 1) for setting in args.spark_conf)
    spark = spark_session(args.master, app_name=f"storage-{args.check}", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result: Any = parquet_and_checkpoint(spark, args.base)
        args.result.write_text(json.dumps(result))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
