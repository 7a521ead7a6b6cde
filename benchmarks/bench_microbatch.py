"""What one micro-batch of a windowed Structured Streaming query costs, by source and sink: the floor under
the stages' latency (issue 40, item 1).

    python benchmarks/bench_microbatch.py [--variants kafka>kafka,kafka>noop,controlmsg>noop,controlmsg>controlmsg]
        [--seconds 30] [--rounds 2] [--rate 2000] [--master local[2]]

One Spark application, one broker. For each run of a variant, a feeder thread writes ``--rate`` events/s
(event time = the wall clock, 20 keys) to two topics of 2 partitions: a plain one (JSON values, for Spark's
Kafka connector) and an intermediate one (controlmsg's envelope, one upstream task, a watermark every 200 ms).
Each variant is the window stage's query (``groupBy(window(ts, 1 s), key).count()``, append mode, 2 shuffle
partitions, the default trigger: the next micro-batch as soon as the last one ends), from a source to a sink:

* ``kafka``: Spark's Kafka connector, ``withWatermark(ts, 500 ms)`` (needs pyspark 4.2.0 or older: the
  connector's jar; unavailable otherwise, said so);
* ``controlmsg``: ``format("controlmsg")``, ``controlmsg.spark.with_watermark`` (the reconciled watermark);
* ``noop``: Spark's ``format("noop")`` sink, which writes nothing: the source and the aggregation alone.

Each variant runs ``--seconds`` on fresh topics, feeder and checkpoint, alone, in the order given, then the
next round in the reverse order. Per variant and round: the executed micro-batches after the first three, and
the median of Spark's own phases (``durationMs``: ``triggerExecution`` is the whole micro-batch). The
differences between variants attribute a micro-batch's time to the source and to the sink.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from common import add_cluster_options, kafka_cluster, load_average
from confluent_kafka import Producer

from controlmsg.kafka.admin import create_topic
from controlmsg.kafka.writer import ControlWriter

PHASES = ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets")
VARIANTS = ("kafka>kafka", "kafka>noop", "controlmsg>noop", "controlmsg>controlmsg")
SKIP = 3


class Feeder(threading.Thread):
    """Writes ``rate`` events/s to the plain topic and the intermediate one until :meth:`stop`."""

    def __init__(self, config: dict[str, str], plain: str, intermediate: str, run: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.config, self.plain, self.intermediate, self.run_id, self.rate = config, plain, intermediate, run, rate
        self._halt = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        try:
            self._feed()
        except BaseException as exc:  # reported by main
            self.error = exc

    def _feed(self) -> None:
        producer = Producer({**self.config, "linger.ms": 20})
        writer = ControlWriter(self.config, self.intermediate, task_name="feeder", task_count=1,
                               run_id=self.run_id, run_in_envelope=True)
        started = time.monotonic()
        next_watermark = started
        try:
            while not self._halt.is_set():
                due = int((time.monotonic() - started) * self.rate)
                now_ms = int(time.time() * 1000)
                for _ in range(due - self.sent):
                    key = f"k{self.sent % 20}"
                    value = {"key": key, "event_ms": now_ms}
                    producer.produce(self.plain, orjson.dumps(value), key=key)
                    writer.send(value, key=key)
                    self.sent += 1
                producer.poll(0)
                if time.monotonic() >= next_watermark:
                    writer.send_watermark(now_ms - 1)
                    next_watermark += 0.2
                time.sleep(0.01)
        finally:
            producer.flush(30)
            writer.close()


def windows(df: Any, watermark: Any) -> Any:
    from pyspark.sql import functions as F

    events = watermark(df.withColumn("ts", F.timestamp_millis("event_ms")))
    return (events.groupBy(F.window("ts", "1 second"), "key").agg(F.count(F.lit(1)).alias("count"))
            .select("key", F.unix_millis(F.col("window.start")).alias("window_start"),
                    F.unix_millis(F.col("window.end")).alias("window_end"), "count"))


def start(spark: Any, variant: str, config: dict[str, str], topics: dict[str, str], run: str,
          checkpoint: str, *, late: bool = False, late_hold: str | None = None,
          available_now: bool = False, log_phases: bool = False) -> tuple[Any, Any]:
    """The variant's query, started, and with ``late`` (a controlmsg source) the late records' query beside
    it, as the example window stage runs them (``late_hold``: a micro-batch of it at most that often, e.g.
    ``10s``, through the source's ``maxTriggerDelay``); ``available_now``: both run ``availableNow`` (a controlmsg
    source: until its end of stream) as that stage does."""
    from pyspark.sql import functions as F

    from controlmsg.spark import WATERMARK_COLUMNS, late_records, with_watermark

    source, sink = variant.split(">")
    servers = config["bootstrap.servers"]

    phases = {"logPhases": "true"} if log_phases else {}

    def intermediate(**more: str) -> Any:
        more = {**phases, **more}
        return (spark.readStream.format("controlmsg")
                .options(topic=topics["intermediate"], runId=run, **{"kafka.bootstrap.servers": servers}, **more)
                .schema(f"key string, event_ms long, {WATERMARK_COLUMNS}").load())
    if source == "kafka":
        raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
               .option("subscribe", topics["plain"]).option("startingOffsets", "latest").load())
        parsed = raw.select(F.from_json(F.col("value").cast("string"), "key string, event_ms long").alias("r"))
        out = windows(parsed.select("r.*"), lambda d: d.withWatermark("ts", "500 milliseconds"))
    else:
        out = windows(intermediate(), lambda d: with_watermark(d, "ts"))
    side = None
    if late and source == "controlmsg":
        held = {"minOffsetsPerTrigger": "100000000", "maxTriggerDelay": late_hold} if late_hold else {}
        kept = late_records(intermediate(**held).withColumn("ts", F.timestamp_millis("event_ms")), "ts").select(
            "key", "event_ms")
        side_writer = (kept.writeStream.format("controlmsg")
                       .options(topic=topics["late"], runId=run, key="key", eventTime="event_ms", partitions="1",
                                **{"kafka.bootstrap.servers": servers})
                       .option("checkpointLocation", f"{checkpoint}-late"))
        side = (side_writer.trigger(availableNow=True) if available_now else side_writer).start()
    if sink == "noop":
        writer = out.writeStream.format("noop")
    elif sink == "kafka":
        writer = (out.select(F.col("key"), F.to_json(F.struct(*out.columns)).alias("value")).writeStream
                  .format("kafka").option("kafka.bootstrap.servers", servers).option("topic", topics["out"]))
    else:
        writer = (out.writeStream.format("controlmsg")
                  .options(topic=topics["out-controlmsg"], runId=run, key="key",
                           eventTime="window_end", partitions="2", **{"kafka.bootstrap.servers": servers},
                           **phases))
    writer = writer.outputMode("append").option("checkpointLocation", checkpoint)
    if available_now and source == "controlmsg":
        writer = writer.trigger(availableNow=True)
    return writer.start(), side


def spark_cpu() -> float:
    """CPU seconds so far of this process's descendants but a Kafka broker's: the Spark JVM and its Python
    workers (the feeder is a thread of this process, not counted). Linux ``/proc``; 0 elsewhere."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            if b"kafka.Kafka" in (entry / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(entry.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += (int(stats[pid][11]) + int(stats[pid][12])) / ticks  # utime, stime
        todo.extend(children.get(pid, []))
    return total


