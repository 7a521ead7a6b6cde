"""``ingest``: a file (CSV, JSON lines or Parquet) -> an intermediate topic keyed by a column.

Its own Spark application. Rows with a null key or an unparseable event time are rejected: counted and
written, with the reason, to the rejects file (named in the log). Every write task is one upstream task
of the protocol: it writes its rows, watermarks (its event-time progress minus the allowed lateness) and
finally its end of stream to every partition, in one Kafka transaction (see ``spark_jobs.upstream``).

Record values are JSON objects ``{"key": <key as string>, "event_ms": <epoch ms>, <carried columns>}``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.common import add_common_options, job_logger, run_job
from spark_jobs.events import EVENT_MS, parse_duration, read_table, split_rejects, write_table

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.ingest", description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="CSV, JSON lines or Parquet file (by extension)")
    p.add_argument("--key", required=True, help="the key column")
    p.add_argument("--event-time", required=True, help="the event-time column")
    p.add_argument("--topic", required=True, help="the intermediate topic to write")
    p.add_argument("--carry", action="append", default=[], help="a column to carry (repeatable; default: all)")
    p.add_argument("--null-value", help="CSV token read as null")
    p.add_argument("--partitions", type=int, default=4, help="topic partitions (created if missing)")
    p.add_argument("--tasks", type=int, default=2, help="upstream write tasks")
    p.add_argument("--allowed-lateness", default="0s", help="watermark = event-time progress minus this")
    p.add_argument("--watermark-every", type=int, default=10_000, help="rows between a task's watermarks")
    p.add_argument("--rejects", help="where rejected rows go (default: rejects-<run>.jsonl)")
    add_common_options(p)
    return p


def run(spark: SparkSession, args: argparse.Namespace, servers: str) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    from spark_jobs.upstream import write_intermediate

    log = job_logger("ingest")
    df = read_table(spark, args.input, args.null_value)
    good, rejects = split_rejects(df, args.key, args.event_time)
    carried = args.carry or [c for c in df.columns if c not in (args.key, args.event_time)]
    records = good.select(
        F.col(args.key).cast("string").alias("key"),
        F.col(EVENT_MS).alias("event_ms"),
        *[F.col(c) for c in carried],
    ).repartition(args.tasks)
    rejects_path = args.rejects or f"rejects-{args.run_id}.jsonl"
    rejects = rejects.cache()
    rejected = rejects.count()
    if rejected:
        write_table(rejects, rejects_path)
        log.info("%d rejected row(s) (null key or unparseable event time) written to %s", rejected, rejects_path)
    rejects.unpersist()
    log.info("writing %s to topic %s: %d tasks, %d partitions, run %s",
             args.input, args.topic, args.tasks, args.partitions, args.run_id)
    lateness = parse_duration(args.allowed_lateness) if args.allowed_lateness.strip() not in ("0", "0s") else 0
    result = write_intermediate(
        records, args.topic, bootstrap_servers=servers, run_id=args.run_id, job_name="ingest",
        key_column="key", event_time_column="event_ms", allowed_lateness_ms=lateness,
        watermark_every_rows=args.watermark_every, partitions=args.partitions,
    )
    log.info("wrote %d rows in %.1f s (%d tasks ended their stream on %d partitions)",
             result.rows, result.seconds, result.task_count, result.partitions)
    return {"rows_in": result.rows + rejected, "rows_out": result.rows, "rejects": rejected,
            "rejects_path": rejects_path if rejected else None, "write_seconds": result.seconds,
            "tasks": result.task_count}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("ingest", build_parser(), run, argv)

if __name__ == "__main__":
    sys.exit(main())
