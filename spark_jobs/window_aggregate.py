"""``window_aggregate``: intermediate topic -> tumbling event-time windows per key -> the next topic.

Its own Spark application. Reads the followed run of the input topic until every upstream task has ended
on every partition, counts records and sums each ``--sum`` column (SQL SUM: nulls skipped; all null ->
null) per key and window ``[start, start + window)``, and writes one record per (key, window) to the
output topic, with its own watermarks and end of stream, as the next job's upstream.

Input values: ``{"key", "event_ms", <columns>}`` (what ``ingest`` writes). Output values:
``{"key", "window_start", "window_end" (epoch ms), "count", "sum_<col>"...}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from controlmsg.spark import run_status
from spark_jobs.checks import duration_problems, positive_problems
from spark_jobs.common import add_common_options, controlmsg_options, job_logger, run_job
from spark_jobs.events import is_fractional, json_columns, numeric_value, parse_duration

__all__ = ["aggregate_json_windows", "aggregate_windows", "build_parser", "check_arguments", "main", "run"]


def aggregate_windows(records: DataFrame, window_ms: int, sums: Sequence[str]) -> DataFrame:
    """count and sum_<col> per (key, tumbling window); window bounds in epoch ms."""
    start = F.col("event_ms") - F.pmod(F.col("event_ms"), F.lit(window_ms))
    aggs = [F.count(F.lit(1)).alias("count")]
    for col in sums:
        aggs.append(F.sum(F.col(col)).alias(f"sum_{col}"))
    return (
        records.groupBy(F.col("key"), start.alias("window_start"))
        .agg(*aggs)
        .withColumn("window_end", F.col("window_start") + F.lit(window_ms))
        .select("key", "window_start", "window_end", "count", *[f"sum_{c}" for c in sums])
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.window_aggregate", description=__doc__.split("\n")[0])
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output-topic", required=True)
    p.add_argument("--window", required=True, help="tumbling window length, e.g. 15m, 1h, 1d")
    p.add_argument("--sum", action="append", default=[], help="a column to sum (repeatable)")
    p.add_argument("--partitions", type=int, default=4, help="output topic partitions (created if missing)")
    p.add_argument("--tasks", type=int, default=2, help="output write tasks")
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: the window, the counts."""
    return (duration_problems([("--window", args.window, False)])
            + positive_problems([("--partitions", args.partitions), ("--tasks", args.tasks)]))


def _partial_windows(records: DataFrame, window_ms: int, sums: Sequence[str]) -> DataFrame:
    """count per (key, window), and for each summed column (still its JSON text) both possible sums
    (``double``; ``long`` with its count of values, to tell an overflow from all-null) and whether any
    value had a fraction: one pass over the input, the type chosen afterwards."""
    start = F.col("event_ms") - F.pmod(F.col("event_ms"), F.lit(window_ms))
    aggs = [F.count(F.lit(1)).alias("count")]
    for i, col in enumerate(sums):
        text = F.col(col)
        aggs += [F.sum(numeric_value(text, True)).alias(f"d{i}"),
                 F.try_sum(numeric_value(text, False)).alias(f"l{i}"),
                 F.count(numeric_value(text, False)).alias(f"n{i}"),
                 F.max(is_fractional(text)).alias(f"f{i}")]
    return records.groupBy(F.col("key"), start.alias("window_start")).agg(*aggs)


def _long_sum(i: int, col: str) -> Column:
    # try_sum is null on overflow: with values present that is an error, as SQL SUM's would be.
    overflow = F.col(f"l{i}").isNull() & (F.col(f"n{i}") > 0)
    return F.when(overflow, F.raise_error(F.concat(
        F.lit(f"sum of {col!r} overflows a long for key "), F.col("key"), F.lit(" in the window at "),
        F.col("window_start").cast("string")))).otherwise(F.col(f"l{i}"))


def aggregate_json_windows(raw: DataFrame, window_ms: int, sums: Sequence[str]) -> tuple[DataFrame, int, DataFrame]:
    """The window job's aggregation of a raw read (its ``value`` column, the JSON ``{"key", "event_ms",
    <columns>}`` that ingest writes): ``(windows, records read, cached)``.

    ``windows`` has ``key, window_start, window_end, count, sum_<col>...``, each sum ``long`` unless some
    value of its column has a fraction or an exponent (then ``double``); a ``long`` sum that overflows
    fails the query with the column, key and window named. The input is read by the one action this runs;
    ``cached`` (the per-window partial results) is what the caller unpersists once ``windows`` is written.
    """
    partial = _partial_windows(json_columns(raw, {"key": "string", "event_ms": "long"}, sums), window_ms, sums)
    partial = partial.cache()
    totals = partial.agg(F.sum("count").alias("rows"),
                         *[F.max(f"f{i}").alias(f"f{i}") for i in range(len(sums))]).first()
    assert totals is not None
    windows = partial.select(
        "key", "window_start", (F.col("window_start") + F.lit(window_ms)).alias("window_end"), "count",
        *[(F.col(f"d{i}") if totals[f"f{i}"] == 1 else _long_sum(i, c)).alias(f"sum_{c}")
          for i, c in enumerate(sums)])
    return windows, int(totals["rows"] or 0), partial


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary.

    One pass over the input: the reading tasks feed Spark's partial aggregation as their batches arrive
    (nothing else is kept of the input); the (much smaller) windows are cached, their totals say how many
    records came in and each sum's type, and the windows are written from the cache.
    """
    log = job_logger("window_aggregate")
    started = time.monotonic()
    window_ms = parse_duration(args.window)
    log.info("reading topic %s (run %s) until end of stream", args.input_topic, args.run_id)
    # Every reading task holds a core until its partitions end: at most as many tasks as the application
    # has cores, so that all of them read at once.
    raw = (spark.read.format("controlmsg")
           .options(**controlmsg_options(args, config, args.input_topic,
                                         maxTasks=str(spark.sparkContext.defaultParallelism)))
           .load())
    windows, rows_in, cached = aggregate_json_windows(raw, window_ms, args.sum)
    ended_after = time.monotonic() - started
    log.info("input ended: %d records in %.1f s", rows_in, ended_after)
    options = controlmsg_options(args, config, args.output_topic, job="window", key="key",
                                 eventTime="window_start", partitions=str(args.partitions))
    windows.repartition(args.tasks).write.format("controlmsg").mode("append").options(**options).save()
    eos_written_at = time.time()  # save() returns once every task's end of stream is committed
    cached.unpersist()
    written = run_status(options)
    assert written is not None and written["ended"]
    log.info("wrote %d window results in %.1f s", written["rows"], time.monotonic() - started)
    return {"rows_in": rows_in, "rows_out": written["rows"], "input_ended_seconds": ended_after,
            "eos_written_at": eos_written_at}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("window_aggregate", build_parser(), run, argv, check_arguments)

if __name__ == "__main__":
    sys.exit(main())
