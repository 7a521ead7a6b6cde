"""How the benchmarks run a command to its end: as a job (:class:`controlmsg.clusters.jobs.Job`: its own
process group, its output in a log, killed whole if it outlives its timeout or the benchmark), timed, and
failed with the end of its log (:func:`run_job`); the two such jobs several benchmarks run, the generator
(:func:`run_generator`) and the backfill pipeline (:func:`run_pipeline`).

Jobs that run beside the benchmark (the streaming chain's applications, the soak's jobs) are ``Job``\\ s
or a ``JobGroup`` of their own; commands whose standard output is the result (a probe that prints JSON)
are run with ``subprocess``. Imported by the scripts as a sibling module, as ``common``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from controlmsg.clusters.jobs import Job

TAIL_LINES = 30
"""Lines of a failed job's log that its error ends with."""


class JobFailed(RuntimeError):
    """A job run to its end exited with an error, outlived its timeout or did not print what it should; the
    message names the job and ends with the last lines of its log."""


@dataclass(frozen=True)
class Ran:
    """A job that ran to its end, when (``time.monotonic()``)."""

    started: float
    ended: float  # when its end was seen

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def _tail(job: Job) -> str:
    return f"end of {job.log_path}:\n{job.tail(TAIL_LINES, indent='    ')}"


def run_job(name: str, argv: Sequence[str], log_path: Path, *, timeout: float,
            env: Mapping[str, str] | None = None) -> Ran:
    """Run ``argv`` to its end as job ``name``, its output appended to ``log_path``; blocks. Raises
    :class:`JobFailed` if it exits with an error, or if it still runs after ``timeout`` s (it is then
    killed, with its whole process group)."""
    job = Job(name, argv, log_path, env=env)
    try:
        job.start()
        code = job.wait(timeout)
        if code != 0:
            what = f"still running after {timeout:g} s" if code is None else f"failed (exit {code})"
            raise JobFailed(f"{name} {what}; {_tail(job)}")
        assert job.started_at is not None and job.ended_at is not None
        return Ran(job.started_at, job.ended_at)
    finally:
        job.close()


def run_generator(argv: list[str], log_path: Path, timeout: float) -> tuple[int, float]:
    """Run ``python -m spark_jobs.generate`` (``argv``) to its end (:func:`run_job`). Returns the source
    topic's records (the sum of the end offsets it prints last) and the ``time.monotonic()`` it ended at;
    raises :class:`JobFailed` if it fails or prints no end offsets."""
    ran = run_job("generator", argv, log_path, timeout=timeout)
    lines = log_path.read_bytes().splitlines()
    for line in reversed(lines):
        if line.startswith(b'{"topic"'):
            return sum(orjson.loads(line)["endOffsets"].values()), ran.ended
    tail = "\n".join("    " + line.decode(errors="replace") for line in lines[-TAIL_LINES:])
    raise JobFailed(f"the generator printed no end offsets; end of {log_path}:\n{tail}")


def run_pipeline(data: Path, output: Path, run_dir: Path, kafka_config: Path, *, window: str, sums: Sequence[str],
                 master: str, tasks: int, timeout: int, options: Sequence[str] = ()) -> tuple[float, dict[str, Any]]:
    """``python -m spark_jobs.pipeline windowed-count`` of the synthetic events in ``data`` (by ``user``,
    event time ``event_time``, ``window`` windows summing ``sums``) into ``output``, against the cluster of
    the properties file ``kafka_config``, with ``tasks`` write tasks, its run directory ``run_dir`` (its
    jobs' logs and summary) and its own output in ``<run_dir>.log``; ``timeout``: the pipeline's
    ``--timeout`` (it is killed a minute after); ``options``: more of the command's options. Blocks.
    Returns its wall time and its summary (``pipeline.json``); raises :class:`JobFailed` if it fails."""
    argv = [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--input", str(data),
            "--key", "user", "--event-time", "event_time", "--window", window, *[x for c in sums for x in ("--sum", c)],
            "--output", str(output), "--kafka-config", str(kafka_config), "--master", master, "--tasks", str(tasks),
            "--run-dir", str(run_dir), "--timeout", str(timeout), *options]
    ran = run_job("pipeline", argv, run_dir.parent / f"{run_dir.name}.log", timeout=timeout + 60)
    summary: dict[str, Any] = orjson.loads((run_dir / "pipeline.json").read_bytes())
    return ran.seconds, summary
