"""The pipeline's last hop (the window job's end of stream -> the sink has its whole input), with the window
job's results committed as they are written (``--commit-rows``, the default 50,000) against one transaction
per write task (the way before: ``--commit-rows`` larger than any task), side by side (issue 32).

    python benchmarks/bench_last_hop.py [--events 100000,1000000[,N...]] [--repeat 1] [--keys 5000]
        [--window 1h] [--master local[*]] [--nice-step 12] [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

For each size: the synthetic events of ``bench_vs_kafka_connector.py`` written once as Parquet; then
``--repeat`` rounds of the two pipelines (``python -m spark_jobs.pipeline windowed-count``), alternating
which goes first; then, in one warm application, the floors: the sink's read
(:func:`spark_jobs.batch.sink.read_results`) of a whole round's window results alone (the floor of the
hop with one transaction per task: all of it is read after the end), and of a run of as many results as
the write tasks' last chunks can hold (``tasks x commitRows``: what is left to read after the end when the
sink keeps up). Prints each round, the medians, the jobs' wall times, and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Cluster, add_cluster_options, counts, delete_topics, kafka_cluster, load_average, synthetic_events
from harness import JobFailed, run_pipeline

from spark_jobs.batch.window_aggregate import COMMIT_ROWS
from spark_jobs.common import topic_names

ONE_TRANSACTION = 1_000_000_000
"""``--commit-rows`` above any task's results: one transaction per write task, as before."""
SUMS = ("amount", "items")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=counts, default=[100_000, 1_000_000], metavar="N[,N...]")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--window", default="1h")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--reverse", action="store_true", help="one transaction per task first in odd rounds")
    parser.add_argument("--nice-step", type=int, default=12,
                        help="the pipeline's --nice-step (default 12, the pipeline's; 0 on a machine that other "
                             "work loads, where the downstream jobs would starve at lower priority)")
    add_cluster_options(parser)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-hop-"))
    with kafka_cluster(args) as cluster:
        for events in args.events:
            run_size(args, events, work / str(events), cluster)
    return 0


def run_size(args: argparse.Namespace, events: int, work: Path, cluster: Cluster) -> None:
    from controlmsg.spark import spark_session

    work.mkdir(parents=True)
    data = work / "events.parquet"
    spark = spark_session(args.master, "bench-last-hop-generate")
    synthetic_events(spark, events, args.keys).write.parquet(str(data))
    spark.stop()
    print(f"{events:,} events (load average {load_average()})", flush=True)
    sides = {"chunks": COMMIT_ROWS, "one transaction": ONE_TRANSACTION}
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    topics: list[str] = []
    runs: dict[str, str] = {}
    for r in range(args.repeat):
        order = list(sides) if (r % 2 == 0) != args.reverse else list(sides)[::-1]
        for side in order:
            run_id = f"hop-{os.getpid()}-{events}-{r}-{side.split()[0]}"
            topics.extend(topic_names(run_id))
            runs[side] = run_id
            summary = pipeline(args, data, work / f"{run_id}", run_id, sides[side], cluster)
            results[side].append(summary)
            walls = summary["wall_seconds"]
            print(f"  round {r + 1} {side}: pipeline {summary['pipeline_seconds']:.1f} s, last hop "
                  f"{summary['eos_last_hop_seconds']:.2f} s; jobs ended after "
                  + ", ".join(f"{job} {walls[job]:.1f} s" for job in walls)
                  + f" (load average {load_average()})", flush=True)
    rows = results["chunks"][0]["jobs"]["sink"]["rows_in"]
    whole, last = floors(args, cluster, runs["one transaction"], rows, min(rows, args.tasks * COMMIT_ROWS))
    for side in sides:
        hops = [s["eos_last_hop_seconds"] for s in results[side]]
        walls = [s["pipeline_seconds"] for s in results[side]]
        print(f"  {side}: last hop median {statistics.median(hops):.2f} s ({', '.join(f'{h:.2f}' for h in hops)}), "
              f"pipeline median {statistics.median(walls):.1f} s")
    print(f"  floors, warm: the sink's read of all {rows:,} results {whole:.2f} s; of "
          f"{min(rows, args.tasks * COMMIT_ROWS):,} (the write tasks' last chunks at most) {last:.2f} s "
          f"(load average {load_average()})", flush=True)
    delete_topics(dict(cluster.config), topics)


def pipeline(args: argparse.Namespace, data: Path, run_dir: Path, run_id: str, commit_rows: int,
             cluster: Cluster) -> dict[str, Any]:
    try:
        seconds, summary = run_pipeline(
            data, run_dir / "out.csv", run_dir, cluster.properties, window=args.window, sums=SUMS, master=args.master,
            tasks=args.tasks, timeout=3600, options=("--run-id", run_id, "--commit-rows", str(commit_rows),
                                                     "--nice-step", str(args.nice_step)))
    except JobFailed as exc:
        raise SystemExit(f"pipeline {run_id} failed: {exc}") from None
    summary["pipeline_seconds"] = seconds
    return summary


def floors(args: argparse.Namespace, cluster: Cluster, run_id: str, rows: int, last: int) -> tuple[float, float]:
    """The sink's read, warm, of the ``rows`` results of run ``run_id``, and of a run of ``last`` of them."""
    from controlmsg.spark import spark_session
    from spark_jobs.batch.sink import read_results

    spark = spark_session(args.master, "bench-last-hop-floor")
    try:
        topic = topic_names(run_id)[1]
        base = {"topic": topic, "runId": run_id, "timeout": "600",
                **{f"kafka.{k}": v for k, v in cluster.config.items()}}
        sums = {"sum_amount": "double", "sum_items": "long"}
        timings = []
        parsed, results, n = read_results(spark, base, sums)
        assert n == rows, (n, rows)
        part_run = f"{run_id}-last"
        part_topic = f"{topic}-last"
        (results.limit(last).write.format("controlmsg").mode("append")
         .options(**{**base, "topic": part_topic, "runId": part_run, "key": "key"}).save())
        parsed.unpersist()
        for options, expected in ((base, rows), ({**base, "topic": part_topic, "runId": part_run}, last)):
            read_results(spark, options, sums)[0].unpersist()  # warm
            started = time.monotonic()
            parsed, _, n = read_results(spark, options, sums)
            timings.append(time.monotonic() - started)
            parsed.unpersist()
            assert n == expected, (n, expected)
        delete_topics(dict(cluster.config), [part_topic])
        return timings[0], timings[1]
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
