"""What naming the run in each record costs the 3-job pipeline: ``--run-tag`` envelope against none (issue 40).

    python benchmarks/bench_run_tag.py [--events 1000000] [--rounds 4] [--tags envelope,none]
        [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

The windowed-count pipeline (``python -m spark_jobs.pipeline windowed-count``, three Spark applications
joined by two topics) over the same synthetic events (written once as Parquet), once per ``--tags`` value
in each round, the order turning from round to round; ``--run-tag`` is how the records of its two topics
name the run (docs/PROTOCOL.md, "Wire format 2"). Prints each run's wall time, each tag's median and the
ratio of each tag's median to the first's. Every run's output must equal the first run's, row for row (sums
of doubles within 1e-9 relative: the order of addition may differ).
Uses the Kafka cluster of ``--bootstrap-servers`` / ``-X`` / ``--kafka-config`` /
``$KAFKA_BOOTSTRAP_SERVERS``, else starts a broker for the run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from bench_pipeline import generate
from bench_vs_kafka_connector import BenchError, compare_outputs
from common import add_cluster_options, kafka_cluster
from harness import run_pipeline

TAGS = ("envelope", "headers", "none")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tags", default="envelope,none", help="the --run-tag values compared (default envelope,none)")
    parser.add_argument("--master", default="local[*]")
    add_cluster_options(parser)
    args = parser.parse_args()
    tags = [t.strip() for t in args.tags.split(",") if t.strip()]
    if not tags or any(t not in TAGS for t in tags):
        parser.error(f"--tags: each of {', '.join(TAGS)}, got {args.tags!r}")
    work = Path(tempfile.mkdtemp(prefix="bench-run-tag-"))
    try:
        data = work / "events.parquet"
        generate(data, args.events, args.master, 5000)
        seconds: dict[str, list[float]] = {t: [] for t in tags}
        first: Path | None = None
        with kafka_cluster(args) as cluster:
            for r in range(args.rounds):
                for tag in tags[r % len(tags):] + tags[:r % len(tags)]:
                    output = work / f"out-{tag}-{r}.csv"
                    took, summary = run_pipeline(
                        data, output, work / f"run-{tag}-{r}", cluster.properties, window="1h",
                        sums=("amount", "items"), master=args.master, tasks=2, timeout=1800,
                        options=("--partitions", "4", "--run-tag", tag))
                    if first is None:
                        first = output
                    else:
                        try:
                            compare_outputs(output, first)
                        except BenchError as exc:
                            raise SystemExit(f"round {r + 1}, --run-tag {tag}: {exc}") from None
                    seconds[tag].append(took)
                    walls = ", ".join(f"{job} {s:.1f} s" for job, s in summary["wall_seconds"].items())
                    print(f"round {r + 1}, --run-tag {tag}: {took:.1f} s ({walls})", flush=True)
        base = statistics.median(seconds[tags[0]])
        print(f"\n{args.events:,} events, {args.rounds} rounds, medians")
        for tag in tags:
            median = statistics.median(seconds[tag])
            shown = ", ".join(f"{s:.1f}" for s in seconds[tag])
            print(f"--run-tag {tag}: {median:.1f} s ({shown}); {median / base:.3f}x --run-tag {tags[0]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
