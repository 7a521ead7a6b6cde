"""A user's streaming stage on the reconciled watermark, written exactly once to Delta Lake.

Needs pyspark 4.2.0 and delta-spark 4.4.0 (the newest Delta whose jars are on Maven Central; it supports
pyspark <= 4.2.0, so not 4.3), and a broker::

    pip install 'pyspark==4.2.0' 'delta-spark==4.4.0' -e '.[spark]'
    python examples/stage_to_delta.py "$(controlmsg broker start)"

Two upstream tasks write two and a half hours of events with their watermarks; the stage (hourly counts
per user through ``with_watermark``, Spark's own Delta streaming sink, ``availableNow``) is stopped after
its first windows, the upstream writes the rest and ends, and the stage restarts from its checkpoint and
ends by itself at end of stream. It prints the windows before and after, and whether every window is
there exactly once with the counts the upstream wrote. Checked here on 2026-11-25: 4 windows before the
restart, 8 after, all equal to the oracle.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from controlmsg.kafka import ControlWriter
from controlmsg.kafka.admin import create_topic
from controlmsg.spark import WATERMARK_COLUMNS, with_watermark

DELTA = "io.delta:delta-spark_2.13:4.4.0"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def main(servers: str) -> int:
    spark = (SparkSession.builder.master("local[2]").config("spark.sql.shuffle.partitions", "2")
             .config("spark.jars.packages", DELTA)
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    config = {"bootstrap.servers": servers}
    topic = f"delta-stage-{uuid.uuid4().hex[:8]}"
    create_topic(config, topic, 2)
    writers = {name: ControlWriter(config, topic, task_name=name, task_count=2, run_id="r1") for name in ("a", "b")}
    sent: Counter[tuple[int, str]] = Counter()

    def write(task: str, minutes: range) -> None:
        for m in minutes:
            user = f"u{m % 2}"
            writers[task].send({"user": user, "ts": (T0 + timedelta(minutes=m)).isoformat()}, key=user)
            sent[(m // 60, user)] += 1
        writers[task].flush()

    work = tempfile.mkdtemp(prefix="delta-stage-")
    out, checkpoint = f"{work}/out", f"{work}/checkpoint"
    opts = {"topic": topic, "runId": "r1", "kafka.bootstrap.servers": servers, "timeout": "300"}

    def start() -> StreamingQuery:
        events = (spark.readStream.format("controlmsg").options(**opts)
                  .schema(f"user string, ts timestamp, {WATERMARK_COLUMNS}").load())
        return (with_watermark(events, "ts").groupBy(F.window("ts", "1 hour"), "user").agg(F.count("*").alias("n"))
                .writeStream.format("delta").outputMode("append").option("checkpointLocation", checkpoint)
                .trigger(availableNow=True).start(out))

    def windows() -> int:
        try:
            return spark.read.format("delta").load(out).count()
        except Exception:  # no table before the first commit
            return 0

    write("a", range(0, 150, 3))
    write("b", range(1, 150, 4))
    for w in writers.values():
        w.send_watermark(int((T0 + timedelta(minutes=150)).timestamp() * 1000))
        w.flush()
    query = start()
    deadline = time.monotonic() + 120
    while windows() < 4 and time.monotonic() < deadline:
        time.sleep(1)
    query.stop()
    print("windows before the restart:", windows())

    write("a", range(150, 240, 3))
    write("b", range(151, 240, 4))
    for w in writers.values():
        w.send_end_of_stream()
        w.flush()
        w.close()
    query = start()
    query.awaitTermination(180)
    rows = spark.read.format("delta").load(out).collect()
    got = Counter({(r["window"]["start"].hour, r["user"]): r["n"] for r in rows})
    print(f"windows after: {len(rows)} ({len(got)} distinct); ended by itself: {not query.isActive}; "
          f"equal to what the upstream wrote: {got == sent}")
    return 0 if len(rows) == len(got) and got == sent and not query.isActive else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
