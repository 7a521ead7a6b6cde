"""``python -m spark_jobs.stages.ingest``: a plain source topic -> an intermediate topic, as one ordinary
Structured Streaming query.

The first stage of the example streaming chain on the public API (:func:`ingest_query` is all of it):
``readStream.format("controlmsg")`` reads the raw events as any producer wrote them (``envelope none``,
a JSON object per record), each parsed with a schema whose key and event time are ``NOT NULL``, with a
watermark per source partition (its largest event time minus ``--allowed-lateness``, the minimum over the
partitions not idle for ``--idle-timeout``: the read's ``maxOutOfOrderness`` and ``idleTimeout``) that
:func:`controlmsg.spark.with_watermark` follows, keeping late records (``keep_late``: counted, passed on,
and judged late by the next stage against the watermark it read before them);
``writeStream.format("controlmsg")`` writes ``{"key", "event_ms", <carried fields>}`` keyed by the key,
and after each micro-batch the watermark its reads reached to every partition (not Spark's, which lags a
micro-batch behind: the events topic learns it one ingest micro-batch sooner). A record that does not fit
(not JSON, no key, an event time that is not ISO-8601) goes to ``<topic>-rejects`` with the reason and its
source partition and offset in headers: never dropped.

Runs until stopped (SIGTERM: the query stops between micro-batches; ``kill -9``: Spark's checkpoint under
``--checkpoint`` and the writer's transactions resume it, nothing twice). With ``--until-source-end`` the
query runs ``availableNow``: it reads what the source holds when it starts, and its run ends there (the
writer's end of stream, by itself). The number of reading tasks may change between runs (``--tasks``):
the driver is the one upstream task of the protocol.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs import description
from spark_jobs.checks import duration_problems, positive_problems
from spark_jobs.common import add_common_options, controlmsg_options, job_logger, metrics_problems, run_job
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
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["build_parser", "ingest_query", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.stages.ingest", description=description(__doc__))
    p.add_argument("--source-topic", required=True, help="raw events, one JSON object per record")
    p.add_argument("--topic", required=True, help="the intermediate topic to write")
    p.add_argument("--key", required=True)
    p.add_argument("--event-time", required=True, help="an ISO-8601 timestamp field")
    p.add_argument("--carry", action="append", default=[], metavar="FIELD[:TYPE]",
                   help="a field to carry (repeatable); TYPE a Spark SQL type, default double")
    p.add_argument("--allowed-lateness", default="0s",
                   help="how far behind its source partition's largest event time a record may come (the "
                        "read's maxOutOfOrderness)")
    p.add_argument("--idle-timeout", default="10s",
                   help="a source partition without records for so long stops holding the watermark back")
    p.add_argument("--partitions", type=int, default=4, help="intermediate topic partitions (created if missing)")
    p.add_argument("--tasks", type=int, help="reading tasks (default: Spark's parallelism)")
    p.add_argument("--until-source-end", action="store_true",
                   help="availableNow: read what the source holds at start, then end the stream")
    add_stage_options(p)
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    return (duration_problems([("--allowed-lateness", args.allowed_lateness, True),
                               ("--idle-timeout", args.idle_timeout, False)])
            + positive_problems([("--partitions", args.partitions), ("--tasks", args.tasks)]) + metrics_problems(args))


def ingest_query(spark: SparkSession, source: dict[str, str], sink: dict[str, str], *, key: str,
                 event_time: str, carry: dict[str, str], allowed_lateness: str, idle_timeout: str, checkpoint: str,
                 trigger: dict[str, Any]) -> StreamingQuery:
    """The stage: plain ``source`` options in, ``sink`` options out (both ``format("controlmsg")``)."""
    from pyspark.sql import functions as F

    from controlmsg.spark import with_watermark

    fields = ", ".join(f"`{name}` {typ}" for name, typ in carry.items())
    read: DataFrame = (
        spark.readStream.format("controlmsg").options(**source).option("envelope", "none")
        .option("eventTimeField", event_time).option("maxOutOfOrderness", allowed_lateness)
        .option("idleTimeout", idle_timeout)
        .schema(f"`{key}` string not null, `{event_time}` timestamp not null" + (f", {fields}" if fields else ""))
        .load()
    )
    # The watermark per source partition; late records are passed on (and counted), and the next stage judges
    # them against the watermark this one forwards after each micro-batch.
    events = (with_watermark(read, event_time, metrics_name="ingest", keep_late=True)
              .select(F.col(key).alias("key"), F.unix_millis(F.col(event_time)).alias("event_ms"), *carry))
    return (events.writeStream.format("controlmsg").options(**sink)
            .option("checkpointLocation", checkpoint).trigger(**trigger).start())


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    from controlmsg.kafka.admin import create_topic, topic_settings_from_args
    from spark_jobs.events import parse_duration

    log = job_logger("stage_ingest")
    settings = topic_settings_from_args(args)
    rejects = f"{args.topic}-rejects"
    create_topic(config, rejects, 1, replication_factor=settings.replication_factor, topic_config=settings.config)
    source = controlmsg_options(args, config, args.source_topic, deadLetterTopic=rejects,
                                maxTasks=str(args.tasks or spark.sparkContext.defaultParallelism),
                                availableNowEnds="true", maxOffsetsPerTrigger=args.max_offsets_per_trigger)
    sink = controlmsg_options(args, config, args.topic, job="stage_ingest", key="key", eventTime="event_ms",
                              allowedLateness=args.allowed_lateness, partitions=str(args.partitions),
                              **stage_progress(args.checkpoint), **phase_options(args))
    trigger = {"availableNow": True} if args.until_source_end else {"processingTime": args.trigger_interval}
    delay_ms = parse_duration(args.allowed_lateness) if args.allowed_lateness.strip() not in ("0", "0s") else 0

    def start() -> list[StreamingQuery]:
        query = ingest_query(spark, source, sink, key=args.key, event_time=args.event_time,
                             carry=sum_fields(args.carry), allowed_lateness=f"{delay_ms}ms",
                             idle_timeout=args.idle_timeout,
                             checkpoint=args.checkpoint, trigger=trigger)
        log.info("query started: %s -> %s (%s), checkpoint %s, run %s", args.source_topic, args.topic,
                 "until the source's end" if args.until_source_end else f"every {args.trigger_interval}",
                 args.checkpoint, args.run_id)
        return [query]

    serve_stage_metrics(spark, args, log)
    (query,) = run_queries(start, log, [sink], phases=args.log_phases)
    return stage_summary(query, sink)


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("stage_ingest", build_parser(), run, argv, check_arguments)


if __name__ == "__main__":
    sys.exit(main())
