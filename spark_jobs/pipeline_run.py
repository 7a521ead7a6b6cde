"""How ``python -m spark_jobs.pipeline windowed-count`` (:mod:`spark_jobs.pipeline`) runs its jobs and tells
how they went: each job started in its own session and process group
(:class:`~controlmsg.clusters.job_group.JobGroup`), in the order given, the bounded pipeline's downstream jobs
CPU priority levels below ingest (:data:`_NICE_STEPS`); waited for until they all end, one fails, a signal
comes or the timeout passes; every job still running then stopped (SIGTERM, and after
:data:`JOB_STOP_GRACE_S` a SIGKILL of its group); then either how the run ended (a stop by signal, a failure,
the timeout) or, once the output is complete, what the run did.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import orjson

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.jobs import Job
from controlmsg.streaming import exit_code, signal_name
from spark_jobs.common import topic_names
from spark_jobs.job_commands import job_args

__all__ = ["JOB_STOP_GRACE_S", "Ending", "report_ending", "report_run", "run_jobs"]

JOB_STOP_GRACE_S: Final = 20.0
"""Seconds a job has to stop after the pipeline's SIGTERM before its process group is SIGKILLed (a job
bounds its own stop at 15 s, see :data:`controlmsg.streaming.stopping.HARD_LIMIT_S`)."""
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


@dataclass(frozen=True)
class Ending:
    """How the jobs of a run ended (:func:`run_jobs`): the signals the pipeline got, the job that failed
    (``"timeout"``: the jobs had not ended in time), the exit code of each job the stop found running, and
    when that stop began (``time.monotonic()``)."""

    signals: list[int]
    failed: str | None
    stopped: dict[str, int]
    stopping: float


def run_jobs(args: argparse.Namespace, order: list[str], jobs: JobGroup, kafka_file: Path, run_id: str,
             run_dir: Path, started: float) -> Ending:
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
    return Ending(signals, failed, stopped, stopping)


def report_ending(args: argparse.Namespace, ending: Ending, jobs: JobGroup, run_id: str,
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


def report_run(args: argparse.Namespace, chain: tuple[str, ...], jobs: JobGroup, run_id: str, run_dir: Path,
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
