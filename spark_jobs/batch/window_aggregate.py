"""``window_aggregate``: intermediate topic -> tumbling event-time windows per key -> the next topic.

Its own Spark application. Reads the followed run of the input topic until every upstream task has ended
on every partition, counts records and sums each ``--sum`` column (SQL SUM: nulls skipped; all null ->
null) per key and window ``[start, start + window)``, and writes one record per (key, window) to the
output topic, with its own watermarks and end of stream, as the next job's upstream.

Input values: ``{"key", "event_ms", <columns>}`` (what ``ingest`` writes). Output values:
``{"key", "window_start", "window_end" (epoch ms), "count", "sum_<col>"...}``. A ``--sum COL:long`` or
``COL:double`` declares the column's type; with every sum declared the input is parsed in the reading
tasks by that schema (see :func:`spark_jobs.events.read_parsed`), otherwise each type comes from the data.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from controlmsg.spark import run_status
from spark_jobs import description
from spark_jobs.checks import duration_problems, positive_problems, sum_problems, typed_sums
from spark_jobs.common import (
    add_common_options,
    add_partitions_option,
    add_run_tag_option,
    add_window_options,
    add_window_topic_options,
    controlmsg_options,
    job_logger,
    run_job,
)
from spark_jobs.events import parse_duration, read_parsed, top_column

__all__ = ["COMMIT_ROWS", "aggregate_windows", "build_parser", "check_arguments", "main", "run"]

COMMIT_ROWS = 50_000
"""Results per transaction of a write task by default: small enough that the last chunks, all the sink has
left to read after the end of stream, take it a fraction of a second (docs/PERFORMANCE.md, "COMMIT_ROWS")."""


def aggregate_windows(records: DataFrame, window_ms: int, sums: Sequence[str]) -> DataFrame:
    """count and sum_<col> per (key, tumbling window); window bounds in epoch ms."""
    start = F.col("event_ms") - F.pmod(F.col("event_ms"), F.lit(window_ms))
    aggs = [F.count(F.lit(1)).alias("count")]
    for col in sums:
        aggs.append(F.sum(top_column(col)).alias(f"sum_{col}"))
    return (
        records.groupBy(F.col("key"), start.alias("window_start"))
        .agg(*aggs)
        .withColumn("window_end", F.col("window_start") + F.lit(window_ms))
        .select("key", "window_start", "window_end", "count", *[top_column(f"sum_{c}") for c in sums])
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.batch.window_aggregate", description=description(__doc__))
    add_window_topic_options(p)
    add_window_options(p)
    add_partitions_option(p)
    p.add_argument("--tasks", type=int, default=2, help="output write tasks")
    p.add_argument("--commit-rows", type=int, default=COMMIT_ROWS,
                   help="a write task commits about every this many results (option commitRows), so that the "
                        "next job reads them while this one writes (default %(default)s)")
    add_run_tag_option(p)
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: the window, the counts."""
    return (duration_problems([("--window", args.window, False)])
            + positive_problems([("--partitions", args.partitions), ("--tasks", args.tasks),
                                 ("--commit-rows", args.commit_rows)])
            + sum_problems("--sum", args.sum))


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    log = job_logger("window_aggregate")
    started = time.monotonic()
    window_ms = parse_duration(args.window)
    log.info("reading topic %s (run %s) until end of stream", args.input_topic, args.run_id)
    # Read into a cache of parsed columns, counted (and the undeclared sums typed) in one pass (read_parsed): the
    # read overlaps the upstream's writing and each value is parsed once (the alternatives measured slower:
    # docs/PERFORMANCE.md, "window_aggregate's read"). A reading task holds a core until its partitions end:
    # at most as many tasks as the application has cores, so that all of them read at once.
    sums = typed_sums(args.sum)
    source = controlmsg_options(args, config, args.input_topic, maxTasks=str(spark.sparkContext.defaultParallelism))
    parsed, records, rows_in = read_parsed(spark, source, {"key": "string", "event_ms": "long"}, sums)
    ended_after = time.monotonic() - started
    log.info("input ended: %d records in %.1f s", rows_in, ended_after)
    windows = aggregate_windows(records, window_ms, list(sums))
    options = controlmsg_options(args, config, args.output_topic, job="window", key="key",
                                 eventTime="window_start", partitions=str(args.partitions),
                                 runTag=args.run_tag, commitRows=str(args.commit_rows))
    # Each write task commits every --commit-rows results (controlmsg.spark.writing.chunks), so the sink reads them
    # while this job writes and only the last chunks are left after the end of stream. A retried task
    # resumes after its committed chunks, which needs its rows in the same order again: hence the sort on
    # the unique (key, window_start) within each task's share. The shares are by key (a hash exchange), not
    # round-robin, which Spark would sort whole before its shuffle to make it repeatable: 0.91x the time at
    # 10M events (docs/PERFORMANCE.md, "The hops' Spark plans").
    (windows.repartition(args.tasks, "key").sortWithinPartitions("key", "window_start")
     .write.format("controlmsg").mode("append").options(**options).save())
    eos_written_at = time.time()  # save() returns once every task's end of stream is committed
    parsed.unpersist()
    written = run_status(options)
    assert written is not None and written["ended"]
    log.info("wrote %d window results in %.1f s", written["rows"], time.monotonic() - started)
    return {"rows_in": rows_in, "rows_out": written["rows"], "input_ended_seconds": ended_after,
            "eos_written_at": eos_written_at}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("window_aggregate", build_parser(), run, argv, check_arguments)

if __name__ == "__main__":
    sys.exit(main())
