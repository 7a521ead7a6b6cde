"""The windowed count's three stages done with Spark's own Kafka connector, and the one plain batch query.

    python benchmarks/connector_jobs.py ingest --input F --topic T --key COL --event-time COL --sum COL ...
    python benchmarks/connector_jobs.py window --input-topic T --output-topic U --window 1h --schema DDL ...
    python benchmarks/connector_jobs.py sink --input-topic U --output F.csv --schema DDL ...
    python benchmarks/connector_jobs.py batch --input F --output F.csv --key COL --event-time COL --window 1h ...
    python benchmarks/connector_jobs.py stream-ingest --source-topic S --topic T --schema DDL --key COL ...
    python benchmarks/connector_jobs.py stream-window --input-topic T --output-topic U --schema DDL --window 1s ...
    python benchmarks/connector_jobs.py jars

Each call is its own Spark application, as an orchestrator would run the stages one after another; the
connector (``org.apache.spark:spark-sql-kafka-0-10_<scala>`` at the installed Spark version) comes from
``--jars`` (its jar files, as on a cluster that has them installed), else from ``spark.jars.packages``.
The stages do what ``spark_jobs.batch.ingest``, ``window_aggregate`` and ``sink`` do, with the same helpers
(``spark_jobs.events``) and the same output file, but through ``format("kafka")``: values
``to_json(struct(*))`` keyed by the key column, read back with ``from_json`` and a schema the user
states. A topic read by a stage is read from its earliest to its latest offsets: the stage before it has
finished, so everything is there. ``batch`` is ``spark_jobs.events.windowed_oracle`` over the file.
Used by ``bench_vs_kafka_connector.py``.

``stream-ingest`` and ``stream-window`` are the streaming chain (``spark_jobs.runtime.ingest`` ->
``spark_jobs.runtime.window``) as a user of Structured Streaming writes it with the connector, one
unbounded query each: raw JSON source topic -> ``{"key", "event_ms", <carried>}`` -> events topic; events
topic -> ``withWatermark`` (the allowed lateness) -> tumbling-window count and sums in append mode ->
``{"key", "window_start", "window_end", "count", "sum_<c>"}`` (epoch ms) -> windows topic; values
``to_json(struct(*))`` keyed by ``key``, checkpoints in ``--checkpoint``. Each logs ``query started``
once its query runs, and runs until it is stopped (SIGTERM), fails, or ``--parent-pid`` is no longer its
parent: an unbounded Kafka source never ends, so neither does the query, and the windows of the last
``allowed lateness`` of event time are never closed. ``jars`` resolves the connector and prints its jar
files, comma-separated, as ``--jars`` takes them (exit status 2 and the reason when it cannot be had).
Used by ``bench_stages.py``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def connector_package() -> str:
    """The Maven coordinate of Spark's Kafka connector for the installed pyspark: its Scala binary
    version and Spark version are read from the ``spark-sql_<scala>-<version>.jar`` pyspark ships."""
    import pyspark

    for jar in sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar")):
        match = re.fullmatch(r"spark-sql_(\d+\.\d+)-(.+)\.jar", jar.name)
        if match:
            return f"org.apache.spark:spark-sql-kafka-0-10_{match[1]}:{match[2]}"
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def connector_session(master: str, app_name: str, jars: str | None = None,
                      conf: dict[str, str] | None = None) -> SparkSession:
    """A Spark application set up as the pipeline's jobs are (:func:`controlmsg.spark.spark_session`),
    with the connector on its class path: ``jars`` (comma-separated jar files, as ``spark.jars``), else
    resolved by ``spark.jars.packages``. ``conf``: more Spark settings."""
    from controlmsg.spark import spark_session

    classpath = {"spark.jars": jars} if jars else {"spark.jars.packages": connector_package()}
    return spark_session(master, app_name, conf={**classpath, **(conf or {})})


def resolved_jars(spark: SparkSession) -> str:
    """The jar files a session started by :func:`connector_session` resolved (``spark.jars``)."""
    return str(spark.sparkContext.getConf().get("spark.jars", ""))


def write_topic(df: DataFrame, servers: str, topic: str, key: str) -> None:
    """Every row as ``to_json(struct(*))``, keyed by ``key`` (as a string), with the connector."""
    from pyspark.sql import functions as F

    (df.select(F.col(key).cast("string").alias("key"), F.to_json(F.struct(*df.columns)).alias("value"))
     .write.format("kafka").mode("append").option("kafka.bootstrap.servers", servers).option("topic", topic)
     .save())


def read_topic(spark: SparkSession, servers: str, topic: str, schema: str) -> DataFrame:
    """The whole topic (earliest to latest offsets), values parsed by ``from_json`` with ``schema``."""
    from pyspark.sql import functions as F

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
           .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    return raw.select(F.from_json(F.col("value").cast("string"), schema).alias("r")).select("r.*")


def ingest(spark: SparkSession, args: argparse.Namespace) -> None:
    """File -> topic keyed by the key column; rejects (null key, unparseable time) to a file, as the
    pipeline's ingest does."""
    from pyspark.sql import functions as F

    from spark_jobs.events import EVENT_MS, read_table, split_rejects_observed, write_table, write_tasks

    # The connector's batch write goes through Spark's V1 path by default (kafka is in
    # spark.sql.sources.useV1SourceList), where the query runs inside a command and its observed metrics never
    # reach the Observation: seen.get would wait forever. Through the V2 path (the same KafkaDataWriter per
    # task), the write's own pass counts the rejects, as the pipeline's ingest does with format("controlmsg").
    v1 = [s for s in str(spark.conf.get("spark.sql.sources.useV1SourceList")).split(",") if s.strip() != "kafka"]
    spark.conf.set("spark.sql.sources.useV1SourceList", ",".join(v1))
    df = read_table(spark, args.input)
    good, rejects, seen = split_rejects_observed(df, args.key, args.event_time)
    records = write_tasks(good.select(F.col(args.key).cast("string").alias("key"), F.col(EVENT_MS).alias("event_ms"),
                                      *[F.col(c) for c in args.sum]), args.tasks, df.rdd.getNumPartitions())
    write_topic(records, args.bootstrap_servers, args.topic, "key")
    if seen.get["rejects"]:  # as the pipeline's ingest: a pass for the rejects only when the write saw some
        write_table(rejects, args.rejects or f"{args.topic}.rejects.jsonl")


