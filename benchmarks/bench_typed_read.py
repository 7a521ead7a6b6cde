#!/usr/bin/env python3
"""What declaring the sums' types saves the batch jobs' reads: ``spark_jobs.events.read_parsed`` with
every numeric column declared (the data source parses the JSON in its reading tasks, ``.schema()``)
against the same read with the types left to the data (the JSON texts parsed in the JVM, ``from_json``,
then a pass over the cache to choose each type), side by side, warm, in one Spark application.

    python benchmarks/bench_typed_read.py [--events N] [--rounds R] [--partitions P] [--tasks K]

Two topics are written first with ``format("controlmsg")``, as the pipeline's jobs write them: the
events as ingest writes them (``key``, ``event_ms``, ``amount`` double, ``items`` long), and their
count and sums per key and hour as the window job writes them. Each read is what the window job and
the sink do before their work: read to end of stream into a cache of parsed rows and count them.
Every read is done once untimed (Python workers, classes), then ``--rounds`` times, the two ways
alternating; the script prints the medians, rows/s and the ratio inferred / declared, and checks both
ways give the same rows and the same sums.

Kafka: ``--bootstrap-servers`` / ``-X`` / ``--kafka-config``, else ``$KAFKA_BOOTSTRAP_SERVERS``, else a
broker started for the run. Topics created here are deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import TYPE_CHECKING

from common import add_cluster_options, delete_topics, kafka_cluster, load_average, synthetic_events

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SUMS = {"amount": "double", "items": "long"}
HOUR_MS = 3_600_000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2, help="write tasks")
    parser.add_argument("--keys", type=int, default=5000)
    add_cluster_options(parser)
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from controlmsg.spark import spark_session
    from spark_jobs.events import read_parsed

    run = f"bench-typed-{uuid.uuid4().hex[:8]}"
    with kafka_cluster(args) as cluster:
        config = dict(cluster.config)
        spark = spark_session("local[*]", "bench-typed-read")
        topics = {"events": f"{run}-events", "windows": f"{run}-windows"}
        base = {"runId": run, "timeout": "600", "maxTasks": str(spark.sparkContext.defaultParallelism),
                **{f"kafka.{k}": v for k, v in config.items()}}
        try:
            events = synthetic_events(spark, args.events, args.keys).select(
                F.col("user").alias("key"), F.col("event_time").alias("event_ms"), "amount", "items")
            hour = (F.col("event_ms") - F.col("event_ms") % HOUR_MS).alias("window_start")
            windows = events.groupBy("key", hour).agg(
                F.count(F.lit(1)).alias("count"), F.sum("amount").alias("sum_amount"),
                F.sum("items").alias("sum_items")).withColumn("window_end", F.col("window_start") + HOUR_MS)
            for what, df, time_column in (("events", events, "event_ms"), ("windows", windows, "window_start")):
                (df.repartition(args.tasks).write.format("controlmsg").mode("append")
                 .options(**base, topic=topics[what], job="bench", key="key", eventTime=time_column,
                          partitions=str(args.partitions), runTag="none").save())
            reads: dict[str, tuple[dict[str, str], dict[str, str]]] = {
                "events": ({"key": "string", "event_ms": "long"}, SUMS),
                "windows": ({"key": "string", "window_start": "long", "window_end": "long", "count": "long"},
                            {f"sum_{c}": t for c, t in SUMS.items()}),
            }

            def read(what: str, declared: bool, check: bool = False) -> tuple[int, tuple[float, ...]]:
                known, sums = reads[what]
                parsed, typed, rows = read_parsed(spark, {**base, "topic": topics[what]}, known,
                                                  {c: (t if declared else None) for c, t in sums.items()})
                totals = _sums(typed, list(sums)) if check else ()
                parsed.unpersist()
                return rows, totals

            for what in reads:  # untimed, and the check that both ways agree
                got = {declared: read(what, declared, check=True) for declared in (True, False)}
                if got[True][0] != got[False][0] or any(
                        abs(a - b) > 1e-9 * max(1.0, abs(a)) for a, b in zip(got[True][1], got[False][1], strict=True)):
                    raise SystemExit(f"{what}: declared and inferred reads differ: {got}")
            samples: dict[tuple[str, bool], list[float]] = {(w, d): [] for w in reads for d in (True, False)}
            rows = dict.fromkeys(reads, 0)
            for r in range(args.rounds):
                for what in reads:
                    for declared in ((True, False) if r % 2 == 0 else (False, True)):
                        started = time.monotonic()
                        rows[what], _ = read(what, declared)
                        samples[what, declared].append(time.monotonic() - started)
                    print(f"round {r + 1}: {what}: declared {samples[what, True][-1]:.2f} s, inferred "
                          f"{samples[what, False][-1]:.2f} s ({rows[what]:,} rows)", flush=True)
        finally:
            spark.stop()
            delete_topics(config, list(topics.values()))
    print()
    print("| read to end of stream, cached and counted | declared types | types from the data | inferred / declared |")
    print("|---|---|---|---|")
    for what, label in (("events", "the events, as the window job reads them"),
                        ("windows", "their hourly results, as the sink reads them")):
        d, i = statistics.median(samples[what, True]), statistics.median(samples[what, False])
        print(f"| {label}: {rows[what]:,} rows | {d:.2f} s ({rows[what] / d:,.0f}/s) | "
              f"{i:.2f} s ({rows[what] / i:,.0f}/s) | {i / d:.2f} |")
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.rounds} rounds (medians), "
          f"{args.partitions} partitions, load average {load_average()}")
    return 0


def _sums(df: DataFrame, columns: list[str]) -> tuple[float, ...]:
    from pyspark.sql import functions as F

    row = df.agg(*[F.sum(F.col(c).cast("double")) for c in columns]).first()
    assert row is not None
    return tuple(float(v or 0.0) for v in row)


if __name__ == "__main__":
    sys.exit(main())
