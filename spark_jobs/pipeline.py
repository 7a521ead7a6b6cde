"""``python -m spark_jobs.pipeline windowed-count``: ingest -> window_aggregate -> sink, three separate
Spark applications joined by two intermediate topics, that terminates by itself.

The three jobs are started as separate processes (each its own Spark application, each in its own
session and process group: :class:`controlmsg.clusters.jobs.JobGroup`), by default downstream first (sink,
window_aggregate, ingest) to show that a reader waits for its upstream; the two downstream jobs run
``--nice-step`` CPU priority levels below ingest (their process groups and scheduling autogroups), so that
the job the others wait for gets shared cores first (see :data:`_NICE_STEPS`). The pipeline exits 0 once
the sink has written the complete result, 1 with the failing job's log tail if any job fails (the others
are then stopped). Each job's log goes to ``<run dir>/<job>.log`` (appended to: a restart keeps the
stopped run's lines); the jobs' own progress lines are echoed to stderr.

Stopping (:data:`EXIT_STATUS`): on SIGTERM or SIGINT the pipeline sends SIGTERM to every job still
running (the job's own process: it stops its tasks at a commit, see :mod:`controlmsg.streaming.stopping`), waits
at most :data:`JOB_STOP_GRACE_S` for them, SIGKILLs the process group of any job left, and exits 128 +
the signal. A failed job or the timeout stops the others the same way. The jobs get ``--parent-pid``:
if the pipeline itself is killed (``kill -9``), they stop on their own.

With ``--streaming`` the chain is stream_ingest -> stream_window (long-running Spark applications) ->
stream_sink (one plain process appending each window result to the output as soon as it is readable);
see docs/STREAMING.md.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import orjson

from controlmsg.clusters.jobs import Job, JobGroup
from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.kafka.admin import add_topic_options, create_topic, topic_settings_from_args
from controlmsg.kafka.settings import STARTS_LOCAL_BROKER_HELP, add_client_options, write_properties
from controlmsg.streaming import exit_code, signal_name
from spark_jobs import description
from spark_jobs.checks import (
    duration_problems,
    input_problems,
    output_problems,
    parquet_number_types,
    positive_problems,
    sum_problems,
    topic_problems,
    typed_sums,
)
from spark_jobs.common import add_partitions_option, add_stall_limit_option, add_window_options, topic_names

__all__ = ["JOB_MODULES", "declared_sums", "job_args", "main"]

JOB_STOP_GRACE_S: Final = 20.0
"""Seconds a job has to stop after the pipeline's SIGTERM before its process group is SIGKILLed (a job
bounds its own stop at 15 s, see :data:`controlmsg.streaming.stopping.HARD_LIMIT_S`)."""
EXIT_STATUS: Final = ("exit status: 0 the output is complete; 1 a job failed or --timeout passed (the others are "
                      "stopped; the failed job and its log are named); 2 bad arguments; 143 stopped by SIGTERM, "
                      "130 by SIGINT (Ctrl-C): every job was sent SIGTERM and stopped at a commit (nothing partial "
                      "is readable), and the same command with --run-id resumes the run where it stopped (a stop "
                      "takes a few seconds; a job still running 20 s after its SIGTERM is SIGKILLed). A second "
                      "signal SIGKILLs the jobs at once (still nothing partial: a restart aborts what was open)")
_JOBS = ("ingest", "window_aggregate", "sink")
_STREAMING_JOBS = ("stream_ingest", "stream_window", "stream_sink")
JOB_MODULES: Final = {
    "ingest": "spark_jobs.batch.ingest", "window_aggregate": "spark_jobs.batch.window_aggregate",
    "sink": "spark_jobs.batch.sink", "stream_ingest": "spark_jobs.runtime.ingest",
    "stream_window": "spark_jobs.runtime.window", "stream_sink": "spark_jobs.runtime.sink",
}
"""The module (``python -m``) of each job the pipeline runs, by the job's name (its log, summary and
transactional ids keep that name)."""
# How many --nice-step levels below ingest each bounded job runs: the job the others wait for gets shared cores
# first; the sink shares the window job's level, as its readers block in poll until the window job commits
# (measured: docs/PERFORMANCE.md, "The pipeline's nice levels").
_NICE_STEPS: Final = {"ingest": 0, "window_aggregate": 1, "sink": 1}
# Once its input has ended the window job drops to nice 19, under the sink, which then reads its chunks as
# they commit: the last hop is the last chunk (docs/PERFORMANCE.md, "The last hop: chunked commits").
_WINDOW_INPUT_ENDED: Final = b" window_aggregate: input ended"
_WINDOW_WRITING_NICE: Final = 19
_OWN_LINE = re.compile(
    rb"^\d\d:\d\d:\d\d (ingest|window_aggregate|sink|stream_ingest|stream_window|stream_sink|reader|writer)\b")


def _own_line(line: bytes) -> bool:
    """The jobs' own progress lines, echoed to the pipeline's stderr (the rest only goes to their logs)."""
    return _OWN_LINE.match(line) is not None


STREAMING_ONLY: Final = ("--until-source-end", "--watermark-interval", "--idle-timeout", "--stall-limit",
                          "--max-rate")
"""The options only the streaming chain (``--streaming``) takes; the bounded pipeline refuses them."""
BOUNDED_ONLY: Final = ("--null-value", "--commit-rows")
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


def _write_client_config(config: dict[str, str], run_dir: Path) -> Path:
    """The resolved client settings, for the jobs, in a file only this user can read: settings may hold
    secrets, which must not show on a command line (``ps``). Removed when the pipeline ends."""
    return write_properties(config, run_dir / "kafka.properties",
                            "the Kafka client settings of this pipeline run (removed when it ends)")


def job_args(job: str, args: argparse.Namespace, kafka_file: Path, run_id: str, run_dir: Path) -> list[str]:
    """The command line (``python -m`` its module, :data:`JOB_MODULES`) that runs ``job`` of the pipeline
    ``args`` (:func:`build_parser`'s) for run ``run_id``: its client settings from ``kafka_file``, its
    summary and error log in ``run_dir``, and ``--parent-pid`` this process. For whoever starts the jobs
    one by one as the pipeline would (the soak benchmark, the restart tests)."""
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
    # The writing jobs get --data-headers false: no other run's records can be in the topics the pipeline names
    # after its run, and a run header costs the write (docs/PERFORMANCE.md, "The pipeline's topics, no run header").
    if job == "ingest":
        extra = ["--input", args.input, "--key", args.key, "--event-time", args.event_time, "--topic", events,
                 "--partitions", str(args.partitions), "--tasks", str(args.tasks),
                 "--rejects", f"{args.output}.rejects.jsonl", "--data-headers", "false", *carry]
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
                 "--partitions", str(args.partitions), "--tasks", str(args.tasks), "--data-headers", "false", *sums]
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
    creates the run's topics, starts the jobs (:func:`_run_jobs`), then reports how they ended
    (:func:`_report_ending`: a stop by signal, a failure or the timeout) or, when the output is complete,
    the run's figures (:func:`_report_run`, exit 0). Blocks."""
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
    kafka_file = _write_client_config(config, run_dir)
    print(f"run {run_id}: {args.input or args.source_topic} -> {', '.join(topic_names(run_id))} -> {args.output}; "
          f"logs in {run_dir}", file=sys.stderr)

    started = time.monotonic()
    # Each job in its own session and process group: a Ctrl-C in the terminal reaches the pipeline only,
    # which stops the jobs in order (see JOB_STOP_GRACE_S).
    jobs = JobGroup(run_dir, env={**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)})
    ending = _run_jobs(args, order, jobs, kafka_file, run_id, run_dir, started)
    code = _report_ending(args, ending, jobs, run_id, run_dir)
    if code is not None:
        return code
    _report_run(args, chain, jobs, run_id, run_dir, started)
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