def window(spark: SparkSession, args: argparse.Namespace) -> None:
    """Topic -> count and sums per key and tumbling window -> topic."""
    from spark_jobs.batch.window_aggregate import aggregate_windows
    from spark_jobs.events import parse_duration

    records = read_topic(spark, args.bootstrap_servers, args.input_topic, args.schema)
    windows = aggregate_windows(records, parse_duration(args.window), args.sum)
    write_topic(windows.repartition(args.tasks), args.bootstrap_servers, args.output_topic, "key")


def sink(spark: SparkSession, args: argparse.Namespace) -> None:
    """Topic of window results -> one file sorted by key and window start, as the pipeline's sink."""
    from pyspark.sql import functions as F

    from spark_jobs.events import iso_utc, write_table

    results = read_topic(spark, args.bootstrap_servers, args.input_topic, args.schema)
    sums = [f"sum_{c}" for c in args.sum]
    out = results.select(
        "key", iso_utc(F.col("window_start")).alias("window_start"),
        iso_utc(F.col("window_end")).alias("window_end"), "count", *sums,
    ).orderBy("key", "window_start")
    write_table(out, args.output)


def batch(spark: SparkSession, args: argparse.Namespace) -> None:
    """The same result from the file in one plain Spark batch query (no Kafka)."""
    from spark_jobs.events import parse_duration, windowed_oracle, write_table

    out = windowed_oracle(spark, args.input, key=args.key, event_time=args.event_time,
                          window_ms=parse_duration(args.window), sums=args.sum)
    write_table(out.orderBy("key", "window_start"), args.output)


