"""``python -m spark_jobs.runtime.ingest``: an unbounded raw source topic -> an intermediate topic.

Its own Spark application: ``--tasks K`` long-running Spark tasks, each owning some partitions of the raw
source topic (JSON objects with the fields a file input has) and each one upstream task of the
intermediate topic. See ``controlmsg.streaming.ingest`` for what a task does (exactly once per commit
interval: records, rejects, its watermark and its source offsets in one transaction). With
``--until-source-end`` the end offsets of the source at start are the end of the input: every task writes
its end of stream when it gets there, and the job ends.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs import description
from spark_jobs.checks import duration_problems, positive_problems
from spark_jobs.common import (
    STREAMING_TASK_ATTEMPTS,
    add_common_options,
    add_metrics_option,
    add_stall_limit_option,
    job_logger,
    metrics_problems,
    run_job,
    serve_task_metrics,
)
from spark_jobs.events import parse_duration

__all__ = ["build_parser", "check_arguments", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.runtime.ingest", description=description(__doc__))
    p.add_argument("--source-topic", required=True, help="raw events, one JSON object per record")
    p.add_argument("--topic", required=True, help="the intermediate topic to write")
    p.add_argument("--key", required=True)
    p.add_argument("--event-time", required=True)
    p.add_argument("--carry", action="append", default=[], help="a field to carry (repeatable; default: all)")
    p.add_argument("--partitions", type=int, default=4, help="intermediate topic partitions (created if missing)")
    p.add_argument("--tasks", type=int, default=2, help="upstream tasks (at most the source's partitions)")
    p.add_argument("--allowed-lateness", default="0s")
    p.add_argument("--watermark-interval", default="1s", help="watermark and commit interval")
    p.add_argument("--idle-timeout", default="10s",
                   help="a source partition at its end that gives nothing this long is idle and stops holding the "
                        "watermark back (docs/PROTOCOL.md); 'never' to wait for it forever")
    p.add_argument("--max-rate", type=float, help="read at most this many source records/s per task (default: "
                   "no limit); replays a backlog gently")
    p.add_argument("--until-source-end", action="store_true",
                   help="end the stream at the source's end offsets taken at start")
    add_stall_limit_option(p)
    add_metrics_option(p)
    p.add_argument("--rejects-topic", help="default: <topic>-rejects")
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: durations and counts."""
    durations = [("--allowed-lateness", args.allowed_lateness, True),
                 ("--watermark-interval", args.watermark_interval, False),
                 ("--stall-limit", args.stall_limit, False)]
    if args.idle_timeout.strip().lower() != "never":
        durations.append(("--idle-timeout", args.idle_timeout, False))
    return (duration_problems(durations) + metrics_problems(args) + positive_problems(
        [("--partitions", args.partitions), ("--tasks", args.tasks), ("--max-rate", args.max_rate)]))


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    from controlmsg.core.naming import task_name, transactional_id
    from controlmsg.kafka.admin import create_topic, end_offsets, topic_settings_from_args
    from controlmsg.kafka.writer import fence_transactions
    from controlmsg.streaming import (
        StopChannel,
        committed_source_state,
        partition_groups,
        plan_generation,
        run_ingest_task,
        run_long_running_tasks,
        source_group,
    )

    log = job_logger("stream_ingest")
    owned = partition_groups(config, args.source_topic, args.tasks, args.timeout)
    topics = topic_settings_from_args(args)
    create_topic(config, args.topic, args.partitions, replication_factor=topics.replication_factor,
                 topic_config=topics.config)
    rejects_topic = args.rejects_topic or f"{args.topic}-rejects"
    create_topic(config, rejects_topic, 1, replication_factor=topics.replication_factor,
                 topic_config=topics.config)
    stop = StopChannel.open(config, f"{args.topic}-stop", replication_factor=topics.replication_factor,
                            topic_config=topics.config)
    until = end_offsets(config, args.source_topic) if args.until_source_end else None
    lateness = parse_duration(args.allowed_lateness) if args.allowed_lateness.strip() not in ("0", "0s") else 0
    interval = parse_duration(args.watermark_interval) / 1000
    idle_timeout = None if args.idle_timeout == "never" else parse_duration(args.idle_timeout) / 1000
    states = committed_source_state(config, args.source_topic, source_group(args.topic, args.run_id),
                                    sorted(p for group in owned for p in group))
    generation, retired = plan_generation(states, owned)
    if retired is not None:  # a new layout: nothing of the old tasks may commit once the new ones write
        log.info("rescaling run %s: generation %d of %d tasks replaces %d tasks; fencing the old ones",
                 args.run_id, generation, args.tasks, retired)
        fence_transactions(config, [transactional_id(args.topic, task_name("ingest", args.run_id, i))
                                    for i in range(retired)])
    log.info("%d tasks (generation %d) over source partitions %s -> %s (%s)", args.tasks, generation, owned,
             args.topic, f"until offsets {until}" if until is not None else "unbounded")
    source, topic, run_id, key, event_time = args.source_topic, args.topic, args.run_id, args.key, args.event_time
    carry, tasks, max_rate = tuple(args.carry), args.tasks, args.max_rate
    metrics_url = serve_task_metrics(spark, args, "stream_ingest")

    def body(i: int, stopped: Callable[[], bool]) -> dict[str, Any]:
        summary = run_ingest_task(
            config, source_topic=source, source_partitions=owned[i], output_topic=topic,
            rejects_topic=rejects_topic, run_id=run_id, task_index=i, task_count=tasks, key_field=key,
            event_time_field=event_time, carry=carry, allowed_lateness_ms=lateness, watermark_interval_s=interval,
            until=until, idle_timeout_s=idle_timeout, max_rate=max_rate, stop=lambda _records: stopped(),
            generation=generation, metrics_url=metrics_url)
        return asdict(summary)

    ids = [transactional_id(topic, task_name("ingest", run_id, i)) for i in range(tasks)]
    summaries = run_long_running_tasks(spark, tasks, body, stop, transactional_ids=ids,
                                       stall_limit_s=parse_duration(args.stall_limit) / 1000)
    records = sum(s["records"] for s in summaries)
    rejected = sum(s["rejects"] for s in summaries)
    log.info("%d records written, %d rejected (in %s)", records, rejected, rejects_topic)
    ends = [s["ended_at"] for s in summaries if s["ended_at"] is not None]
    return {"rows_in": records + rejected, "rows_out": records, "rejects": rejected, "tasks": summaries,
            "generation": generation,
            "eos_written_at": max(ends) if len(ends) == len(summaries) else None}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("stream_ingest", build_parser(), run, argv, check_arguments, task_attempts=STREAMING_TASK_ATTEMPTS)


if __name__ == "__main__":
    sys.exit(main())
