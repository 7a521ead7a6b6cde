"""A Spark driver of its own (a fresh JVM) for ``test_two_streams_at_once``: starts two ``controlmsg`` streams at
the same moment from two threads, ``--rounds`` times, and prints one JSON line per round with the keys of the
data source's shared environment map before the starts and after, and its size counter against its entries.

Round 0 is the fresh JVM of a session made by :func:`controlmsg.spark.spark_session`, as the jobs make theirs.
Before each later round the keys Spark's stream runner inserts are taken out again (the map as a fresh JVM has
it), and the streams are set up the other way a stage does: odd rounds through ``register`` on a plain
session, even rounds through ``with_watermark`` alone."""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from controlmsg.spark import register, spark_session, with_watermark

# What Spark's PythonStreamingSourceRunner.init() puts into the map (read from its classes, pyspark 4.2 and 4.3).
STREAM_RUNNER_KEYS = ("SPARK_LOCAL_DIRS", "SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE", "SPARK_PYTHON_RUNTIME")


def shared_map(spark: SparkSession) -> Any:
    """The ``envVars`` of the ``controlmsg`` data source's Python function: one map for every read in the JVM."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    return manager.lookupDataSource("controlmsg").dataSourceCls().envVars()


def start_together(streams: list[DataFrame]) -> list[StreamingQuery]:
    """Start every stream on its own thread, all at one barrier."""
    barrier = threading.Barrier(len(streams))
    queries: list[StreamingQuery] = []
    errors: list[BaseException] = []

    def start(df: DataFrame) -> None:
        try:
            barrier.wait()
            queries.append(df.writeStream.format("noop").trigger(processingTime="1 hour").start())
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(df,)) for df in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return queries


def wait_initialized(queries: list[StreamingQuery], seconds: float) -> None:
    """Until every query's sources exist (its stream runner has run ``init()``); fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while any(q.isActive and q.status["message"] == "Initializing sources" for q in queries):
        if time.monotonic() > deadline:
            raise SystemExit(f"the streams did not initialise within {seconds} s")
        time.sleep(0.05)
    for q in queries:
        if q.exception() is not None:
            raise SystemExit(f"a stream failed: {q.exception()}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = spark_session("local[2]", app_name="two-streams", class_archive=False)
    spark.sparkContext.setLogLevel("ERROR")

    def read() -> DataFrame:
        return (spark.readStream.format("controlmsg").option("kafka.bootstrap.servers", args.servers)
                .option("topic", args.topic).option("runId", "r").schema("ts timestamp").load())

    for n in range(args.rounds):
        shared = shared_map(spark)
        if n > 0:
            for key in STREAM_RUNNER_KEYS:
                shared.remove(key)
            if n % 2:
                register(spark)
        # Built on this thread, one after the other, as a driver program builds its queries.
        streams = [with_watermark(read(), "ts") if n and not n % 2 else read() for _ in range(2)]
        before = sorted(shared.keySet().toArray())
        queries = start_together(streams)
        try:
            wait_initialized(queries, 120)
        finally:
            for q in queries:
                q.stop()
        after = sorted(shared.keySet().toArray())
        print(json.dumps({"round": n, "before": before, "after": after, "size": shared.size(),
                          "entries": len(after)}), flush=True)


if __name__ == "__main__":
    main()
