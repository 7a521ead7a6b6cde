"""``python -m spark_jobs.pipeline windowed-count``: ingest -> window_aggregate -> sink, three separate
Spark applications joined by two intermediate topics, that terminates by itself.

The three jobs are started as separate processes (each its own Spark application, each in its own
session and process group: :class:`controlmsg.clusters.job_group.JobGroup`), by default downstream first (sink,
window_aggregate, ingest) to show that a reader waits for its upstream; the two downstream jobs run
``--nice-step`` CPU priority levels below ingest (their process groups and scheduling autogroups), so that
the job the others wait for gets shared cores first (see :mod:`spark_jobs.pipeline_run`). The pipeline exits
0 once the sink has written the complete result, 1 with the failing job's log tail if any job fails (the others
are then stopped). Each job's log goes to ``<run dir>/<job>.log`` (appended to: a restart keeps the
stopped run's lines); the jobs' own progress lines are echoed to stderr.

Stopping (:data:`EXIT_STATUS`): on SIGTERM or SIGINT the pipeline sends SIGTERM to every job still
running (the job's own process: it stops its tasks at a commit, see :mod:`controlmsg.streaming.stopping`), waits
at most :data:`~spark_jobs.pipeline_run.JOB_STOP_GRACE_S` for them, SIGKILLs the process group of any job left,
and exits 128 + the signal. A failed job or the timeout stops the others the same way. The jobs get
``--parent-pid``: if the pipeline itself is killed (``kill -9``), they stop on their own.

With ``--streaming`` the chain is stream_ingest -> stream_window (long-running Spark applications) ->
stream_sink (one plain process appending each window result to the output as soon as it is readable);
see docs/STREAMING.md.

Each job's command line (to start the jobs one by one as the pipeline would) is :mod:`spark_jobs.job_commands`;
how the jobs are run, stopped and reported, :mod:`spark_jobs.pipeline_run`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.kafka.admin import add_topic_options, create_topic, topic_settings_from_args
from controlmsg.kafka.settings import STARTS_LOCAL_BROKER_HELP, add_client_options
from spark_jobs import description
from spark_jobs.checks import (
    duration_problems,
    input_problems,
    output_problems,
    positive_problems,
    sum_problems,
    topic_problems,
    typed_sums,
)
from spark_jobs.common import add_partitions_option, add_stall_limit_option, add_window_options, topic_names
from spark_jobs.job_commands import JOB_MODULES, declared_sums, job_args, write_client_config
from spark_jobs.pipeline_run import report_ending, report_run, run_jobs

# The jobs' command lines stay importable from here (docs/OPERATIONS.md and docs/SOAK.md name them with it).
__all__ = ["JOB_MODULES", "declared_sums", "job_args", "main"]

EXIT_STATUS: Final = ("exit status: 0 the output is complete; 1 a job failed or --timeout passed (the others are "
                      "stopped; the failed job and its log are named); 2 bad arguments; 143 stopped by SIGTERM, "
                      "130 by SIGINT (Ctrl-C): every job was sent SIGTERM and stopped at a commit (nothing partial "
                      "is readable), and the same command with --run-id resumes the run where it stopped (a stop "
                      "takes a few seconds; a job still running 20 s after its SIGTERM is SIGKILLed). A second "
                      "signal SIGKILLs the jobs at once (still nothing partial: a restart aborts what was open)")
_JOBS = ("ingest", "window_aggregate", "sink")
_STREAMING_JOBS = ("stream_ingest", "stream_window", "stream_sink")

STREAMING_ONLY: Final = ("--until-source-end", "--watermark-interval", "--idle-timeout", "--stall-limit",
                          "--max-rate")
"""The options only the streaming chain (``--streaming``) takes; the bounded pipeline refuses them."""
BOUNDED_ONLY: Final = ("--null-value", "--commit-rows", "--run-tag")
"""The options only the bounded pipeline (``--input``) takes; ``--streaming`` refuses them."""


class _OnlyIn(argparse.Action):
    """Stores an option of one chain only, and notes it given (``args.given``), so that the other chain can
    refuse it instead of ignoring it. ``nargs=0`` makes it a flag that stores ``const``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = [*getattr(namespace, "given", []), option_string]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.pipeline", description=description(__doc__))
    sub = parser.add_subparsers(dest="pipeline", required=True)
    p = sub.add_parser("windowed-count", help="count (and sum) per key and tumbling event-time window")
    p.add_argument("--input", help="CSV, JSON lines or Parquet file (by extension); the bounded pipeline")
    p.add_argument("--streaming", action="store_true",
                   help="read --source-topic with long-running streaming jobs; windows are emitted as soon as "
                        "the reconciled watermark passes their end")
    p.add_argument("--source-topic", help="with --streaming: raw events, one JSON object per record")
    p.add_argument("--until-source-end", action=_OnlyIn, nargs=0, const=True, default=False,
                   help="with --streaming: the source's end offsets at start end the input; the chain then stops")
    p.add_argument("--watermark-interval", default="1s", action=_OnlyIn,
                   help="with --streaming: watermark and commit interval")
    p.add_argument("--allowed-lateness", default="0s", help="watermark = event-time progress minus this")
    p.add_argument("--idle-timeout", default="10s", action=_OnlyIn,
                   help="with --streaming: a quiet source partition stops holding the watermark back after this "
                        "('never': it holds it until it gives records again)")
    add_stall_limit_option(p, help_prefix="with --streaming: ", action=_OnlyIn)
    p.add_argument("--max-rate", type=float, action=_OnlyIn,
                   help="with --streaming: read at most this many source records/s per ingest task")
    p.add_argument("--key", required=True)
    p.add_argument("--event-time", required=True)
    add_window_options(p)
    p.add_argument("--output", required=True, help="CSV, JSON lines or Parquet file (by extension)")
    p.add_argument("--null-value", action=_OnlyIn, help="the bounded pipeline: CSV token read as null")
    add_partitions_option(p)
    p.add_argument("--tasks", type=int, default=2,
                   help="upstream write tasks of each writing job (streaming: of the ingest, which may change "
                        "between starts of a run; the window job runs a task per partition)")
    add_topic_options(p)
    add_client_options(p, bootstrap_help=STARTS_LOCAL_BROKER_HELP)
    p.add_argument("--commit-rows", type=int, action=_OnlyIn,
                   help="the bounded pipeline's window job commits about every this many results, so that the sink "
                        "reads them as they come (default: the window job's, 50000)")
    p.add_argument("--run-tag", choices=("envelope", "headers", "none"), default="envelope", action=_OnlyIn,
                   help="the bounded pipeline: how the records of its two topics name the run (the writers' runTag; "
                        "default envelope, at no cost: docs/PROTOCOL.md, \"Wire format 2\")")
    p.add_argument("--run-id", help="pipeline run id (generated when absent)")
    p.add_argument("--master", default="local[*]", help="Spark master for every job (default local[*])")
    p.add_argument("--timeout", type=float, default=600.0, help="fail if the pipeline has not ended after SECONDS")
    p.add_argument("--start-order", default="sink,window,ingest",
                   help="the order the jobs (ingest, window, sink) are started in (comma-separated)")
    p.add_argument("--nice-step", type=int, default=12, metavar="N",
                   help="the bounded pipeline runs window_aggregate and sink N nice levels below ingest, so that "
                        "where the jobs share cores the job the others wait for gets them first and the waiting "
                        "ones take what it leaves (default 12; 0: all alike; the streaming chain: all alike)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for every job (repeatable)")
    p.add_argument("--run-dir", help="logs and summaries (default: .controlmsg/runs/<run id>)")
    p.epilog = EXIT_STATUS
    return parser


