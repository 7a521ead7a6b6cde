"""The windowed-count pipeline on synthetic events, against the same aggregation as one Spark batch query.

    python benchmarks/bench_pipeline.py [--events 1000000] [--master local[*]]

Prints, from one run: the pipeline's end-to-end records/s (three Spark applications, two Kafka hops),
each stage's records/s, the end-of-stream propagation time (ingest's last end of stream written -> the
sink has its complete input), and the time of the equivalent single Spark batch query over the same file,
as a ratio. Uses $KAFKA_BOOTSTRAP_SERVERS, else starts a local broker for the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import Cluster, add_cluster_options, kafka_cluster, synthetic_events
from harness import JobFailed, run_pipeline


def generate(path: Path, events: int, master: str, keys: int) -> float:
    """Write ``events`` synthetic events (skewed keys over 30 days, some nulls) as Parquet; return seconds."""
    from controlmsg.spark import spark_session

    spark = spark_session(master, "controlmsg-bench-generate")
    started = time.monotonic()
    synthetic_events(spark, events, keys).write.mode("overwrite").parquet(str(path))
    seconds = time.monotonic() - started
    spark.stop()
    return seconds


def batch_query(path: Path, master: str, window: str) -> tuple[float, int]:
    """The oracle's single batch query over the same file, fully computed; returns (seconds, rows)."""
    from controlmsg.spark import spark_session
    from spark_jobs.events import parse_duration, windowed_oracle

    spark = spark_session(master, "controlmsg-bench-batch")
    started = time.monotonic()
    out = windowed_oracle(spark, str(path), key="user", event_time="event_time", window_ms=parse_duration(window),
                          sums=["amount", "items"])
    rows = out.count()
    seconds = time.monotonic() - started
    spark.stop()
    return seconds, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--keys", type=int, default=5000, help="distinct users (skewed)")
    parser.add_argument("--window", default="1h")
    add_cluster_options(parser)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-"))
    with kafka_cluster(args) as cluster:
        return run(args, work, cluster)


def run(args: argparse.Namespace, work: Path, cluster: Cluster) -> int:
    """The benchmark proper, against ``cluster``; returns the exit code."""
    data = work / "events.parquet"
    gen = generate(data, args.events, args.master, args.keys)
    print(f"generated {args.events:,} events in {gen:.1f} s ({data})")

    out = work / "hourly.parquet"
    try:
        pipeline_s, summary = run_pipeline(data, out, work / "run", cluster.properties, window=args.window,
                                           sums=("amount", "items"), master=args.master, tasks=args.tasks,
                                           timeout=1800, options=("--partitions", str(args.partitions)))
    except JobFailed as exc:
        print(exc, file=sys.stderr)
        return 1
    jobs = summary["jobs"]
    batch_s, batch_rows = batch_query(data, args.master, args.window)

    ingest, window, sink = jobs["ingest"], jobs["window_aggregate"], jobs["sink"]
    print()
    print(f"{'measure':<44} {'value':>14}")
    print(f"{'pipeline end to end (3 apps, 2 hops)':<44} {args.events / pipeline_s:>11,.0f} r/s"
          f"  ({pipeline_s:.1f} s wall)")
    print(f"{'  ingest: file -> topic (write only)':<44} {ingest['rows_out'] / ingest['write_seconds']:>11,.0f} r/s"
          f"  ({ingest['write_seconds']:.1f} s of {ingest['seconds']:.1f} s)")
    print(f"{'  window_aggregate: topic -> topic':<44} {window['rows_in'] / window['seconds']:>11,.0f} r/s"
          f"  ({window['seconds']:.1f} s, input ended after {window['input_ended_seconds']:.1f} s)")
    print(f"{'  sink: topic -> file':<44} {sink['rows_in'] / sink['seconds']:>11,.0f} r/s"
          f"  ({sink['rows_in']:,} windows, {sink['seconds']:.1f} s)")
    print(f"{'end of stream: last ingest EOS -> sink input':<44} {summary['eos_to_sink_seconds']:>13.1f} s")
    print(f"{'single Spark batch query, same file':<44} {args.events / batch_s:>11,.0f} r/s  ({batch_s:.1f} s)")
    print(f"{'ratio pipeline / batch (records/s)':<44} {batch_s / pipeline_s:>14.3f}")
    assert batch_rows == sink["rows_out"], (batch_rows, sink["rows_out"])
    print(f"\nboth produced {batch_rows:,} window rows ({args.window} windows, {args.keys} skewed keys, 30 days); "
          f"{os.cpu_count()} cores, master {args.master}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
