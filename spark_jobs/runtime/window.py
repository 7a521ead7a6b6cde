"""``python -m spark_jobs.runtime.window``: intermediate topic -> tumbling windows emitted as soon as the
reconciled watermark passes their end -> the next intermediate topic.

Its own Spark application: one window task per partition of the input topic, each one upstream task of
the output topic, run as long-running Spark tasks (as many as the application has task slots, each
running its share in threads: ``controlmsg.streaming.runtime``; see ``controlmsg.streaming.window``). A task per
partition, as Kafka Streams does: a window's state lives with the one partition its key arrives on, so
the same state serves any number of cores, and a rescale of the upstream ingest (another ``--tasks``)
leaves the window job's tasks as they were (docs/STREAMING.md, "Rescaling").
window results, its own watermarks and finally its end of stream go out in transactions together with
the task's state in a compacted state topic (input offsets and bookkeeping in a header record, and one
record per open window changed since the last commit: docs/STREAMING.md, "Window state"), so a restart
resumes exactly where the last commit left it. Records behind the watermark go to the late topic.
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
    add_partitions_option,
    add_stall_limit_option,
    add_window_options,
    add_window_topic_options,
    job_logger,
    metrics_problems,
    run_job,
    serve_task_metrics,
)
from spark_jobs.events import parse_duration

__all__ = ["build_parser", "check_arguments", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.runtime.window", description=description(__doc__))
    add_window_topic_options(p)
    add_window_options(p)
    add_partitions_option(p)
    p.add_argument("--tasks", type=int, help=argparse.SUPPRESS)  # before tasks were per partition; ignored
    p.add_argument("--commit-interval", default="1s", help="how often results and state are committed")
    p.add_argument("--late-topic", help="default: <output-topic>-late")
    add_stall_limit_option(p)
    add_metrics_option(p)
    p.add_argument("--state-topic", help="default: <output-topic>-state (compacted)")
    p.add_argument("--group-id", metavar="GROUP",
                   help="also commit each task's input offsets to this consumer group at each commit, for lag "
                        "tools (kafka-consumer-groups, Burrow); nothing reads from it")
    add_common_options(p)
    return p


def check_arguments(args: argparse.Namespace) -> list[str]:
    """What can be checked before Spark starts, one line per problem: durations and counts."""
    return (duration_problems([("--window", args.window, False), ("--commit-interval", args.commit_interval, False),
                              ("--stall-limit", args.stall_limit, False)])
            + positive_problems([("--partitions", args.partitions)]) + metrics_problems(args))


def run(spark: SparkSession, args: argparse.Namespace, config: dict[str, str]) -> dict[str, Any]:
    """The job's work in an existing Spark session; returns its summary."""
    from controlmsg.core.naming import task_name, transactional_id
    from controlmsg.kafka.admin import create_topic, topic_settings_from_args
    from controlmsg.streaming import (
        StopChannel,
        partition_groups,
        run_long_running_tasks,
        run_window_task,
        state_topic_config,
    )

    log = job_logger("stream_window")
    owned = [[p] for group in partition_groups(config, args.input_topic, 1, args.timeout) for p in group]
    if args.tasks is not None:
        log.info("--tasks %d is ignored: a window task per input partition (%d)", args.tasks, len(owned))
    topics = topic_settings_from_args(args)
    factor = topics.replication_factor
    create_topic(config, args.output_topic, args.partitions, replication_factor=factor, topic_config=topics.config)
    late_topic = args.late_topic or f"{args.output_topic}-late"
    state_topic = args.state_topic or f"{args.output_topic}-state"
    create_topic(config, late_topic, 1, replication_factor=factor, topic_config=topics.config)
    create_topic(config, state_topic, 1, replication_factor=factor, topic_config=state_topic_config(topics.config))
    stop = StopChannel.open(config, f"{args.output_topic}-stop", replication_factor=factor,
                            topic_config=topics.config)
    window_ms = parse_duration(args.window)
    interval = parse_duration(args.commit_interval) / 1000
    log.info("%d window tasks, one per partition of %s -> %s", len(owned), args.input_topic, args.output_topic)
    input_topic, output_topic, run_id, sums, tasks, group_id = (args.input_topic, args.output_topic, args.run_id,
                                                                tuple(args.sum), len(owned), args.group_id)
    metrics_url = serve_task_metrics(spark, args, "stream_window")

    def body(i: int, stopped: Callable[[], bool]) -> dict[str, Any]:
        summary = run_window_task(
            config, input_topic=input_topic, partitions=owned[i], run_id=run_id, output_topic=output_topic,
            late_topic=late_topic, state_topic=state_topic, task_index=i, task_count=tasks, window_ms=window_ms,
            sums=sums, commit_interval_s=interval, stop=stopped, metrics_url=metrics_url, group_id=group_id)
        return asdict(summary)

    # Fenced if the tasks must be cancelled during a stop (their open transactions are aborted at once).
    ids = [transactional_id(output_topic, task_name("window", run_id, i)) for i in range(tasks)]
    summaries = run_long_running_tasks(spark, tasks, body, stop, transactional_ids=ids,
                                       stall_limit_s=parse_duration(args.stall_limit) / 1000)
    log.info("tasks ended: %s", summaries)
    return {"tasks": summaries}


def main(argv: Sequence[str] | None = None) -> int:
    return run_job("stream_window", build_parser(), run, argv, check_arguments, task_attempts=STREAMING_TASK_ATTEMPTS)


if __name__ == "__main__":
    sys.exit(main())
