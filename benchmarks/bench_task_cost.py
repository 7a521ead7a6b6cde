"""What one ``format("controlmsg")`` write task pays besides its rows (issue 24, item 3), beside the floors.

    python benchmarks/bench_task_cost.py [--calls 40] [--tasks 200] [--partitions 16] [--rows-per-task 4]
        [--rounds 3] [--master local[2]] [--no-spark]
        [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

1. **A write task's Kafka calls, without Spark**: ``--calls`` write tasks one after another in this process,
   each the calls of the data source's task body (``controlmsg.spark.writing.task``), timed apart: the
   transactional ``ControlWriter`` (producer and ``init_transactions``), the marker lookup (a consumer of
   the task's group), ``--rows-per-task`` rows, the marker added to the transaction, the commit, closing.
   Four ways, alternating per round: as the task body makes them (librdkafka's
   ``enable.sparse.connections`` false, the producer destroyed on a background thread); with the producer
   left to the garbage collector (before issue 32); with the marker's consumer made first, so that it
   connects while the producer initialises transactions (tried in issue 32, not adopted:
   docs/PERFORMANCE.md); and with sparse connections true (librdkafka's default, controlmsg's before issue
   24). Medians per phase and the wall time per task (the wall includes what each way leaves to the
   garbage collector or the background thread, as far as it delays the next task).
2. **In Spark** (``--master``): the same DataFrame (``--tasks`` partitions, ``--rows-per-task`` rows each,
   cached) written with ``format("noop")`` (Spark's floor: a JVM writer that writes nothing), a Python
   data source that writes nothing (the floor of any Python data source: a Python worker call per task),
   ``format("controlmsg")`` into a ``--partitions`` topic with sparse connections true (before) and false
   (now), and Spark's ``format("kafka")`` where its connector resolves (pyspark 4.2.0, see
   benchmarks/README.md). Per side: seconds of ``save()``, ms per task, and the ratio to
   ``format("kafka")`` (or to the Python floor without the connector). The sides alternate, ``--rounds``
   rounds, medians.

Topics made here are deleted at the end. On a shared machine read the ratios of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from common import add_cluster_options, delete_topics, kafka_cluster, load_average

from controlmsg.kafka import create_topic

SPARSE = "enable.sparse.connections"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40, help="write tasks timed apart without Spark, per side (40)")
    parser.add_argument("--tasks", type=int, default=200, help="write tasks of the Spark write (200)")
    parser.add_argument("--partitions", type=int, default=16, help="partitions of the topic written (16)")
    parser.add_argument("--rows-per-task", type=int, default=4, help="rows each write task writes (4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the sides alternating; medians (3)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-spark", action="store_true", help="the Kafka calls alone (part 1)")
    add_cluster_options(parser)
    return parser


def task_calls(config: dict[str, Any], topic: str, partitions: int, rows: int,
               consumer_first: bool = False, destroy_later: bool = True) -> dict[str, float]:
    """One write task's Kafka calls, as ``controlmsg.spark.writing.task.write_task`` makes them: seconds each.
    ``consumer_first``: the marker's consumer made before the producer initialises transactions, so that
    it connects meanwhile (tried in issue 32: slower per task here, not adopted). ``destroy_later``: the
    producer destroyed on the background thread (``run_later(writer.destroy)``, the task body since issue
    32); false: left to the garbage collector, in the middle of later work (before)."""
    from controlmsg.core.codec import encode_json
    from controlmsg.kafka import ControlWriter
    from controlmsg.kafka.background import run_later
    from controlmsg.kafka.markers import MarkerStore

    name = f"bench-{uuid.uuid4().hex[:12]}"
    txn_id = f"{topic}-{name}"
    times: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        times[phase] = now - clock
        clock = now

    early = MarkerStore(config, txn_id, topic) if consumer_first else None
    writer = ControlWriter({**config, "transactional.id": txn_id}, topic, task_name=name, task_count=None,
                           run_id="bench", partitions=partitions, data_headers=True)
    lap("producer and init_transactions")
    with early or MarkerStore(config, txn_id, topic) as store:
        store.load()
        lap("marker lookup")
        with writer:
            writer.send_encoded([encode_json({"id": i, "user": f"user-{i}"}) for i in range(rows)],
                                [f"user-{i}" for i in range(rows)])
            lap("rows")
            store.add(writer, {"batch": 0, "rows": rows}, rows)
            lap("marker in the transaction")
        lap("commit and close")
    lap("marker store close")
    if destroy_later:
        run_later(writer.destroy)
    return times


def part_one(args: argparse.Namespace, config: dict[str, Any], topic: str) -> None:
    sides = {"now": ({**config, SPARSE: False}, False, True),
             "producer left to the GC (before issue 32)": ({**config, SPARSE: False}, False, False),
             "the marker's consumer first (tried)": ({**config, SPARSE: False}, True, True),
             "sparse true (before issue 24)": ({**config, SPARSE: True}, False, False)}
    phases: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    walls: dict[str, list[float]] = {side: [] for side in sides}
    per_round = max(1, args.calls // args.rounds)
    for _ in range(args.rounds):
        for side, (conf, consumer_first, destroy_later) in sides.items():
            started = time.perf_counter()
            for _ in range(per_round):
                for phase, seconds in task_calls(conf, topic, args.partitions, args.rows_per_task,
                                                 consumer_first, destroy_later).items():
                    phases[side].setdefault(phase, []).append(seconds)
            walls[side].append((time.perf_counter() - started) / per_round)
    names = list(next(iter(phases.values())))
    print(f"\n1. One write task's Kafka calls, {per_round * args.rounds} tasks per side one after another "
          f"({args.rows_per_task} rows each, topic of {args.partitions} partitions), median ms:\n")
    print("| phase | " + " | ".join(sides) + " |")
    print("|---|" + "---|" * len(sides))
    for phase in names:
        print(f"| {phase} | " + " | ".join(f"{statistics.median(phases[s][phase]) * 1000:.1f}" for s in sides) + " |")
    print("| **wall per task** | " + " | ".join(f"**{statistics.median(walls[s]) * 1000:.1f}**" for s in sides)
          + " |")


def part_two(args: argparse.Namespace, config: dict[str, Any], topics: list[str]) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
    from pyspark.sql.types import StructType

    from controlmsg.spark import spark_session

    class NothingWriter(DataSourceWriter):
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

    class Nothing(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_nothing"

        def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
            return NothingWriter()

    connector = True
    try:
        from connector_jobs import connector_session, write_topic

        spark = connector_session(args.master, "bench-task-cost", conf={"spark.ui.enabled": "false"})
    except Exception as exc:  # any failure to resolve the connector: the side is left out
        print(f"\n(format('kafka') left out: Spark's connector cannot be had with this pyspark: {exc})")
        connector = False
        spark = spark_session(args.master, "bench-task-cost", conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(Nothing)
    df = spark.range(args.tasks * args.rows_per_task, numPartitions=args.tasks).select(
        F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")).alias("user"),
        F.col("id"), (F.col("id") % 100).cast("double").alias("amount")).cache()
    df.count()

    def controlmsg(sparse: bool) -> None:
        topic = f"bench-task-{uuid.uuid4().hex[:8]}"
        create_topic(config, topic, args.partitions)
        topics.append(topic)
        (df.write.format("controlmsg").mode("append").option("topic", topic).option("runId", topic)
         .option("key", "user").options(**{f"kafka.{k}": str(v) for k, v in config.items()})
         .option(f"kafka.{SPARSE}", str(sparse).lower()).save())

    def kafka() -> None:
        topic = f"bench-task-{uuid.uuid4().hex[:8]}"
        create_topic(config, topic, args.partitions)
        topics.append(topic)
        write_topic(df, str(config["bootstrap.servers"]), topic, "user")

    sides: dict[str, Any] = {
        'format("noop")': lambda: df.write.format("noop").mode("append").save(),
        "a Python data source writing nothing": lambda: df.write.format("bench_nothing").mode("append").save(),
        'format("controlmsg"), sparse true (before)': lambda: controlmsg(True),
        'format("controlmsg"), sparse false (now)': lambda: controlmsg(False),
    }
    if connector:
        sides['format("kafka")'] = kafka
    try:
        for run in sides.values():  # warm-up: Python workers, class loading, the connector's producer
            run()
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, run in sides.items():
                started = time.perf_counter()
                run()
                seconds[side].append(time.perf_counter() - started)
    finally:
        spark.stop()
    base = 'format("kafka")' if connector else "a Python data source writing nothing"
    median = {side: statistics.median(values) for side, values in seconds.items()}
    print(f"\n2. In Spark ({args.master}): {args.tasks} write tasks of {args.rows_per_task} rows into "
          f"{args.partitions} partitions, median of {args.rounds} rounds:\n")
    print(f"| write | s | ms per task | ratio to {base} |")
    print("|---|---|---|---|")
    for side, value in median.items():
        print(f"| {side} | {value:.2f} | {value / args.tasks * 1000:.1f} | {value / median[base]:.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    load = load_average()
    topics: list[str] = []
    with kafka_cluster(args) as cluster:
        config = dict(cluster.config)
        try:
            topic = f"bench-task-{uuid.uuid4().hex[:8]}"
            create_topic(config, topic, args.partitions)
            topics.append(topic)
            part_one(args, config, topic)
            if not args.no_spark:
                part_two(args, config, topics)
        finally:
            delete_topics(config, topics)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load} at the start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
