"""controlmsg against Spark's own Kafka connector: write, read and the whole pipeline, side by side (issue 12).

    python benchmarks/bench_vs_kafka_connector.py [--events 1000000[,N...]] [--repeat 1] [--keys 5000] [--window 1h]
        [--partitions 4] [--tasks 2] [--master local[*]] [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

The same input (``--events`` synthetic events: ``--keys`` skewed users over 30 days, written once as
Parquet), the same topic layout (``--partitions`` partitions, ``--tasks`` write tasks, keyed by user), the
two sides alternating (controlmsg first in even rounds, the connector first in odd ones; ``--repeat``
rounds, medians reported). Spark's connector is ``org.apache.spark:spark-sql-kafka-0-10_<scala>`` at the
installed Spark version, resolved by ``spark.jars.packages`` (once: the connector's stage applications
get the resolved jar files); when it cannot be resolved (a pyspark release without a published
connector) the benchmark says which version it needs and stops. Before the timed rounds both sides
write and read 1,000 rows once, untimed (Python workers, classes, the broker's transaction coordinator).

1. write rows/s: the same cached rows (``repartition(tasks)``) to a fresh topic, ``df.write.format("controlmsg")``
   keyed by ``user`` with ``eventTime`` vs ``df.write.format("kafka")`` with ``key = user`` and
   ``value = to_json(struct(*))``; only ``save()`` is timed. Then the floor of any write from Python
   workers: the same rows sent by a bare confluent-kafka ``Producer`` in each task (:func:`bare_write`),
   and with the two headers of ``runTag headers`` on each record. controlmsg writes each record's run in
   its envelope by default (``runTag envelope``, wire format 2); beside it, the same write with
   ``runTag headers`` (wire format 1: the run and the task in two headers) and ``runTag none`` (no run on
   the records). And controlmsg given the very DataFrame the connector writes: the option ``value`` names
   a column made by ``to_json(struct(*))`` in the JVM, so no Python object is made per row.
2. read rows/s with the JSON parsed: each side reads back the topic it wrote, ``format("controlmsg")``
   with ``.schema(...)`` vs ``format("kafka")`` + ``from_json``, to an aggregate over every parsed field
   (count, sums, min and max), which must equal the source's.
3. the 3-job pipeline (``python -m spark_jobs.pipeline windowed-count``, three Spark applications at
   once joined by two controlmsg topics) vs the same three stages with the connector, each its own Spark
   application run after the previous one ended (``connector_jobs.py``), vs one plain Spark batch query
   over the file; wall time of each, from the first process start to the result file; the three result
   files must be equal row for row (sums of doubles within 1e-9 relative: the order of addition differs).
4. end of stream: from the pipeline's summary, how long after ingest's last end of stream the sink had
   its complete input, and how long after the window job's (the last hop alone); and the last hop's
   floor, the sink's read of the window results alone in a warm application (the window job's output
   becomes readable all at once, with its end of stream, when its transactions commit).

Prints a table of the figures, each side's absolute value and the ratio controlmsg / connector, and a
dated line. Uses the Kafka cluster of ``--bootstrap-servers`` / ``-X`` / ``--kafka-config`` /
``$KAFKA_BOOTSTRAP_SERVERS``, else starts a broker for the run; the connector is given
``bootstrap.servers`` only (librdkafka settings are not the Java client's). Topics made here are deleted
at the end.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from common import (
    Cluster,
    add_cluster_options,
    counts,
    delete_topics,
    kafka_cluster,
    load_average,
    synthetic_events,
)
from connector_jobs import connector_package, connector_session, read_topic, resolved_jars, write_topic
from harness import JobFailed, run_job, run_pipeline

from controlmsg.kafka.admin import create_topic, end_offsets
from controlmsg.spark import run_status
from spark_jobs.common import topic_names

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

CONNECTOR_JOBS = Path(__file__).with_name("connector_jobs.py")
EVENT_SCHEMA = "user string, event_time long, amount double, items int"  # the generated file, as JSON values
SUMS = ("amount", "items")
INGESTED_SCHEMA = "key string, event_ms long, amount double, items long"  # what the ingest stage writes
WINDOWS_SCHEMA = "key string, window_start long, window_end long, count long, sum_amount double, sum_items long"
PROCESS_TIMEOUT_S = 7200.0
"""A stage, query or pipeline run as a process that has not ended after this long has hung: killed."""

CM, KAFKA, PLAIN, BARE = "controlmsg", "connector", "plain batch", "bare producer"
BARE_HEADERS = "bare producer, run and task headers"
HEADERS = "controlmsg, runTag headers"
NO_TAG = "controlmsg, runTag none"
VALUE_COLUMN = "controlmsg, value column"


class BenchError(Exception):
    """A side failed or the outputs differ: the run stops with exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=counts, default=[1_000_000], metavar="N[,N...]",
                        help="synthetic events (default 1,000,000); several counts, comma-separated, run the whole "
                             "benchmark at each and end with a table of seconds per million events")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, the sides alternating (default 1)")
    parser.add_argument("--keys", type=int, default=5000, help="distinct users, skewed (default 5000)")
    parser.add_argument("--window", default="1h", help="tumbling window of the pipeline (default 1h)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every topic (default 4)")
    parser.add_argument("--tasks", type=int, default=2, help="write tasks of every write (default 2)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--skip-pipeline", action="store_true", help="measure write and read only")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (input, outputs, logs)")
    add_cluster_options(parser)
    return parser


