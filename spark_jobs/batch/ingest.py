"""``ingest``: a file (CSV, JSON lines or Parquet) -> an intermediate topic keyed by a column.

Its own Spark application. Rows with a null key or an unparseable event time are rejected: counted and
written, with the reason, to the rejects file (named in the log). Written with
``df.write.format("controlmsg")``: each write task's rows in one Kafka transaction, then the driver's end of
stream on every partition (the driver is the one upstream task of the protocol; see
:mod:`controlmsg.spark.writing`).

Record values are JSON objects ``{"key": <key as string>, "event_ms": <epoch ms>, <carried columns>}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from controlmsg.spark import run_status
from spark_jobs import description
from spark_jobs.checks import input_problems, output_problems, positive_problems, sum_problems, typed_sums
from spark_jobs.common import add_common_options, add_run_tag_option, controlmsg_options, job_logger, run_job
from spark_jobs.events import EVENT_MS, read_table, split_rejects_observed, top_column, write_table, write_tasks

__all__ = ["build_parser", "check_arguments", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.batch.ingest", description=description(__doc__))
    p.add_argument("--input", required=True, help="CSV, JSON lines or Parquet file (by extension)")
    p.add_argument("--key", required=True, help="the key column")
    p.add_argument("--event-time", required=True, help="the event-time column")
    p.add_argument("--topic", required=True, help="the intermediate topic to write")
    p.add_argument("--carry", action="append", default=[], metavar="COL[:TYPE]",
                   help="a column to carry (repeatable; default: all); TYPE long or double: the column is written "
                        "as that type (an integral column as long; any numeric column as double), as the jobs "
                        "downstream are told to read it (their --sum COL:TYPE)")
    p.add_argument("--null-value", help="CSV token read as null")
    p.add_argument("--partitions", type=int, default=4, help="topic partitions (created if missing)")
    p.add_argument("--tasks", type=int, default=2, help="upstream write tasks")
    p.add_argument("--rejects", help="where rejected rows go (default: rejects-<run>.jsonl)")
    add_run_tag_option(p)
    add_common_options(p)
    return p


def _rejects_path(args: argparse.Namespace) -> str:
    return str(args.rejects or f"rejects-{args.run_id}.jsonl")


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: the input (exists, not empty, has
    the columns named), the counts, and that the rejects file can be written."""
    problems = sum_problems("--carry", args.carry)
    carried = list(typed_sums(args.carry)) if not problems else []
    columns = [("--key", args.key), ("--event-time", args.event_time), *[("--carry", c) for c in carried]]
    problems += input_problems("--input", args.input, columns)
    problems += positive_problems([("--partitions", args.partitions), ("--tasks", args.tasks)])
    return problems + output_problems("--rejects", _rejects_path(args))


def _carried(df: DataFrame, column: str, declared: str | None) -> Column:
    """``column`` as written: as it is, or cast to its ``declared`` type (``long``: the column must be
    integral; ``double``: numeric). Raises ``ValueError`` naming the column and its type otherwise, before
    anything is written: a declared type is a promise to the jobs downstream, which parse by it."""
    col = top_column(column)
    if declared is None:
        return col
    dtype = df.schema[column].dataType
    fits = isinstance(dtype, T.IntegralType) if declared == "long" else isinstance(dtype, T.NumericType)
    if not fits:
        raise ValueError(f"--carry {column}:{declared}: column {column!r} is {dtype.simpleString()} in the input; "
                         + ("a long column must be integral (declare double for a fractional one)"
                            if declared == "long" and isinstance(dtype, T.NumericType)
                            else "a declared column must be numeric"))
    return col.cast(declared).alias(column)


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    log = job_logger("ingest")
    df = read_table(spark, args.input, args.null_value)
    good, rejects, seen = split_rejects_observed(df, args.key, args.event_time)
    carried = typed_sums(args.carry) or {c: None for c in df.columns if c not in (args.key, args.event_time)}
    records = write_tasks(good.select(
        top_column(args.key).cast("string").alias("key"),
        F.col(EVENT_MS).alias("event_ms"),
        *[_carried(df, c, typ) for c, typ in carried.items()],
    ), args.tasks, df.rdd.getNumPartitions())
    rejects_path = _rejects_path(args)
    log.info("writing %s to topic %s: %d tasks, %d partitions, run %s",
             args.input, args.topic, args.tasks, args.partitions, args.run_id)
    started = time.monotonic()
    options = controlmsg_options(args, config, args.topic, job="ingest", key="key", eventTime="event_ms",
                                 partitions=str(args.partitions), runTag=args.run_tag)
    records.write.format("controlmsg").mode("append").options(**options).save()
    seconds = time.monotonic() - started
    written = run_status(options)
    assert written is not None and written["ended"]
    log.info("wrote %d rows in %.1f s (%d write tasks; the driver ended the stream on %d partitions)",
             written["rows"], seconds, written["writeTasks"], args.partitions)
    rejected = 0
    if seen.get["rejects"]:  # the write's own pass saw rejects: one more pass counts and writes them exactly
        rejects = rejects.cache()
        rejected = rejects.count()
        write_table(rejects, rejects_path)
        rejects.unpersist()
        log.info("%d rejected row(s) (null key or unparseable event time) written to %s", rejected, rejects_path)
    return {"rows_in": written["rows"] + rejected, "rows_out": written["rows"], "rejects": rejected,
            "rejects_path": rejects_path if rejected else None, "write_seconds": seconds,
            "tasks": written["writeTasks"]}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("ingest", build_parser(), run, argv, check_arguments)

if __name__ == "__main__":
    sys.exit(main())
