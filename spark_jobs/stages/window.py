"""``python -m spark_jobs.stages.window``: an intermediate topic -> tumbling windows per key -> the next topic,
as ordinary Structured Streaming queries.

The middle stage of the example streaming chain on the public API (:func:`window_queries` is all of it):
``readStream.format("controlmsg")`` with the reconciled watermark's columns, :func:`controlmsg.spark.
with_watermark`, then Spark's own ``groupBy(window(...)).agg(count, sum)`` in append mode: each window is
emitted once, when the reconciled watermark of the upstream passes its end, and written with
``writeStream.format("controlmsg")`` as ``{"key", "window_start", "window_end", "count", "sum_<c>"}``
(epoch ms, as the long-running ``stream_window`` writes them). The writer carries the stage's watermark
onward and ends the stream by itself after the last windows. A second query keeps the late records (behind
the watermark they were read with) in ``<output topic>-late``, with that watermark: nothing dropped
without a trace.

Both queries run ``availableNow``: with a ``controlmsg`` source that means until the input's end of stream
(they wait for the upstream meanwhile). ``kill -9`` and the same command resume from ``--checkpoint``
(``<checkpoint>/windows``, ``<checkpoint>/late``): nothing twice, the watermark never back. Spark fixes a
stateful query's shuffle partitions in its checkpoint: this stage cannot be rescaled between runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs import description
from spark_jobs.checks import duration_problems, positive_problems, sum_problems
from spark_jobs.common import (
    add_common_options,
    add_partitions_option,
    add_window_options,
    add_window_topic_options,
    controlmsg_options,
    job_logger,
    metrics_problems,
    run_job,
)
from spark_jobs.stages.common import (
    add_stage_options,
    phase_options,
    run_queries,
    serve_stage_metrics,
    stage_progress,
    stage_summary,
    sum_fields,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["build_parser", "main", "run", "window_queries"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.stages.window", description=description(__doc__))
    add_window_topic_options(p)
    add_window_options(p)
    add_partitions_option(p)
    add_stage_options(p)
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    return (duration_problems([("--window", args.window, False)]) + sum_problems("--sum", args.sum)
            + positive_problems([("--partitions", args.partitions)]) + metrics_problems(args))


def window_queries(spark: SparkSession, source: dict[str, str], sink: dict[str, str], late_sink: dict[str, str], *,
                   window: str, sums: dict[str, str], checkpoint: str) -> tuple[StreamingQuery, StreamingQuery]:
    """The stage: the windows query and the late records' query, ``format("controlmsg")`` in and out."""
    from pyspark.sql import functions as F

    from controlmsg.spark import WATERMARK_COLUMNS, late_records, with_watermark

    columns = ", ".join(f"`{c}` {t}" for c, t in sums.items())
    events = (spark.readStream.format("controlmsg").options(**source)
              .schema(f"key string, event_ms long, {columns + ', ' if columns else ''}{WATERMARK_COLUMNS}")
              .load()
              .withColumn("ts", F.timestamp_millis("event_ms")))
    windows = (with_watermark(events, "ts")
               .groupBy(F.window("ts", window), "key")
               .agg(F.count(F.lit(1)).alias("count"), *[F.sum(c).alias(f"sum_{c}") for c in sums])
               .select("key", F.unix_millis(F.col("window.start")).alias("window_start"),
                       F.unix_millis(F.col("window.end")).alias("window_end"), "count",
                       *[f"sum_{c}" for c in sums]))
    # each late record with the watermark it was behind (its partition's, or the topic's when higher)
    late = late_records(events, "ts").select(
        "key", "event_ms", *sums,
        F.unix_millis(F.greatest("_watermark", "_partition_watermark") if "_partition_watermark" in events.columns
                      else F.col("_watermark")).alias("watermark"))
    started = (windows.writeStream.format("controlmsg").options(**sink).outputMode("append")
               .option("checkpointLocation", f"{checkpoint}/windows").trigger(availableNow=True).start())
    kept = (late.writeStream.format("controlmsg").options(**late_sink)
            .option("checkpointLocation", f"{checkpoint}/late").trigger(availableNow=True).start())
    return started, kept


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    from spark_jobs.events import parse_duration

    log = job_logger("stage_window")
    seconds = parse_duration(args.window) / 1000
    if not any(s.partition("=")[0].strip() == "spark.sql.shuffle.partitions" for s in args.spark_conf):
        # The windows' state and write tasks: one per core (a new checkpoint only: Spark keeps the first value).
        spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    phases = phase_options(args)
    source = controlmsg_options(args, config, args.input_topic, maxOffsetsPerTrigger=args.max_offsets_per_trigger,
                                **phases)
    sink = controlmsg_options(args, config, args.output_topic, job="stage_window", key="key",
                              eventTime="window_end", partitions=str(args.partitions),
                              **stage_progress(f"{args.checkpoint}/windows"), **phases)
    late_sink = controlmsg_options(args, config, f"{args.output_topic}-late", job="stage_window_late", key="key",
                                   eventTime="event_ms", partitions="1",
                                   **stage_progress(f"{args.checkpoint}/late"), **phases)

    def start() -> tuple[StreamingQuery, StreamingQuery]:
        queries = window_queries(spark, source, sink, late_sink, window=f"{seconds:g} seconds",
                                 sums=sum_fields(args.sum), checkpoint=args.checkpoint)
        log.info("query started: %s -> %s windows of %s, late records -> %s, checkpoint %s, run %s",
                 args.input_topic, args.output_topic, args.window, late_sink["topic"], args.checkpoint, args.run_id)
        return queries

    serve_stage_metrics(spark, args, log)
    windows, late = run_queries(start, log, [sink, late_sink], phases=args.log_phases)
    return {"windows": stage_summary(windows, sink), "late": stage_summary(late, late_sink)}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("stage_window", build_parser(), run, argv, check_arguments)


if __name__ == "__main__":
    sys.exit(main())