@dataclass(frozen=True)
class _Ending:
    """How the jobs of a run ended (:func:`_run_jobs`): the signals the pipeline got, the job that failed
    (``"timeout"``: the jobs had not ended in time), the exit code of each job the stop found running, and
    when that stop began (``time.monotonic()``)."""

    signals: list[int]
    failed: str | None
    stopped: dict[str, int]
    stopping: float


def _run_jobs(args: argparse.Namespace, order: list[str], jobs: JobGroup, kafka_file: Path, run_id: str,
              run_dir: Path, started: float) -> _Ending:
    """Start the jobs in ``order`` and wait until they end, one fails, a signal comes (SIGTERM, SIGINT; a
    second one SIGKILLs the jobs' groups at once) or ``--timeout`` passes; then stop the jobs still running,
    remove ``kafka_file`` and put the signal handlers back. Blocks."""
    failed: str | None = None
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)
        if len(signals) == 1:
            print(f"{time.strftime('%H:%M:%S')} pipeline: {signal_name(signum)}: stopping the jobs "
                  "(again to kill them at once)", file=sys.stderr, flush=True)
        else:
            jobs.signal(signal.SIGKILL, group=True)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    started_jobs: dict[str, Job] = {}

    def echo(line: bytes) -> bool:
        window = started_jobs.get("window_aggregate")
        if (args.nice_step and window is not None and _WINDOW_INPUT_ENDED in line
                and window.lower_priority(_WINDOW_WRITING_NICE)):
            print(f"{time.strftime('%H:%M:%S')} pipeline: window_aggregate's input ended: it goes down to "
                  f"nice {_WINDOW_WRITING_NICE}, below the sink, which reads its results as they commit",
                  file=sys.stderr, flush=True)
        return _own_line(line)

    try:
        for job in order:
            if signals:
                break
            started_jobs[job] = jobs.start(job, job_args(job, args, kafka_file, run_id, run_dir), echo=echo,
                                           nice=0 if args.streaming else _NICE_STEPS[job] * args.nice_step)
        if not signals:
            codes = jobs.wait(started + args.timeout + 120 - time.monotonic(), stop_when=lambda: bool(signals))
            failed = next((job for job, code in codes.items() if code), None)
            if failed is None and not signals and None in codes.values():
                failed = "timeout"
    finally:
        stopping = time.monotonic()
        try:
            stopped = jobs.stop(0.0 if len(signals) > 1 else JOB_STOP_GRACE_S)
        finally:
            jobs.close()
            kafka_file.unlink(missing_ok=True)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return _Ending(signals, failed, stopped, stopping)


