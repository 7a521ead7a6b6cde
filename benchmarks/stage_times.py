"""Where a bounded pipeline run's time goes, stage by stage, from its run directory (issue 32).

    python benchmarks/stage_times.py RUN_DIR [RUN_DIR...]

Reads ``pipeline.json`` (the jobs' summaries, written by ``python -m spark_jobs.pipeline windowed-count``)
and prints one Markdown table per run: for each job, the seconds from the pipeline's start to its Python
process being ready, its Spark session up (the JVM), its input complete (reads, and the waits for the
upstream's end of stream), its output written, and its exit; the time is the clock of the jobs' summaries
(epoch seconds), each step's length in brackets.
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

import orjson


def stages(summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, float]]]]:
    """Each job's steps as ``(what, epoch seconds at its end)``, in order."""
    jobs, walls = summary["jobs"], summary["wall_seconds"]
    # The pipeline started its jobs at once: its start is each job's exit minus its wall time.
    start = statistics.median(jobs[j]["finished_at"] - walls[j] for j in walls)
    out = []
    for name, job in jobs.items():
        begun = job["finished_at"] - job["seconds"]
        spark_up = begun + job.get("spark_start_seconds", 0.0)
        steps = [("start", start), ("Python ready", begun), ("Spark session up", spark_up)]
        if name == "ingest":
            write = job["write_seconds"]
            steps += [(f"read the file, wrote the topic and its end of stream (the write {write:.1f} s), stopped Spark",
                       job["finished_at"])]
        elif name == "window_aggregate":
            steps += [("input complete (its end of stream read)", spark_up + job["input_ended_seconds"]),
                      ("aggregated, wrote, end of stream committed", job["eos_written_at"])]
        else:
            steps += [("input complete (its end of stream read)", job["input_ended_at"])]
        if name != "ingest":
            steps += [("wrote its output, stopped Spark", job["finished_at"])]
        steps += [("exit", start + walls[name])]
        out.append((name, steps))
    return out


def main(argv: list[str]) -> int:
    for run_dir in argv:
        summary = orjson.loads((Path(run_dir) / "pipeline.json").read_bytes())
        print(f"{run_dir}:\n\n| job | step | at (s) | step (s) |\n|---|---|---|---|")
        for name, steps in stages(summary):
            t0 = steps[0][1]
            for (_, before), (what, at) in itertools.pairwise(steps):
                print(f"| {name} | {what} | {at - t0:.1f} | {at - before:.1f} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
