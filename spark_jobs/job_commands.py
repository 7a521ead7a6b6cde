"""The command line of each job that ``python -m spark_jobs.pipeline windowed-count`` runs
(:mod:`spark_jobs.pipeline`): its module, its arguments made from the pipeline's, and the client settings it
reads from a file only this user can read. For whoever starts the jobs one by one as the pipeline would (the
soak benchmark, the restart tests, a cluster manager that owns the drivers).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Final

from controlmsg.kafka.admin import topic_settings_from_args
from controlmsg.kafka.settings import write_properties
from spark_jobs.checks import parquet_number_types, typed_sums
from spark_jobs.common import topic_names

__all__ = ["JOB_MODULES", "declared_sums", "job_args", "write_client_config"]

JOB_MODULES: Final = {
    "ingest": "spark_jobs.batch.ingest", "window_aggregate": "spark_jobs.batch.window_aggregate",
    "sink": "spark_jobs.batch.sink", "stream_ingest": "spark_jobs.runtime.ingest",
    "stream_window": "spark_jobs.runtime.window", "stream_sink": "spark_jobs.runtime.sink",
}
"""The module (``python -m``) of each job the pipeline runs, by the job's name (its log, summary and
transactional ids keep that name)."""


def write_client_config(config: dict[str, str], run_dir: Path) -> Path:
    """The resolved client settings, for the jobs, in a file only this user can read: settings may hold
    secrets, which must not show on a command line (``ps``). Removed when the pipeline ends."""
    return write_properties(config, run_dir / "kafka.properties",
                            "the Kafka client settings of this pipeline run (removed when it ends)")


def job_args(job: str, args: argparse.Namespace, kafka_file: Path, run_id: str, run_dir: Path) -> list[str]:
    """The command line (``python -m`` its module, :data:`JOB_MODULES`) that runs ``job`` of the pipeline
    ``args`` (:func:`spark_jobs.pipeline.build_parser`'s) for run ``run_id``: its client settings from
    ``kafka_file``, its summary and error log in ``run_dir``, and ``--parent-pid`` this process. For whoever
    starts the jobs one by one as the pipeline would (the soak benchmark, the restart tests)."""
    events, windows = topic_names(run_id)
    kafka = ["--kafka-config", str(kafka_file)]
    common = [*kafka, "--run-id", run_id, "--master", args.master, "--parent-pid", str(os.getpid()),
              "--summary", str(run_dir / f"{job}.json"), "--timeout", str(args.timeout),
              "--log-file", str(run_dir / f"{job}-error.log"), *topic_settings_from_args(args).as_args()]
    for setting in args.spark_conf:
        common += ["--spark-conf", setting]
    typed = [name if typ is None else f"{name}:{typ}" for name, typ in declared_sums(args).items()]
    sums = [x for col in (args.sum if args.streaming else typed) for x in ("--sum", col)]
    carry = [x for c in typed for x in ("--carry", c)]
    # The writing jobs get the pipeline's --run-tag (default envelope: each record names its run at no cost to the
    # write, docs/PROTOCOL.md "Wire format 2", though no other run's records can be in the topics named after its run).
    if job == "ingest":
        extra = ["--input", args.input, "--key", args.key, "--event-time", args.event_time, "--topic", events,
                 "--partitions", str(args.partitions), "--tasks", str(args.tasks),
                 "--rejects", f"{args.output}.rejects.jsonl", "--run-tag", args.run_tag, *carry]
        if args.null_value is not None:
            extra += ["--null-value", args.null_value]
    elif job == "stream_ingest":
        extra = ["--source-topic", args.source_topic, "--key", args.key, "--event-time", args.event_time,
                 "--topic", events, "--partitions", str(args.partitions), "--tasks", str(args.tasks),
                 "--allowed-lateness", args.allowed_lateness, "--watermark-interval", args.watermark_interval,
                 "--idle-timeout", args.idle_timeout, "--stall-limit", args.stall_limit, *carry]
        if args.max_rate is not None:
            extra += ["--max-rate", str(args.max_rate)]
        if args.until_source_end:
            extra.append("--until-source-end")
    elif job == "window_aggregate":
        extra = ["--input-topic", events, "--output-topic", windows, "--window", args.window,
                 "--partitions", str(args.partitions), "--tasks", str(args.tasks), "--run-tag", args.run_tag, *sums]
        if args.commit_rows is not None:
            extra += ["--commit-rows", str(args.commit_rows)]
    elif job == "stream_window":  # a window task per partition of the events topic: no --tasks
        extra = ["--input-topic", events, "--output-topic", windows, "--window", args.window,
                 "--partitions", str(args.partitions), "--commit-interval", args.watermark_interval,
                 "--stall-limit", args.stall_limit, *sums]
    elif job == "stream_sink":  # no Spark application: one process appends to the one output file
        return [sys.executable, "-m", JOB_MODULES[job], "--input-topic", windows, "--output", args.output,
                *sums, *kafka, "--run-id", run_id, "--summary", str(run_dir / f"{job}.json"),
                "--timeout", str(args.timeout), "--parent-pid", str(os.getpid())]
    else:
        extra = ["--input-topic", windows, "--output", args.output, *sums]
    return [sys.executable, "-m", JOB_MODULES[job], *extra, *common]


def declared_sums(args: argparse.Namespace) -> dict[str, str | None]:
    """Each ``--sum`` column with its type: as declared on the command line (``COL:TYPE``), else as a
    Parquet input's footers tell (:func:`~spark_jobs.checks.parquet_number_types`), else ``None`` (the
    jobs take it from the data)."""
    sums = typed_sums(args.sum)
    if args.input is not None:
        sums.update(parquet_number_types(args.input, [name for name, typ in sums.items() if typ is None]))
    return sums
