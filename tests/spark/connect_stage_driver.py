"""A Spark Connect client program for ``test_a_stage_whose_connect_client_went_away_fails_in_one_line``: a stage
(``with_watermark`` on an intermediate topic, its records passed on) written with ``stageProgress driver`` and
followed by :func:`controlmsg.spark.await_stage`, as a client with a checkpoint anywhere is told to. Prints
``following`` once the query has started, and ``ended True`` when ``await_stage`` returns."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--remote", "--input", "--output", "--checkpoint", "--bootstrap-servers"):
        p.add_argument(name, required=True)
    p.add_argument("--timeout", required=True, help="the sink's (how long an unfollowed query runs on)")
    args = p.parse_args()
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # pyspark's functions take Connect's form from the environment
    from pyspark.sql import functions as F
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    from controlmsg.spark import WATERMARK_COLUMNS, await_stage, register, with_watermark

    spark: Any = RemoteSparkSession.builder.remote(args.remote).create()  # register takes either session
    register(spark)
    common = {"kafka.bootstrap.servers": args.bootstrap_servers}
    events = (spark.readStream.format("controlmsg").options(**common).option("topic", args.input)
              .option("timeout", "600")
              .option("runId", "r1").schema(f"user string, ts long, amount long, {WATERMARK_COLUMNS}").load()
              .withColumn("time", F.timestamp_millis("ts")))
    out = with_watermark(events, "time").select("user", "ts", "amount")
    opts = {**common, "topic": args.output, "runId": "s1", "stageProgress": "driver", "timeout": args.timeout}
    query = (out.writeStream.format("controlmsg").options(**opts).option("key", "user").option("eventTime", "ts")
             .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())
    print("following", flush=True)
    print("ended", await_stage(query, opts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
