"""``python -m spark_jobs.stages.sink``: the window results' topic -> a Parquet directory or a Delta table,
exactly once, as an ordinary Structured Streaming query.

The last stage of the example streaming chain on the public API (:func:`sink_query` is all of it):
``readStream.format("controlmsg")`` -> Spark's own file sink (``writeStream.format("parquet")``), whose
log under the checkpoint makes every window result land once across kills and restarts; or, with
``--format delta``, Delta's sink, whose table log records each micro-batch's id for the same purpose (the
application needs Delta's jars and session settings: docs/SPARK.md, "Delta"). The query runs
``availableNow``: until the windows topic's end of stream.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs import description
from spark_jobs.checks import sum_problems
from spark_jobs.common import add_common_options, controlmsg_options, job_logger, metrics_problems, run_job
from spark_jobs.stages.common import add_stage_options, run_queries, serve_stage_metrics, stage_summary, sum_fields

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["FORMATS", "build_parser", "main", "run", "sink_query"]

FORMATS = ("parquet", "delta")
"""The sinks the stage writes with: Spark's file sink, or Delta's (delta-spark on the application)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.stages.sink", description=description(__doc__))
    p.add_argument("--input-topic", required=True, help="the window results")
    p.add_argument("--output", required=True, help="a Parquet directory, or a Delta table's with --format delta")
    p.add_argument("--format", choices=FORMATS, default="parquet", help="the output's (default: parquet)")
    p.add_argument("--sum", action="append", default=[], metavar="COL[:TYPE]",
                   help="a summed column of the results (repeatable), as stage_window was given it")
    add_stage_options(p)
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    return sum_problems("--sum", args.sum) + metrics_problems(args)


def sink_query(spark: SparkSession, source: dict[str, str], output: str, *, sums: dict[str, str],
               checkpoint: str, output_format: str = "parquet") -> StreamingQuery:
    """The stage: window results (``format("controlmsg")`` options ``source``) to ``output``, a Parquet
    directory or (``output_format="delta"``) a Delta table. Raises ``ValueError`` for another format."""
    if output_format not in FORMATS:
        raise ValueError(f"output format {output_format!r}: expected one of {', '.join(FORMATS)}")
    columns = "".join(f", `sum_{c}` {t}" for c, t in sums.items())
    results = (spark.readStream.format("controlmsg").options(**source)
               .schema(f"key string, window_start long, window_end long, count long{columns}").load())
    return (results.writeStream.format(output_format).option("path", output)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    log = job_logger("stage_sink")
    source = controlmsg_options(args, config, args.input_topic, maxOffsetsPerTrigger=args.max_offsets_per_trigger)

    def start() -> list[StreamingQuery]:
        query = sink_query(spark, source, args.output, sums=sum_fields(args.sum), checkpoint=args.checkpoint,
                           output_format=args.format)
        log.info("query started: %s -> %s (%s), checkpoint %s, run %s", args.input_topic, args.output,
                 args.format, args.checkpoint, args.run_id)
        return [query]

    serve_stage_metrics(spark, args, log)
    (query,) = run_queries(start, log)
    return stage_summary(query, {})


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("stage_sink", build_parser(), run, argv, check_arguments)


if __name__ == "__main__":
    sys.exit(main())
