"""The control plane at the scale of real backfills (issue 24): many write tasks, many partitions, few rows.

    python benchmarks/bench_scale.py [--tasks 50,500] [--partitions 16,200] [--rows-per-task 4] [--repeat 1]
        [--master local[2]] [--no-connector] [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

At every point (write tasks x topic partitions) the same DataFrame (``spark.range(tasks x rows-per-task,
numPartitions=tasks)``: one write task per DataFrame partition, ``--rows-per-task`` rows each) is written
to a fresh topic and read back to the end, with ``format("controlmsg")`` and, beside it, Spark's own
``format("kafka")`` (``to_json(struct(*))`` keyed by ``user``; the connector is resolved as
``bench_vs_kafka_connector.py`` does, so it needs pyspark 4.2.0, see benchmarks/README.md; without it,
or with ``--no-connector``, the controlmsg side alone):

- **write s**: ``save()`` alone, into a topic created before;
- **control messages**: the control records in the topic after the write (read to its end offsets), and
  per partition: the driver's one round (the end of stream) is one per partition whatever the task count;
- **bytes**: key, value and header bytes of every record read back (data and control), both sides;
- **read s**: ``spark.read...load().count()`` with the options' defaults (one reading task per
  partition; controlmsg's read ends at the end of stream, the connector's at the latest offsets);
- **reader RSS**: a ``ControlReader`` of every partition read to end of stream in a process of its own
  (its peak RSS, and its RSS before reading: the imports), and the size of its bookkeeping snapshot.

Then a **model**: each side's write and read seconds fitted as ``a + b x tasks + c x partitions`` over
the points measured (least squares; at least three points), with the control messages the round has at
each size (partitions now; tasks x partitions before issue 24), predicted at the issue's large points.
Topics made here are deleted at the end. Prints a table and a dated line with the load average: on a
shared machine, read the ratios of one run rather than the absolute seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from common import EVENTS_START_MS, add_cluster_options, counts, delete_topics, kafka_cluster, load_average

from controlmsg.kafka.admin import create_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CM, KAFKA = "controlmsg", "connector"
SCHEMA = "user string, event_time long, amount double"
MODEL_POINTS = ((2_000, 1_000), (10_000, 1_000), (80_000, 1_000))

READER_SCRIPT = """
import resource, sys, time, orjson
from controlmsg.kafka import ControlReader
config, topic, run = orjson.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
with ControlReader(config, topic, run_id=run, stop_at_end=True, batch_size=10000) as reader:
    records = 0
    while not reader.tracker.is_ended and time.monotonic() - started < 600:
        records += sum(1 for item in reader.poll(0.02) if hasattr(item, "payload"))
    snapshot = len(orjson.dumps(reader.tracker.snapshot()))
    ended = reader.tracker.is_ended
seconds = time.monotonic() - started
print(orjson.dumps({"before_kb": before, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                    "seconds": seconds, "records": records, "snapshot": snapshot, "ended": ended}).decode())
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=counts, default=[50, 500], help="write tasks, comma-separated (50,500)")
    parser.add_argument("--partitions", type=counts, default=[16, 200],
                        help="topic partitions, comma-separated (16,200)")
    parser.add_argument("--rows-per-task", type=int, default=4, help="rows each write task writes (4)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, the sides alternating; medians (1)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-connector", action="store_true", help="controlmsg alone")
    add_cluster_options(parser)
    return parser


@dataclass
class Point:
    tasks: int
    partitions: int
    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    facts: dict[tuple[str, str], Any] = field(default_factory=dict)

    def add(self, side: str, figure: str, value: float) -> None:
        self.samples.setdefault((side, figure), []).append(value)

    def median(self, side: str, figure: str) -> float | None:
        values = self.samples.get((side, figure))
        return statistics.median(values) if values else None