def check_arguments(args: argparse.Namespace) -> list[str]:
    """Everything that can be checked before a Spark application starts, as one line per problem:
    durations, counts, the input (exists, not empty, has the columns named), the output (a known format,
    in a directory that can be written). The checks are :mod:`spark_jobs.checks`, shared with the jobs."""
    durations = [("--window", args.window, False), ("--allowed-lateness", args.allowed_lateness, True),
                 ("--watermark-interval", args.watermark_interval, False),
                 ("--stall-limit", args.stall_limit, False)]
    if args.idle_timeout.strip().lower() != "never":
        durations.append(("--idle-timeout", args.idle_timeout, False))
    problems = duration_problems(durations)
    others = BOUNDED_ONLY if args.streaming else STREAMING_ONLY
    for option in sorted(set(getattr(args, "given", [])) & set(others), key=others.index):
        problems.append(f"{option} is for the streaming chain (--streaming); the bounded pipeline (--input) "
                        "would ignore it" if option in STREAMING_ONLY else
                        f"{option} is for the bounded pipeline (--input); the streaming chain (--streaming) "
                        "would ignore it")
    problems += positive_problems([("--partitions", args.partitions), ("--tasks", args.tasks),
                                   ("--timeout", args.timeout), ("--max-rate", args.max_rate),
                                   ("--commit-rows", args.commit_rows)])
    problems += topic_problems(args)
    if not 0 <= args.nice_step <= 19:
        problems.append(f"--nice-step must be between 0 and 19 (nice levels), not {args.nice_step}")
    sum_errors = sum_problems("--sum", args.sum)
    problems += sum_errors
    if not sum_errors and args.streaming and any(typed_sums(args.sum).values()):
        problems.append("--sum COL:TYPE: a declared type is for the bounded pipeline (--input); the streaming "
                        "chain sums each value as the number it is")
    if args.input is not None and not sum_errors:
        wanted = [("--key", args.key), ("--event-time", args.event_time), *[("--sum", c) for c in typed_sums(args.sum)]]
        problems += input_problems("--input", args.input, wanted)
    problems += output_problems("--output", args.output)
    return problems