def connector_app(master: str) -> SparkSession:
    """The benchmark's own application, with Spark's connector. Its producers are closed a second after
    their last use, not ten minutes: this application stays idle while the pipelines run, and the broker
    may stop before it ends."""
    return connector_session(master, "bench-vs-kafka-connector", conf={
        "spark.kafka.producer.cache.timeout": "1s", "spark.kafka.producer.cache.evictorThreadRunInterval": "1s"})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeat < 1:
        print("--repeat must be at least 1", file=sys.stderr)
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark

    package = connector_package()
    print(f"pyspark {pyspark.__version__}; Spark's Kafka connector: {package} (spark.jars.packages)", flush=True)
    try:
        spark = connector_app(args.master)
        jars = resolved_jars(spark)
    except Exception as exc:
        print(f"\nbench_vs_kafka_connector: this needs Spark's Kafka connector at the installed Spark version "
              f"(pyspark {pyspark.__version__}), {package}, and Spark did not start with it: {exc}\n"
              "Spark's lines above say whether it could be resolved. The connector is published for released "
              "Spark versions only (4.2.0 is the newest for pyspark 4.x when this was written): run the "
              "benchmark in an environment with such a pyspark, e.g. pip install 'pyspark==4.2.0'.",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-vs-"))
    benches: list[Bench] = []
    try:
        with kafka_cluster(args) as cluster:
            if set(cluster.config) != {"bootstrap.servers"}:
                print("note: the connector side gets bootstrap.servers only, not the other client settings",
                      flush=True)
            for i, events in enumerate(args.events):
                if i:
                    spark = connector_app(args.master)  # the last size's application has stopped
                started_load = load_average()
                sized = argparse.Namespace(**{**vars(args), "events": events})
                (work / f"events-{events}").mkdir(exist_ok=True)
                bench = Bench(sized, spark, work / f"events-{events}", cluster, jars)
                try:
                    bench.run()
                finally:
                    spark.stop()
                    delete_topics(cluster.config, bench.topics)
                bench.report(started_load)
                benches.append(bench)
    except BenchError as exc:
        print(f"\nbench_vs_kafka_connector: {exc} (work directory kept: {work})", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    if len(benches) > 1:
        report_scale(benches)
    if args.keep:
        print(f"work directory: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report_scale(benches: Sequence[Bench]) -> None:
    """Item 4 of issue 12: each size's figures as seconds per million events, and per million events
    added since the size before (the slope: the fixed costs, application start-ups above all, cancel)."""
    figures = [("write", CM, "write controlmsg"), ("write", KAFKA, "write connector"),
               ("write", VALUE_COLUMN, "write controlmsg, value column"),
               ("write", HEADERS, "write controlmsg, runTag headers"),
               ("write", NO_TAG, "write controlmsg, runTag none"),
               ("write", BARE, "write bare producer"),
               ("write", BARE_HEADERS, "write bare producer, headers"),
               ("read", CM, "read controlmsg"), ("read", KAFKA, "read connector"),
               ("pipeline", CM, "3-job pipeline"), ("pipeline", KAFKA, "connector stages"),
               ("pipeline", PLAIN, "plain query")]
    figures = [f for f in figures if (f[0], f[1]) in benches[0].samples]

    def seconds(bench: Bench, figure: str, side: str) -> float:
        value = statistics.median(bench.samples[figure, side])
        return bench.args.events / value if figure in ("write", "read") else value  # rates -> seconds

    print()
    print("Cost as the work grows: seconds per million events (and, after the first size, per million events "
          "added since the size before)")
    print()
    print("| events | " + " | ".join(name for _, _, name in figures) + " |")
    print("|---|" + "---|" * len(figures))
    previous: Bench | None = None
    for bench in benches:
        millions = bench.args.events / 1e6
        cells = []
        for figure, side, _ in figures:
            cell = f"{seconds(bench, figure, side) / millions:.1f}"
            if previous is not None:
                added = millions - previous.args.events / 1e6
                if added > 0:
                    slope = (seconds(bench, figure, side) - seconds(previous, figure, side)) / added
                    cell += f" ({slope:.1f})"
            cells.append(cell)
        print(f"| {bench.args.events:,} | " + " | ".join(cells) + " |")
        previous = bench


class Bench:
    """One run: the samples of each figure and side, over the rounds."""

    def __init__(self, args: argparse.Namespace, spark: SparkSession, work: Path, cluster: Cluster,
                 jars: str) -> None:
        self.args = args
        self.jars = jars  # the connector, resolved once: the stage applications load the same files
        self.spark = spark
        self.work = work
        self.cluster = cluster
        self.data = work / "events.parquet"
        self.prefix = f"bench-vs-{uuid.uuid4().hex[:8]}"
        self.topics: list[str] = []
        self.samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.details: list[str] = []
        self.output_rows = 0

    def new_topic(self, what: str) -> str:
        name = f"{self.prefix}-{what}"
        create_topic(dict(self.cluster.config), name, self.args.partitions)
        self.topics.append(name)
        return name

    def say(self, line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)

    # ------------------------------------------------------------------------------------------ the run

    def run(self) -> None:
        args = self.args
        data = self.data
        started = time.monotonic()
        synthetic_events(self.spark, args.events, args.keys).write.mode("overwrite").parquet(str(data))
        self.say(f"input: {args.events:,} events, {args.keys:,} skewed users, 30 days, as Parquet "
                 f"({time.monotonic() - started:.1f} s)")
        source = self.spark.read.parquet(str(data)).repartition(args.tasks).cache()
        expected = aggregate(source)
        if expected[0] != args.events:
            raise BenchError(f"the cached input has {expected[0]} rows, not {args.events}")
        self.warm_up(source)
        for r in range(args.repeat):
            self.write_and_read(r, source, expected)
        source.unpersist()
        self.spark.stop()  # the pipelines are applications of their own: this one leaves the cores to them
        if not args.skip_pipeline:
            for r in range(args.repeat):
                self.pipelines(r)
            self.last_hop_floor()

    def warm_up(self, source: DataFrame) -> None:
        """Both sides write and read 1,000 rows once, untimed, in as many tasks as the measured writes:
        Spark's Python workers (one per task: after a warm-up of one task, the first timed write started the
        second task's worker; at 1M its 5.9 s became 4.7 and 3.8 s), the connector's classes, and a fresh
        broker's transaction coordinator (its first transactional producer waits for it) are then ready
        for either side."""
        started = time.monotonic()
        sample = source.limit(1000).repartition(self.args.tasks).cache()
        sample.count()
        topics = {CM: self.new_topic("warm-up-cm"), KAFKA: self.new_topic("warm-up-kafka")}
        options = self.controlmsg_options(topics[CM], f"{self.prefix}-warm-up")
        self.write(CM, sample, options, topics[KAFKA])
        self.write(KAFKA, sample, options, topics[KAFKA])
        for side in (CM, KAFKA):
            aggregate(self.read(side, options, topics[KAFKA]))
        sample.unpersist()
        self.say(f"warm-up, both sides (not counted): {time.monotonic() - started:.1f} s")

    def controlmsg_options(self, topic: str, run_id: str) -> dict[str, str]:
        return {"topic": topic, "runId": run_id, "job": "bench", "timeout": "600",
                **{f"kafka.{k}": v for k, v in self.cluster.config.items()}}

    def write(self, side: str, df: DataFrame, options: dict[str, str], kafka_topic: str) -> None:
        if side == CM:
            (df.write.format("controlmsg").mode("append").options(**options)
             .option("key", "user").option("eventTime", "event_time").save())
        else:
            write_topic(df, self.cluster.servers, kafka_topic, "user")

    def read(self, side: str, options: dict[str, str], kafka_topic: str) -> DataFrame:
        if side == CM:
            return self.spark.read.format("controlmsg").options(**options).schema(EVENT_SCHEMA).load()
        return read_topic(self.spark, self.cluster.servers, kafka_topic, EVENT_SCHEMA)

    def write_and_read(self, r: int, source: DataFrame, expected: tuple[Any, ...]) -> None:
        args = self.args
        sides = (CM, KAFKA) if r % 2 == 0 else (KAFKA, CM)
        topics = {CM: self.new_topic(f"cm-{r}"), KAFKA: self.new_topic(f"kafka-{r}")}
        options = self.controlmsg_options(topics[CM], f"{self.prefix}-{r}")
        for side in sides:
            started = time.monotonic()
            self.write(side, source, options, topics[KAFKA])
            seconds = time.monotonic() - started
            self.samples["write", side].append(args.events / seconds)
            self.say(f"round {r + 1}: write {side}: {args.events / seconds:,.0f} rows/s ({seconds:.1f} s)")
        # controlmsg given the connector's own DataFrame: the value made by to_json in the JVM (option value);
        # then the run in two headers on every record (wire format 1), and without the run on the records at all
        from pyspark.sql import functions as F

        valued = source.select("user", "event_time", F.to_json(F.struct(*source.columns)).alias("value"))
        for variant, frame, more in ((VALUE_COLUMN, valued, {"value": "value"}),
                                     (HEADERS, source, {"runTag": "headers"}),
                                     (NO_TAG, source, {"runTag": "none"})):
            variant_topic = self.new_topic(f"cm-{variant.split(', ')[1].replace(' ', '-')}-{r}")
            variant_options = {**self.controlmsg_options(variant_topic, f"{self.prefix}-v{r}"), **more}
            started = time.monotonic()
            self.write(CM, frame, variant_options, topics[KAFKA])
            seconds = time.monotonic() - started
            status = run_status(variant_options)
            if status is None or status.get("rows") != args.events:
                raise BenchError(f"write {variant}: the run's status is {status}, not {args.events} rows")
            self.samples["write", variant].append(args.events / seconds)
            self.say(f"round {r + 1}: write {variant}: {args.events / seconds:,.0f} rows/s ({seconds:.1f} s)")
        for floor, name, run in ((BARE, f"bare-{r}", None), (BARE_HEADERS, f"bare-headers-{r}", f"{self.prefix}-{r}")):
            floor_topic = self.new_topic(name)
            started = time.monotonic()
            sent = bare_write(source, self.cluster.servers, floor_topic, "user", run)
            seconds = time.monotonic() - started
            stored = sum(end_offsets(dict(self.cluster.config), floor_topic).values())
            if sent != args.events or stored != args.events:
                raise BenchError(f"{floor}: {sent} rows sent, {stored} records in {floor_topic}, not {args.events}")
            self.samples["write", floor].append(args.events / seconds)
            self.say(f"round {r + 1}: write, a {floor} per Python task (a floor): "
                     f"{args.events / seconds:,.0f} rows/s ({seconds:.1f} s)")
        for side in sides:
            started = time.monotonic()
            got = aggregate(self.read(side, options, topics[KAFKA]))
            seconds = time.monotonic() - started
            if not same_values(got, expected):
                raise BenchError(f"read {side}: the records read back aggregate to {got}, the input to {expected}")
            self.samples["read", side].append(args.events / seconds)
            self.say(f"round {r + 1}: read {side}: {args.events / seconds:,.0f} rows/s ({seconds:.1f} s)")

    def pipelines(self, r: int) -> None:
        order = (CM, KAFKA, PLAIN) if r % 2 == 0 else (PLAIN, KAFKA, CM)
        outputs = {}
        for side in order:
            outputs[side] = self.work / f"{side.replace(' ', '-')}-{r}.csv"
            run = {CM: self.controlmsg_pipeline, KAFKA: self.connector_stages, PLAIN: self.plain_batch}[side]
            seconds = run(r, outputs[side])
            self.samples["pipeline", side].append(seconds)
        for side in (CM, KAFKA):
            rows, rounded = compare_outputs(outputs[side], outputs[PLAIN])
            self.say(f"round {r + 1}: {side} output = plain batch output: {rows:,} rows"
                     + (f" ({rounded} sums differ in the last digits only)" if rounded else ""))
            self.output_rows = rows

    def controlmsg_pipeline(self, r: int, output: Path) -> float:
        args = self.args
        run_id = f"{self.prefix}-p{r}"
        self.topics.extend(topic_names(run_id))
        try:
            seconds, summary = run_pipeline(
                self.data, output, self.work / f"pipeline-{r}", self.cluster.properties, window=args.window,
                sums=SUMS, master=args.master, tasks=args.tasks, timeout=1800,
                options=("--partitions", str(args.partitions), "--run-id", run_id))
        except JobFailed as exc:
            raise BenchError(str(exc)) from exc
        self.samples["eos", CM].append(float(summary["eos_to_sink_seconds"]))
        self.samples["eos hop", CM].append(float(summary["eos_last_hop_seconds"]))
        walls = summary["wall_seconds"]
        self.details.append(f"round {r + 1} controlmsg pipeline: {seconds:.1f} s; the jobs, started at once, "
                            "ended after " + ", ".join(f"{job} {walls[job]:.1f} s" for job in walls)
                            + f"; end of stream at the sink {summary['eos_to_sink_seconds']:.1f} s after "
                            f"ingest's, {summary['eos_last_hop_seconds']:.1f} s after the window job's")
        self.say(f"round {r + 1}: controlmsg pipeline {seconds:.1f} s")
        return seconds

    def last_hop_floor(self) -> None:
        """What the last hop cannot go below: the sink's own read of each round's window results, alone and
        warm. The window job writes each task's output in one transaction, so the sink (``read_committed``)
        sees none of it before the commit that also makes the end of stream visible; from there it must
        read and parse all of it (:func:`spark_jobs.batch.sink.read_results`). One application, every topic read
        once untimed first (Python workers, imports), then timed."""
        from pyspark.sql import SparkSession

        from spark_jobs.batch.sink import read_results
        from spark_jobs.checks import parquet_number_types

        spark = SparkSession.builder.master(self.args.master).appName("bench-last-hop-floor").getOrCreate()
        try:
            declared = parquet_number_types(str(self.data), SUMS)  # as the pipeline declares them
            sums = {f"sum_{c}": declared.get(c) for c in SUMS}
            for timed in (False, True):
                for r in range(self.args.repeat):
                    options = self.controlmsg_options(topic_names(f"{self.prefix}-p{r}")[1], f"{self.prefix}-p{r}")
                    started = time.monotonic()
                    parsed, _, rows = read_results(spark, options, sums)
                    seconds = time.monotonic() - started
                    parsed.unpersist()
                    if rows != self.output_rows:
                        raise BenchError(f"the sink's read of round {r + 1} gave {rows} rows, "
                                         f"the pipeline wrote {self.output_rows}")
                    if timed:
                        self.samples["eos floor", CM].append(seconds)
                        self.say(f"round {r + 1}: the sink's read of {rows:,} window results alone, "
                                 f"warm: {seconds:.1f} s")
        finally:
            spark.stop()

    def connector_stages(self, r: int, output: Path) -> float:
        args = self.args
        servers = ["--bootstrap-servers", self.cluster.servers, "--master", args.master, "--jars", self.jars]
        sums = [x for c in SUMS for x in ("--sum", c)]
        started = time.monotonic()
        events, windows = self.new_topic(f"kafka-events-{r}"), self.new_topic(f"kafka-windows-{r}")
        stages = {
            "ingest": ["--input", str(self.data), "--key", "user", "--event-time", "event_time", "--topic", events,
                       "--tasks", str(args.tasks), "--rejects", f"{output}.rejects.jsonl", *sums],
            "window": ["--input-topic", events, "--output-topic", windows, "--window", args.window,
                       "--schema", INGESTED_SCHEMA, "--tasks", str(args.tasks), *sums],
            "sink": ["--input-topic", windows, "--output", str(output), "--schema", WINDOWS_SCHEMA, *sums],
        }
        times = []
        for stage, extra in stages.items():
            seconds = run_process([sys.executable, str(CONNECTOR_JOBS), stage, *extra, *servers],
                                  self.work / f"connector-{stage}-{r}.log")
            times.append(f"{stage} {seconds:.1f} s")
        total = time.monotonic() - started
        self.details.append(f"round {r + 1} connector stages, one after another: {total:.1f} s ({', '.join(times)})")
        self.say(f"round {r + 1}: connector stages {total:.1f} s")
        return total

    def plain_batch(self, r: int, output: Path) -> float:
        args = self.args
        cmd = [sys.executable, str(CONNECTOR_JOBS), "batch", "--input", str(self.data), "--key", "user",
               "--event-time", "event_time", "--window", args.window, "--output", str(output),
               "--master", args.master, *[x for c in SUMS for x in ("--sum", c)]]
        seconds = run_process(cmd, self.work / f"plain-batch-{r}.log")
        self.say(f"round {r + 1}: plain batch query {seconds:.1f} s")
        return seconds

    # ------------------------------------------------------------------------------------------ the table

    def report(self, started_load: str) -> None:
        import pyspark

        args = self.args
        med = {key: statistics.median(values) for key, values in self.samples.items()}
        print()
        print("| figure | controlmsg | Spark's connector | controlmsg / connector |")
        print("|---|---|---|---|")
        for figure, what in (("write", "write rows/s, same cached rows and topic layout"),
                             ("read", "read to an aggregate of every JSON field, rows/s")):
            cm, kafka = med[figure, CM], med[figure, KAFKA]
            print(f"| {what} | {rate(cm)} | {rate(kafka)} | {cm / kafka:.2f} ({verdict(cm / kafka)}) |")
            if figure == "write":
                valued = med["write", VALUE_COLUMN]
                print(f"| write of the connector's own DataFrame (option `value`: the payload made by to_json in the "
                      f"JVM, no Python object per row; the run in the envelope as by default), rows/s | "
                      f"{rate(valued)} | "
                      f"{rate(kafka)} | {valued / kafka:.2f} ({verdict(valued / kafka)}) |")
                headed = med["write", HEADERS]
                print(f"| write with the run and the task in two headers on every record (`runTag headers`, wire "
                      f"format 1), rows/s | {rate(headed)} | {rate(kafka)} | {headed / kafka:.2f} "
                      f"(default / this: {cm / headed:.2f}) |")
                plain = med["write", NO_TAG]
                print(f"| write without the run on the records (`runTag none`, for a topic of one run), rows/s | "
                      f"{rate(plain)} | {rate(kafka)} | {plain / kafka:.2f} (default / this: {cm / plain:.2f}) |")
                bare = med["write", BARE]
                print(f"| the write's floor: a bare confluent-kafka Producer in each Python task (mapInArrow, orjson "
                      f"per row; no envelope, headers or transaction), rows/s | {rate(bare)} | {rate(kafka)} | "
                      f"{bare / kafka:.2f} (controlmsg / floor: {cm / bare:.2f}) |")
                floor = med["write", BARE_HEADERS]
                print(f"| the floor with the same two headers on each record (`controlmsg-run`, `controlmsg-task`; "
                      f"what `runTag headers` writes), rows/s | {rate(floor)} | {rate(kafka)} | {floor / kafka:.2f} "
                      f"(`runTag headers` / this floor: {headed / floor:.2f}) |")
        if ("pipeline", CM) in med:
            cm, kafka, plain = med["pipeline", CM], med["pipeline", KAFKA], med["pipeline", PLAIN]
            print(f"| 3-job pipeline vs the same 3 stages run one after another, s | {cm:.1f} s | {kafka:.1f} s | "
                  f"{cm / kafka:.2f} ({verdict(kafka / cm)}) |")
            print(f"| 3-job pipeline vs one plain Spark batch query over the file, s | {cm:.1f} s | "
                  f"{plain:.1f} s (plain query) | {cm / plain:.2f} (pipeline / plain query) |")
            print(f"| end of stream reaches the sink after ingest's last end of stream (the window job's "
                  f"aggregation of everything and its output in between) | {med['eos', CM]:.1f} s | - | goal < 2 s |")
            print(f"| end of stream reaches the sink after the window job's last end of stream (the last hop) | "
                  f"{med['eos hop', CM]:.1f} s | - | goal < 2 s |")
            print(f"| the last hop's floor: the sink's read and parse of the window results alone, warm (nothing "
                  f"of them is readable before the end of stream's commit) | {med['eos floor', CM]:.1f} s | - | - |")
        print()
        rounds = f"{args.repeat} rounds, medians" if args.repeat > 1 else "1 round"
        print(f"{datetime.now(UTC):%Y-%m-%d}, this machine: {os.cpu_count()} cores, load average "
              f"{started_load} at the start and {load_average()} at the end (the benchmark's own applications "
              f"make most of it; other work would skew every figure); pyspark {pyspark.__version__}, "
              f"{connector_package()}; "
              f"{args.events:,} events, {args.keys:,} skewed users, 30 days, {args.partitions} partitions, "
              f"{args.tasks} write tasks, master {args.master}, {rounds}.")
        if self.output_rows:
            print(f"The three pipelines wrote the same {self.output_rows:,} window rows ({args.window} windows).")
        if args.repeat > 1:
            for (figure, side), values in sorted(self.samples.items()):
                shown = ", ".join(rate(v) if figure in ("write", "read") else f"{v:.1f} s" for v in values)
                print(f"  {figure} {side}: {shown}")
        for line in self.details:
            print(f"  {line}")


def bare_write(df: DataFrame, servers: str, topic: str, key: str, run: str | None = None) -> int:
    """The floor of a write from Spark's Python workers: each task sends its rows with a bare
    confluent-kafka ``Producer`` (``orjson.dumps`` of each row's dict, the key column as the key,
    librdkafka's defaults; no envelope, no headers, no transaction, no event times, no watermarks or end
    of stream), through ``mapInArrow``, the same Arrow batches a data source's write task gets. With
    ``run``, each record carries the two headers controlmsg's default puts on a data record (the run, and
    the task named as controlmsg names it), passed as controlmsg passes them. Returns the rows sent, all
    delivered."""
    from pyspark.sql import functions as F

    def produce(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from confluent_kafka import Producer
        from pyspark import TaskContext

        producer = Producer({"bootstrap.servers": servers})
        send, dumps, sent = producer.produce, orjson.dumps, 0
        headers: list[tuple[str, str | bytes | None]] = []
        if run is not None:
            context = TaskContext.get()
            task = f"bench-{run}-p{context.partitionId() if context is not None else 0}"
            headers = [("controlmsg-run", run.encode()), ("controlmsg-task", task.encode())]
        for batch in batches:
            pairs = zip(batch.to_pylist(), batch.column(key).to_pylist(), strict=True)
            if not headers:
                for row, k in pairs:
                    try:
                        send(topic, dumps(row), k)
                    except BufferError:  # the local queue is full: let librdkafka drain it
                        producer.poll(0.05)
                        send(topic, dumps(row), k)
            else:
                for row, k in pairs:
                    try:
                        send(topic, dumps(row), k, -1, None, None, 0, headers)
                    except BufferError:
                        producer.poll(0.05)
                        send(topic, dumps(row), k, -1, None, None, 0, headers)
            producer.poll(0)
            sent += batch.num_rows
        if producer.flush(120):
            raise RuntimeError(f"bare producer: records to {topic} not delivered in 120 s")
        yield pa.RecordBatch.from_pydict({"rows": [sent]})

    row = df.mapInArrow(produce, "rows long").agg(F.sum("rows")).first()
    assert row is not None
    return int(row[0])


def aggregate(df: DataFrame) -> tuple[Any, ...]:
    """Count, and a figure of every field: what a read must give back whole."""
    from pyspark.sql import functions as F

    row = df.agg(F.count(F.lit(1)), F.count("user"), F.sum("amount"), F.sum("items"), F.min("event_time"),
                 F.max("event_time")).first()
    assert row is not None
    return tuple(row)


def same_values(got: Sequence[Any], expected: Sequence[Any]) -> bool:
    return len(got) == len(expected) and all(
        a == b or (isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9))
        for a, b in zip(got, expected, strict=True))


def compare_outputs(path: Path, oracle: Path) -> tuple[int, int]:
    """Compare two result files row for row (after sorting by key and window start); numbers that differ
    only within 1e-9 relative (sums of doubles added in another order) count as equal. Returns (rows,
    values equal only within the tolerance); raises :class:`BenchError` on any other difference."""
    def rows(p: Path) -> tuple[list[str], list[list[str]]]:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader)
            return header, sorted(reader, key=lambda row: (row[0], row[1]))

    head_a, a = rows(path)
    head_b, b = rows(oracle)
    if head_a != head_b or len(a) != len(b):
        raise BenchError(f"{path.name}: columns {head_a}, {len(a)} rows; {oracle.name}: {head_b}, {len(b)} rows")
    rounded = 0
    for row_a, row_b in zip(a, b, strict=True):
        for name, x, y in zip(head_a, row_a, row_b, strict=True):
            if x == y:
                continue
            try:
                close = math.isclose(float(x), float(y), rel_tol=1e-9)
            except ValueError:
                close = False
            if not close:
                raise BenchError(f"{path.name} and {oracle.name} differ: {name} {x!r} vs {y!r} in {row_a} / {row_b}")
            rounded += 1
    return len(a), rounded


def run_process(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` to its end with its output in ``log`` (``harness.run_job``); returns its wall time.
    Raises :class:`BenchError` with the log's tail when it fails."""
    try:
        return run_job(" ".join(cmd[1:3]), cmd, log, timeout=PROCESS_TIMEOUT_S).seconds
    except JobFailed as exc:
        raise BenchError(str(exc)) from exc


def rate(value: float) -> str:
    return f"{value / 1000:,.0f}k" if value >= 10_000 else f"{value:,.0f}"


def verdict(speed_ratio: float) -> str:
    """``speed_ratio``: controlmsg's speed over the connector's."""
    return f"{speed_ratio:.2f}x as fast" if speed_ratio >= 1 else f"{1 / speed_ratio:.2f}x slower"


if __name__ == "__main__":
    sys.exit(main())
