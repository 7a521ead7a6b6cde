"""A stage over two inputs: two upstream jobs each write a controlmsg topic; this stage joins them (a
stream-stream join with an event-time bound) or unions them, on the minimum of the two reconciled
watermarks, and ends the next topic's stream when both inputs have ended.

Each input's records are ``{"key": str, "ts": epoch ms, "v": int}``. The stage writes, keyed by ``key``:

- ``--how union``: every record of both inputs, ``{"key", "ts", "side", "v"}`` (``side`` 0 is the first input);
- ``--how join``: each pair of a first-input and a second-input record with the same key whose times are at most
  ``--bound`` apart, ``{"key", "ts", "left_ts", "right_ts", "left_v", "right_v"}``, ``ts`` the later of the two.

The output's event time is ``ts``. A joined pair is emitted when its later record is read, and that record is
at or after its own input's reconciled watermark, so at or after the minimum: the pair is never late
downstream. ``with_watermark`` on each input, Spark's ``min`` policy across them (its default; ``max`` is
refused), ``availableNow``: the stage waits for both upstreams, and ends by itself once both have ended and
Spark's watermark has passed everything (the join's state). ``kill -9`` and the same command resume from
``--checkpoint``: nothing twice, the watermark never back.

    python examples/two_inputs.py --how join --left clicks --left-run-id c1 --right views --right-run-id v1 \\
        --output pairs --run-id p1 --checkpoint ck/pairs --bootstrap-servers "$(controlmsg broker start)"
"""

from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from controlmsg.spark import WATERMARK_COLUMNS, spark_session, with_watermark


def read(spark: SparkSession, topic: str, run_id: str, options: dict[str, str], name: str) -> DataFrame:
    """One input, on its own reconciled watermark (each ``with_watermark`` of a query needs its own metrics name)."""
    events = (spark.readStream.format("controlmsg").options(**options).option("topic", topic).option("runId", run_id)
              .schema(f"key string, ts long, v long, {WATERMARK_COLUMNS}").load()
              .withColumn("time", F.timestamp_millis("ts")))
    return with_watermark(events, "time", metrics_name=name)


def union(left: DataFrame, right: DataFrame) -> DataFrame:
    return (left.select("key", "ts", F.lit(0).alias("side"), "v")
            .unionByName(right.select("key", "ts", F.lit(1).alias("side"), "v")))


def join(left: DataFrame, right: DataFrame, bound: str) -> DataFrame:
    a, b = left.alias("a"), right.alias("b")
    on = F.expr(f"a.key = b.key AND b.time BETWEEN a.time - INTERVAL {bound} AND a.time + INTERVAL {bound}")
    return (a.join(b, on, "inner")
            .select(F.col("a.key").alias("key"), F.greatest("a.ts", "b.ts").alias("ts"),
                    F.col("a.ts").alias("left_ts"), F.col("b.ts").alias("right_ts"),
                    F.col("a.v").alias("left_v"), F.col("b.v").alias("right_v")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--how", choices=("join", "union"), required=True)
    p.add_argument("--left", required=True, help="the first input topic")
    p.add_argument("--right", required=True, help="the second input topic")
    p.add_argument("--output", required=True, help="the output topic")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    p.add_argument("--run-id", required=True, help="the run this stage writes")
    p.add_argument("--left-run-id", help="the run the first input's upstream writes (default: --run-id)")
    p.add_argument("--right-run-id", help="the run the second input's upstream writes (default: --run-id)")
    p.add_argument("--bootstrap-servers", required=True)
    p.add_argument("--bound", default="1 minute", help="join: how far apart two joined records' times may be")
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)

    spark = spark_session(args.master, "two-inputs")
    common = {"kafka.bootstrap.servers": args.bootstrap_servers, "timeout": "600"}
    left = read(spark, args.left, args.left_run_id or args.run_id, common, "left")
    right = read(spark, args.right, args.right_run_id or args.run_id, common, "right")
    out = join(left, right, args.bound) if args.how == "join" else union(left, right)
    query = (out.writeStream.format("controlmsg").options(**common).option("topic", args.output)
             .option("runId", args.run_id)
             .option("key", "key").option("eventTime", "ts").option("checkpointLocation", args.checkpoint)
             .outputMode("append").trigger(availableNow=True).start())
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