def run_windowed_count(args: argparse.Namespace) -> int:
    """The pipeline ``args`` asks for (:func:`build_parser`'s), to its end: checks the arguments (exit 2),
    creates the run's topics, starts the jobs (:func:`~spark_jobs.pipeline_run.run_jobs`), then reports how
    they ended (:func:`~spark_jobs.pipeline_run.report_ending`: a stop by signal, a failure or the timeout)
    or, when the output is complete, the run's figures (:func:`~spark_jobs.pipeline_run.report_run`, exit 0).
    Blocks."""
    from controlmsg.kafka.settings import client_config_from_args

    problems = check_arguments(args)
    if problems:
        for problem in problems:
            print(f"pipeline: {problem}", file=sys.stderr)
        return 2
    chain = _STREAMING_JOBS if args.streaming else _JOBS
    order = _start_order(args, chain)
    if isinstance(order, str):
        print(order, file=sys.stderr)
        return 2
    run_id = args.run_id or uuid.uuid4().hex[:10]
    config = client_config_from_args(args, default_servers=lambda: local_bootstrap_servers(start=True))
    run_dir = Path(args.run_dir or Path(".controlmsg") / "runs" / run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    topics = topic_settings_from_args(args)
    for topic in topic_names(run_id):
        create_topic(config, topic, args.partitions, replication_factor=topics.replication_factor,
                     topic_config=topics.config)
    kafka_file = write_client_config(config, run_dir)
    print(f"run {run_id}: {args.input or args.source_topic} -> {', '.join(topic_names(run_id))} -> {args.output}; "
          f"logs in {run_dir}", file=sys.stderr)

    started = time.monotonic()
    # Each job in its own session and process group: a Ctrl-C in the terminal reaches the pipeline only,
    # which stops the jobs in order (see spark_jobs.pipeline_run.JOB_STOP_GRACE_S).
    jobs = JobGroup(run_dir, env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)})
    ending = run_jobs(args, order, jobs, kafka_file, run_id, run_dir, started)
    code = report_ending(args, ending, jobs, run_id, run_dir)
    if code is not None:
        return code
    report_run(args, chain, jobs, run_id, run_dir, started)
    return 0


def _start_order(args: argparse.Namespace, chain: tuple[str, ...]) -> list[str] | str:
    """The jobs of ``chain`` in the order ``--start-order`` names their roles, or the line that refuses
    the arguments: neither or both of the two inputs, a streaming output that cannot be appended to, an
    order that does not name each role once. Pure."""
    if args.streaming != (args.source_topic is not None) or args.streaming == (args.input is not None):
        return "give --input FILE (bounded), or --streaming --source-topic TOPIC"
    if args.streaming and not args.output.lower().endswith((".csv", ".json", ".jsonl", ".ndjson")):
        return "--streaming appends results as windows close: give a .csv or .jsonl --output"
    roles = dict(zip(("ingest", "window", "sink"), chain, strict=True))
    try:
        order = [roles[j.strip()] for j in args.start_order.split(",")]
    except KeyError:
        order = []
    if sorted(order) != sorted(chain):
        return "--start-order must name each of ingest, window, sink once"
    return order



def main(argv: Sequence[str] | None = None) -> int:
    from controlmsg.errors import ControlMsgError

    args = build_parser().parse_args(argv)
    try:
        return run_windowed_count(args)
    except ControlMsgError as exc:  # the cluster cannot be reached or set up: one line, no trace
        print(f"pipeline: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
