"""``sink``: intermediate topic of window results -> one file (CSV, JSON lines or Parquet, by extension).

Its own Spark application. Reads the followed run until every upstream task has ended on every
partition, then writes ``key, window_start, window_end`` (ISO-8601 UTC) ``, count, sum_<col>...``
sorted by key and window start, as one file at ``--output``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import description
from spark_jobs.checks import output_problems, sum_problems, typed_sums
from spark_jobs.common import add_common_options, controlmsg_options, job_logger, run_job
from spark_jobs.events import iso_utc, read_parsed, top_column, write_table

__all__ = ["build_parser", "check_arguments", "main", "read_results", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.batch.sink", description=description(__doc__))
    p.add_argument("--input-topic", required=True)
    p.add_argument("--output", required=True, help="CSV, JSON lines or Parquet file (by extension)")
    p.add_argument("--sum", action="append", default=[], metavar="COL[:TYPE]",
                   help="a summed column, for the column order (repeatable); TYPE long or double declares the "
                        "type of sum_<COL>, which lets the data source parse the results in the reading tasks "
                        "(faster); without it the type comes from the data")
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: the output file can be written, the
    sums' types."""
    return output_problems("--output", args.output) + sum_problems("--sum", args.sum)


def read_results(spark: SparkSession, options: dict[str, str],
                 sums: Mapping[str, str | None]) -> tuple[DataFrame, DataFrame, int]:
    """The followed run of the window results topic (``format("controlmsg")`` ``options``), read to end
    of stream into a cache of parsed rows (:func:`~spark_jobs.events.read_parsed`; ``sums``: each
    ``sum_<col>`` with its declared type or ``None``). Returns the cache (the caller unpersists it), its
    rows with the sums typed, and how many there are."""
    known = {"key": "string", "window_start": "long", "window_end": "long", "count": "long"}
    options = {"maxTasks": str(spark.sparkContext.defaultParallelism), **options}
    return read_parsed(spark, options, known, sums)


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary.

    The input is read once into a cache of parsed rows, counted (and the sums whose type is not declared
    typed) in one pass over the cache (:func:`read_results`); one task then sorts them and writes the file
    (the file is one part file anyway, so a range-partitioned sort would only add a sampling pass and a
    shuffle).
    """
    log = job_logger("sink")
    log.info("reading topic %s (run %s) until end of stream", args.input_topic, args.run_id)
    sums = {f"sum_{c}": typ for c, typ in typed_sums(args.sum).items()}
    parsed, results, rows = read_results(spark, controlmsg_options(args, config, args.input_topic), sums)
    ended_at = time.time()
    out = results.coalesce(1).sortWithinPartitions("key", "window_start").select(
        "key", iso_utc(F.col("window_start")).alias("window_start"),
        iso_utc(F.col("window_end")).alias("window_end"), "count", *[top_column(c) for c in results.columns[4:]],
    )
    write_table(out, args.output)
    parsed.unpersist()
    log.info("wrote %d rows to %s", rows, args.output)
    return {"rows_in": rows, "rows_out": rows, "output": args.output, "input_ended_at": ended_at}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("sink", build_parser(), run, argv, check_arguments)

if __name__ == "__main__":
    sys.exit(main())