def measure(query: Any, seconds: float, side: Any = None, *, verbose: bool = False) -> dict[str, Any]:
    """Run ``query`` (and ``side``) for ``seconds``, stop them; ``query``'s executed micro-batches' phases after
    the first :data:`SKIP`, and how many ``side`` ran."""
    cpu, began = spark_cpu(), time.monotonic()
    deadline = began + seconds
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        time.sleep(0.5)
    progress = [p for p in query.recentProgress if "addBatch" in p.durationMs]
    cpu, took = spark_cpu() - cpu, time.monotonic() - began
    query.stop()
    if verbose:
        for p in progress:
            print(f"  batch {p.batchId}: {p.numInputRows} rows, {p.durationMs.get('triggerExecution')} ms "
                  f"(addBatch {p.durationMs.get('addBatch')}), watermark {p.eventTime.get('watermark')}", flush=True)
    beside: dict[str, float] = {}
    if side is not None:
        beside["side_batches"] = len([p for p in side.recentProgress if "addBatch" in p.durationMs])
        side.stop()
    rows = sum(p.numInputRows for p in progress)
    beside["cores_busy"] = round(cpu / took, 2)  # the Spark application's CPU over the run, in cores
    beside["cpu_ms_per_1k_rows"] = round(1000 * cpu / max(rows, 1) * 1000, 1)
    kept = progress[SKIP:]
    if not kept:
        return {"batches": len(progress), **beside}
    result: dict[str, Any] = {"batches": len(kept), "rows": statistics.median(p.numInputRows for p in kept),
                              **beside}
    for phase in PHASES:
        result[phase] = statistics.median(p.durationMs.get(phase, 0) for p in kept)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", type=int, default=2000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--warmup", type=float, default=15.0,
                   help="seconds of the first variant, not measured, before the rounds (a new broker loads its "
                        "transaction coordinator at the first transactional producer)")
    p.add_argument("--verbose", action="store_true", help="each micro-batch's rows, time and watermark")
    p.add_argument("--late", action="store_true", help="controlmsg sources: the late records' query beside")
    p.add_argument("--log-phases", action="store_true",
                   help="controlmsg's phase lines (logPhases, docs/SPARK.md) on stderr")
    p.add_argument("--late-hold", help="with --late: the late query's maxTriggerDelay (e.g. 10s)")
    p.add_argument("--available-now", action="store_true", help="controlmsg sources: trigger availableNow")
    add_cluster_options(p)
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    import pyspark
    from connector_jobs import connector_session

    conf = {"spark.sql.shuffle.partitions": "2"}
    connector = any(v.startswith("kafka") or v.endswith("kafka") for v in variants)
    if connector and tuple(int(x) for x in pyspark.__version__.split(".")[:2]) > (4, 2):
        print(f"kafka variants unavailable: pyspark {pyspark.__version__} (the connector's jar is served up to "
              f"4.2.0; run this with pyspark 4.2.0)", flush=True)
        variants = [v for v in variants if "kafka" not in v]
        connector = False
    if connector:
        spark = connector_session(args.master, "bench-microbatch", conf=conf)
    else:
        from controlmsg.spark import spark_session
        spark = spark_session(args.master, "bench-microbatch", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    print(f"pyspark {pyspark.__version__}, {args.master}, {args.rate} events/s, {args.seconds:g} s per variant"
          f"{', the late query beside' if args.late else ''}"
          f"{f' (held {args.late_hold})' if args.late and args.late_hold else ''}"
          f"{', availableNow' if args.available_now else ''}; "
          f"load {load_average()}", flush=True)

    results: list[tuple[int, str, dict[str, Any]]] = []
    with kafka_cluster(args) as cluster, tempfile.TemporaryDirectory(prefix="bench-microbatch-") as work:
        config = cluster.config
        plan = [(0, variants[0])] if args.warmup > 0 else []
        plan += [(r + 1, v) for r in range(args.rounds) for v in (variants if r % 2 == 0 else variants[::-1])]
        for round_, variant in plan:
            run = uuid.uuid4().hex[:10]  # fresh topics, feeder and checkpoint for each run of a variant
            topics = {k: f"mb-{run}-{k}" for k in ("plain", "intermediate", "out", "out-controlmsg", "late")}
            for name in topics.values():
                create_topic(config, name, 2)
            feeder = Feeder(config, topics["plain"], topics["intermediate"], run, args.rate)
            feeder.start()
            try:
                time.sleep(1)
                query, side = start(spark, variant, config, topics, run, str(Path(work) / run),
                                    late=args.late, late_hold=args.late_hold,
                                available_now=args.available_now, log_phases=args.log_phases)
                result = measure(query, args.seconds if round_ else args.warmup, side, verbose=args.verbose)
            finally:
                feeder.stop()
            if feeder.error is not None:
                raise RuntimeError(f"the feeder failed: {feeder.error!r}")
            if round_:
                results.append((round_, variant, result))
            print(f"{f'round {round_}' if round_ else 'warm-up'} {variant}: {result} (load {load_average()})",
                  flush=True)
        spark.stop()

    print(f"\nmedians per micro-batch, ms, after the first {SKIP} of each run; rows: input rows per micro-batch")
    print("| round | variant | micro-batches | rows | " + " | ".join(PHASES)
          + " | Spark's CPU, cores | CPU ms per 1,000 rows |")
    print("|---|---|---|---|" + "---|" * (len(PHASES) + 2))
    for round_, variant, r in results:
        cells = " | ".join(f"{r[ph]:.0f}" if ph in r else "-" for ph in PHASES)
        print(f"| {round_} | {variant} | {r['batches']} | {r.get('rows', 0):.0f} | {cells} | {r['cores_busy']} | "
              f"{r['cpu_ms_per_1k_rows']} |")
    by_variant: dict[str, list[float]] = {}
    for _, variant, r in results:
        if "triggerExecution" in r:
            by_variant.setdefault(variant, []).append(r["triggerExecution"])
    base = by_variant.get("kafka>kafka")
    print("\nthe whole micro-batch (triggerExecution), mean of the rounds' medians:")
    for variant, values in by_variant.items():
        mean = statistics.fmean(values)
        ratio = f", {mean / statistics.fmean(base):.2f}x kafka>kafka" if base else ""
        print(f"  {variant}: {mean:.0f} ms{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