def spark_interval(text: str) -> str:
    """A duration of ``spark_jobs.events.parse_duration`` as a Spark interval string."""
    from spark_jobs.events import parse_duration

    return f"{parse_duration(text)} milliseconds"


def _run_stream(df: DataFrame, args: argparse.Namespace, topic: str) -> None:
    """Start ``df``'s rows as ``to_json(struct(*))`` keyed by ``key`` to ``topic`` (append mode), log
    ``query started``, then a line per micro-batch done (``batch N done: ...``: rows read, rows its state
    operators dropped as older than the watermark, and their total), until the query ends or fails, or
    ``--parent-pid`` is gone (then stop it)."""
    import os

    from pyspark.sql import functions as F

    writer = (df.select(F.col("key").cast("string").alias("key"), F.to_json(F.struct(*df.columns)).alias("value"))
              .writeStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
              .option("topic", topic).option("checkpointLocation", args.checkpoint).outputMode("append"))
    if args.trigger_interval:
        writer = writer.trigger(processingTime=spark_interval(args.trigger_interval))
    query = writer.start()
    print(f"connector {args.stage}: query started ({query.id})", flush=True)
    done, dropped = -1, 0
    while not query.awaitTermination(1):
        for progress in query.recentProgress:
            # Executed micro-batches only: an idle trigger reports a progress too, with the next batch's id.
            if progress.batchId > done and "addBatch" in progress.durationMs:
                done = progress.batchId
                late = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
                dropped += late
                phases = ", ".join(f"{k} {v}" for k, v in progress.durationMs.items() if k != "triggerExecution")
                print(f"connector {args.stage}: batch {done} done: {progress.numInputRows} rows read, {late} dropped "
                      f"by the watermark (total {dropped}), {progress.batchDuration} ms ({phases})", flush=True)
        if args.parent_pid is not None and os.getppid() != args.parent_pid:
            print(f"connector {args.stage}: parent {args.parent_pid} gone, stopping", flush=True)
            query.stop()
            return


def stream_ingest(spark: SparkSession, args: argparse.Namespace) -> None:
    """Raw JSON source topic -> ``{"key", "event_ms", <carried>}`` -> events topic, unbounded; records with
    no key or no event time are dropped."""
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
           .option("subscribe", args.source_topic).option("startingOffsets", "earliest").load())
    rows = raw.select(F.from_json(F.col("value").cast("string"), args.schema).alias("r")).select("r.*")
    event_ms = F.unix_millis(F.col(args.event_time).cast("timestamp"))
    events = (rows.select(F.col(args.key).cast("string").alias("key"), event_ms.alias("event_ms"),
                          *[F.col(c) for c in args.carry])
              .where(F.col("key").isNotNull() & F.col("event_ms").isNotNull()))
    _run_stream(events, args, args.topic)


def stream_window(spark: SparkSession, args: argparse.Namespace) -> None:
    """Events topic -> count and sums per key and tumbling window, each emitted once when Spark's watermark
    (the largest event time seen minus ``--allowed-lateness``) passes its end -> windows topic."""
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap_servers)
           .option("subscribe", args.input_topic).option("startingOffsets", "earliest").load())
    events = (raw.select(F.from_json(F.col("value").cast("string"), args.schema).alias("r")).select("r.*")
              .withColumn("ts", F.timestamp_millis(F.col("event_ms")))
              .withWatermark("ts", spark_interval(args.allowed_lateness)))
    windows = events.groupBy(F.window("ts", spark_interval(args.window)), "key").agg(
        F.count(F.lit(1)).alias("count"), *[F.sum(c).alias(f"sum_{c}") for c in args.sum])
    out = windows.select("key", F.unix_millis(F.col("window.start")).alias("window_start"),
                         F.unix_millis(F.col("window.end")).alias("window_end"), "count",
                         *[f"sum_{c}" for c in args.sum])
    _run_stream(out, args, args.output_topic)