def topic_figures(config: dict[str, str], topic: str, envelopes: bool) -> dict[str, int]:
    """Data and control records of ``topic`` and their bytes (key, value, headers), read committed from
    the beginning until every partition has reported its end and nothing more came for a second (a write's
    last transaction markers may still be on their way when ``save()`` returns, and until they are, its
    records are not readable).
    ``envelopes``: controlmsg's records (a first byte other than 0 is a control message); else all data."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**config, "group.id": f"bench-scale-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "fetch.queue.backoff.ms": 10,
                         "enable.partition.eof": True})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        left = set(meta.partitions)
        out = {"data": 0, "control": 0, "data_bytes": 0, "control_bytes": 0}
        deadline = time.monotonic() + 600
        quiet_since = time.monotonic()
        while (left or time.monotonic() - quiet_since < 1.0) and time.monotonic() < deadline:
            msgs = consumer.consume(10000, 0.05)
            if msgs:
                quiet_since = time.monotonic()
            for msg in msgs:
                if msg.error() is not None:
                    left.discard(msg.partition())
                    continue
                value, key = msg.value() or b"", msg.key() or b""
                size = len(value) + len(key) + sum(len(k) + len(v or b"") for k, v in msg.headers() or [])
                kind = "data" if not envelopes or not value or value[0] == 0 else "control"
                out[kind] += 1
                out[f"{kind}_bytes"] += size
        if left:
            raise RuntimeError(f"{topic}: partitions {sorted(left)} not read to their end in 600 s")
        return out
    finally:
        consumer.close()


def reader_figures(config: dict[str, str], topic: str, run: str) -> dict[str, Any]:
    import orjson

    done = subprocess.run([sys.executable, "-c", READER_SCRIPT, orjson.dumps(config).decode(), topic, run],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"the reader process failed: {done.stderr[-2000:]}")
    figures: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return figures


class Bench:
    def __init__(self, args: argparse.Namespace, spark: SparkSession, config: dict[str, str],
                 connector: bool) -> None:
        self.args = args
        self.spark = spark
        self.config = config
        self.connector = connector
        self.prefix = f"bench-scale-{uuid.uuid4().hex[:6]}"
        self.topics: list[str] = []

    def say(self, line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    def new_topic(self, name: str, partitions: int) -> str:
        topic = f"{self.prefix}-{name}"
        create_topic(dict(self.config), topic, partitions)
        self.topics.append(topic)
        return topic

    def frame(self, tasks: int) -> DataFrame:
        from pyspark.sql import functions as F

        rows = tasks * self.args.rows_per_task
        return self.spark.range(rows, numPartitions=tasks).select(
            F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")).alias("user"),
            (F.lit(EVENTS_START_MS) + F.col("id") * 1000).alias("event_time"),
            (F.col("id") % 100).cast("double").alias("amount"))

    def options(self, topic: str, run: str) -> dict[str, str]:
        return {"topic": topic, "runId": run, "job": "bench", "timeout": "900",
                **{f"kafka.{k}": v for k, v in self.config.items()}}

    def write(self, side: str, df: DataFrame, topic: str, run: str) -> None:
        if side == CM:
            (df.write.format("controlmsg").mode("append").options(**self.options(topic, run))
             .option("key", "user").option("eventTime", "event_time").save())
        else:
            from connector_jobs import write_topic

            write_topic(df, self.config["bootstrap.servers"], topic, "user")

    def read_count(self, side: str, topic: str, run: str) -> int:
        if side == CM:
            return int(self.spark.read.format("controlmsg").options(**self.options(topic, run)).schema(SCHEMA)
                       .load().count())
        from connector_jobs import read_topic

        return int(read_topic(self.spark, self.config["bootstrap.servers"], topic, SCHEMA).count())

    def warm_up(self) -> None:
        started = time.monotonic()
        for side in self.sides(0):
            topic = self.new_topic(f"warm-{side}", 2)
            self.write(side, self.frame(2), topic, f"{self.prefix}-warm")
            self.read_count(side, topic, f"{self.prefix}-warm")
        self.say(f"warm-up (not counted): {time.monotonic() - started:.1f} s")

    def sides(self, r: int) -> tuple[str, ...]:
        sides = (CM, KAFKA) if self.connector else (CM,)
        return sides if r % 2 == 0 else sides[::-1]

    def measure(self, point: Point, r: int) -> None:
        rows = point.tasks * self.args.rows_per_task
        df = self.frame(point.tasks)
        for side in self.sides(r):
            name = f"{'cm' if side == CM else 'kafka'}-{point.tasks}x{point.partitions}-{r}"
            topic = self.new_topic(name, point.partitions)
            run = f"{self.prefix}-{name}"
            started = time.monotonic()
            self.write(side, df, topic, run)
            written = time.monotonic() - started
            wire = topic_figures(self.config, topic, envelopes=side == CM)
            if wire["data"] != rows:
                raise RuntimeError(f"{side} {name}: {wire['data']} data records in the topic, not {rows}")
            started = time.monotonic()
            got = self.read_count(side, topic, run)
            read = time.monotonic() - started
            if got != rows:
                raise RuntimeError(f"{side} {name}: read {got} rows back, not {rows}")
            point.add(side, "write", written)
            point.add(side, "read", read)
            point.facts[side, "wire"] = wire
            line = (f"{point.tasks} tasks x {point.partitions} partitions, {side}: write {written:.1f} s, "
                    f"read {read:.1f} s, {wire['control']:,} control messages, "
                    f"{wire['data_bytes'] + wire['control_bytes']:,} bytes")
            if side == CM:
                reader = reader_figures(self.config, topic, run)
                if not reader["ended"] or reader["records"] != rows:
                    raise RuntimeError(f"{name}: the ControlReader did not read {rows} records to end of stream: "
                                       f"{reader}")
                point.add(side, "reader_seconds", reader["seconds"])
                point.add(side, "reader_peak_mb", reader["peak_kb"] / 1024)
                point.add(side, "reader_base_mb", reader["before_kb"] / 1024)
                point.facts[side, "snapshot"] = reader["snapshot"]
                line += (f"; a ControlReader of every partition: {reader['seconds']:.2f} s, peak RSS "
                         f"{reader['peak_kb'] / 1024:.0f} MB ({reader['before_kb'] / 1024:.0f} MB before reading), "
                         f"bookkeeping {reader['snapshot']:,} bytes")
            self.say(line)


def fit(points: Sequence[Point], side: str, figure: str) -> tuple[float, float, float] | None:
    """``seconds = a + b x tasks + c x partitions`` by least squares over ``points`` with every coefficient
    >= 0 (a cost per task or per partition cannot be negative; noise on a shared machine can make the
    plain fit say so): the best of the fits over the subsets of the terms whose coefficients are all >= 0.
    ``None``: too few points."""
    import itertools

    import numpy as np

    rows = [(p.tasks, p.partitions, p.median(side, figure)) for p in points]
    rows = [r for r in rows if r[2] is not None]
    if len(rows) < 3 or len({r[0] for r in rows}) < 2 or len({r[1] for r in rows}) < 2:
        return None
    full = np.array([[1.0, t, p] for t, p, _ in rows])
    y = np.array([s for _, _, s in rows])
    best: tuple[float, tuple[float, float, float]] | None = None
    for size in (3, 2, 1):
        for terms in itertools.combinations(range(3), size):
            coef = np.linalg.lstsq(full[:, terms], y, rcond=None)[0]
            if (coef < 0).any():
                continue
            values = [0.0, 0.0, 0.0]
            for term, value in zip(terms, coef, strict=True):
                values[term] = float(value)
            error = float(((full @ np.array(values) - y) ** 2).sum())
            if best is None or error < best[0]:
                best = (error, (values[0], values[1], values[2]))
    return None if best is None else best[1]


def report(points: Sequence[Point], args: argparse.Namespace, connector: bool, load: str) -> None:
    import pyspark

    print()
    print("| tasks x partitions | write s, controlmsg | write s, connector | write ratio | control messages "
          "(per partition) | bytes, controlmsg (control) | bytes, connector | read s, controlmsg | "
          "read s, connector | read ratio | ControlReader: s, peak RSS MB (before reading), bookkeeping bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def cell(value: float | None, fmt: str = "{:.1f}") -> str:
        return "-" if value is None else fmt.format(value)

    for p in points:
        w_cm, w_k = p.median(CM, "write"), p.median(KAFKA, "write")
        r_cm, r_k = p.median(CM, "read"), p.median(KAFKA, "read")
        wire = p.facts[CM, "wire"]
        kwire = p.facts.get((KAFKA, "wire"))
        print(f"| {p.tasks:,} x {p.partitions:,} | {cell(w_cm)} | {cell(w_k)} | "
              f"{cell(w_cm / w_k if w_cm and w_k else None, '{:.2f}')} | {wire['control']:,} "
              f"({wire['control'] / p.partitions:g}) | {wire['data_bytes'] + wire['control_bytes']:,} "
              f"({wire['control_bytes']:,}) | {'-' if kwire is None else format(kwire['data_bytes'], ',')} | "
              f"{cell(r_cm)} | {cell(r_k)} | {cell(r_cm / r_k if r_cm and r_k else None, '{:.2f}')} | "
              f"{cell(p.median(CM, 'reader_seconds'), '{:.2f}')}, {cell(p.median(CM, 'reader_peak_mb'), '{:.0f}')} "
              f"({cell(p.median(CM, 'reader_base_mb'), '{:.0f}')}), {p.facts[CM, 'snapshot']:,} |")
    print()
    print("Model: seconds = a + b x tasks + c x partitions, fitted over the points above (least squares); control "
          "messages of one round: partitions (the driver, since issue 24), tasks x partitions before.")
    print()
    fits = {(side, figure): fit(points, side, figure) for side in (CM, KAFKA) for figure in ("write", "read")}
    for key, f in fits.items():
        if f is not None:
            print(f"- {key[0]} {key[1]}: a = {f[0]:.2f} s, b = {f[1] * 1000:.2f} ms per task, "
                  f"c = {f[2] * 1000:.2f} ms per partition")
    print()
    print("| tasks x partitions | control messages (before issue 24) | write s, controlmsg | write s, connector | "
          "read s, controlmsg | read s, connector |")
    print("|---|---|---|---|---|---|")

    def predict(key: tuple[str, str], t: int, p: int) -> str:
        f = fits[key]
        return "-" if f is None else f"{f[0] + f[1] * t + f[2] * p:.0f}"

    for t, p in MODEL_POINTS:
        print(f"| {t:,} x {p:,} | {p:,} ({t * p:,}) | {predict((CM, 'write'), t, p)} | "
              f"{predict((KAFKA, 'write'), t, p)} | {predict((CM, 'read'), t, p)} | {predict((KAFKA, 'read'), t, p)} |")
    print()
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, pyspark {pyspark.__version__}, master {args.master}, "
          f"{args.rows_per_task} rows per task, {args.repeat} round(s), medians; load average at the start {load}, "
          f"at the end {load_average()}; {'with' if connector else 'without'} Spark's connector")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from connector_jobs import connector_package, connector_session

    from controlmsg.spark import spark_session

    load = load_average()
    connector = not args.no_connector
    conf = {"spark.sql.shuffle.partitions": "4"}
    if connector:
        try:
            spark = connector_session(args.master, "bench-scale", conf=conf)
        except Exception as exc:
            print(f"bench_scale: Spark's connector {connector_package()} cannot be had with this pyspark ({exc}); "
                  "run with pyspark 4.2.0 (benchmarks/README.md) or with --no-connector", file=sys.stderr)
            return 2
    else:
        spark = spark_session(args.master, "bench-scale", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    points = [Point(t, p) for t in args.tasks for p in args.partitions]
    try:
        with kafka_cluster(args) as cluster:
            bench = Bench(args, spark, dict(cluster.config), connector)
            try:
                bench.warm_up()
                for r in range(args.repeat):
                    for point in points:
                        bench.measure(point, r)
            finally:
                delete_topics(dict(cluster.config), bench.topics)
    finally:
        spark.stop()
    report(points, args, connector, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