def _report_ending(args: argparse.Namespace, ending: _Ending, jobs: JobGroup, run_id: str,
                   run_dir: Path) -> int | None:
    """Print how a run that did not complete ended and return its exit code: 128 + the signal that
    stopped it, 1 for a failed job (with its log's tail) or the timeout. ``None``: the run completed."""
    failed = ending.failed
    others = ", ".join(f"{job} exit {code}" for job, code in ending.stopped.items() if job != failed)
    if ending.signals:
        print(f"pipeline run {run_id} stopped by {signal_name(ending.signals[0])}: the jobs stopped in "
              f"{time.monotonic() - ending.stopping:.1f} s ({others or 'none was running'}); the same command with "
              f"--run-id {run_id} resumes it; logs in {run_dir}", file=sys.stderr)
        return exit_code(ending.signals[0])
    if failed is not None:
        if failed == "timeout":
            print(f"pipeline run {run_id} did not end within {args.timeout:g} s; logs in {run_dir}", file=sys.stderr)
        else:
            print(f"job {failed} failed (exit {jobs[failed].returncode}); last lines of {run_dir / failed}.log:",
                  file=sys.stderr)
            print(jobs[failed].tail(25, indent="  "), file=sys.stderr)
        if others:
            print(f"stopped the other jobs: {others}; logs in {run_dir}", file=sys.stderr)
        return 1
    return None


def _report_run(args: argparse.Namespace, chain: tuple[str, ...], jobs: JobGroup, run_id: str, run_dir: Path,
                started: float) -> None:
    """Print what a completed run did (from the jobs' summaries: rows, rejects, late records, wall times,
    how soon the end of stream reached the sink) and write it to ``pipeline.json`` in ``run_dir``."""
    summaries: dict[str, Any] = {job: orjson.loads((run_dir / f"{job}.json").read_bytes()) for job in chain}
    ingest, window, sink = (summaries[job] for job in chain)
    # The streaming ingest records when its last end of stream committed; a batch ingest ends right after.
    eos_to_sink = sink["input_ended_at"] - (ingest.get("eos_written_at") or ingest["finished_at"])
    print(f"rows in: {ingest['rows_in']}  rejects: {ingest['rejects']}"
          + (f" (in {ingest['rejects_path']})" if ingest.get("rejects_path") else "")
          + f"  events: {ingest['rows_out']}  windows: {sink['rows_in']}  rows out: {sink['rows_out']}"
          f" -> {args.output}")
    if args.streaming:
        late = sum(t["late"] for t in window["tasks"])
        print(f"late records (behind the watermark, in {topic_names(run_id)[1]}-late): {late}")
    ended = {job: (jobs[job].ended_at or time.monotonic()) - started for job in chain}
    print("wall time: " + ", ".join(f"{job} {ended[job]:.1f} s" for job in chain)
          + f"; pipeline {time.monotonic() - started:.1f} s")
    print(f"end of stream reached the sink {eos_to_sink:.1f} s after ingest's last end of stream was written")
    # The last hop alone: the window job's end of stream committed -> the sink has its whole input (the
    # figure above also holds the window job's aggregation of everything, which precedes its end of stream).
    hop = sink["input_ended_at"] - window["eos_written_at"] if "eos_written_at" in window else None
    if hop is not None:
        print(f"end of stream reached the sink {hop:.1f} s after the window job's last end of stream was written")
    (run_dir / "pipeline.json").write_bytes(orjson.dumps(
        {"run_id": run_id, "jobs": summaries, "wall_seconds": ended, "eos_to_sink_seconds": eos_to_sink,
         "eos_last_hop_seconds": hop}, option=orjson.OPT_INDENT_2))


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