def jars(spark: SparkSession, args: argparse.Namespace) -> None:
    """Print the connector's jar files as this session resolved them, comma-separated."""
    print(resolved_jars(spark), flush=True)


def _add_stream_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingest_p = sub.add_parser("stream-ingest")
    ingest_p.add_argument("--source-topic", required=True)
    ingest_p.add_argument("--topic", required=True, help="the events topic")
    ingest_p.add_argument("--key", required=True)
    ingest_p.add_argument("--event-time", required=True, help="a field Spark casts to a timestamp")
    ingest_p.add_argument("--carry", action="append", default=[], help="a field to carry (repeatable)")
    window_p = sub.add_parser("stream-window")
    window_p.add_argument("--input-topic", required=True)
    window_p.add_argument("--output-topic", required=True)
    window_p.add_argument("--window", required=True)
    window_p.add_argument("--allowed-lateness", required=True)
    window_p.add_argument("--sum", action="append", default=[], help="a summed column (repeatable)")
    for p in (ingest_p, window_p):
        p.add_argument("--schema", required=True, help="DDL of the JSON values read")
        p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
        p.add_argument("--trigger-interval", help="processing-time trigger (default: Spark's, each micro-batch "
                                                  "as soon as the one before has ended)")
        p.add_argument("--parent-pid", type=int, help="stop once process PID is no longer the parent")
    sub.add_parser("jars")
    for p in (ingest_p, window_p, sub.choices["jars"]):
        p.add_argument("--master", default="local[*]")
        p.add_argument("--bootstrap-servers", required=p is not sub.choices["jars"])
        p.add_argument("--jars", help="the connector's jar files, comma-separated (default: resolved by "
                                      "spark.jars.packages)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="stage", required=True)
    stages = {name: sub.add_parser(name) for name in ("ingest", "window", "sink", "batch")}
    for name, p in stages.items():
        p.add_argument("--master", default="local[*]")
        p.add_argument("--sum", action="append", default=[], help="a summed column (repeatable)")
        if name != "batch":
            p.add_argument("--bootstrap-servers", required=True)
            p.add_argument("--jars", help="the connector's jar files, comma-separated (default: resolved by "
                                          "spark.jars.packages)")
    for name in ("ingest", "batch"):
        stages[name].add_argument("--input", required=True)
        stages[name].add_argument("--key", required=True)
        stages[name].add_argument("--event-time", required=True)
    stages["ingest"].add_argument("--topic", required=True)
    stages["ingest"].add_argument("--rejects")
    stages["window"].add_argument("--input-topic", required=True)
    stages["window"].add_argument("--output-topic", required=True)
    stages["sink"].add_argument("--input-topic", required=True)
    for name in ("window", "batch"):
        stages[name].add_argument("--window", required=True)
    for name in ("ingest", "window"):
        stages[name].add_argument("--tasks", type=int, default=2, help="write tasks")
    for name in ("window", "sink"):
        stages[name].add_argument("--schema", required=True, help="DDL of the JSON values read")
    for name in ("sink", "batch"):
        stages[name].add_argument("--output", required=True, help="the result file (.csv, .jsonl, .parquet)")
    _add_stream_parsers(sub)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    if args.stage == "batch":  # no Kafka: no connector either
        from controlmsg.spark import spark_session

        spark = spark_session(args.master, "plain-batch-query")
    else:
        try:
            spark = connector_session(args.master, f"kafka-connector-{args.stage}", args.jars)
        except Exception as exc:
            if args.stage != "jars":
                raise
            print(f"Spark's Kafka connector {connector_package()} cannot be had: {exc}", file=sys.stderr)
            return 2
    stages = {"ingest": ingest, "window": window, "sink": sink, "batch": batch, "stream-ingest": stream_ingest,
              "stream-window": stream_window, "jars": jars}
    try:
        stages[args.stage](spark, args)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
