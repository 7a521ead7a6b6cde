"""The stream reader's driver scan (``latestOffset``) behind a live upstream, without Spark: this checkout's
and another's side by side, on the same topic at the same time.

    python benchmarks/bench_scan.py --baseline CHECKOUT [--seconds 30] [--rate 2000] [--interval 200ms]

An upstream task in this process writes ``--rate`` records/s over 4 partitions and, every ``--interval``,
a watermark (its clock minus 500 ms) to every partition, as the stages chain's ingest does. Two reader
processes, one per checkout (``PYTHONPATH``), each call ``StreamReader.latestOffset`` in a loop as Spark's
micro-batch loop does under ``availableNow`` (the next call starts where the last ended) and report, per
call, how long it took and whether the reconciled watermark moved in it; for each watermark the upstream
wrote, how long after it was written the scan that took it in returned (the scan's share of a window's
latency: Spark plans the micro-batch only then). No JVM, no Python worker to start: it runs on a machine too
loaded for the Spark chains (``bench_stages.py``), and what it measures is one phase of theirs.

Then two fixed costs of a micro-batch's tasks, ``--repeat`` times each, in this process: a write task with
no row that goes through Kafka (a transactional producer's ``init_transactions``, its marker looked up and
committed with an empty transaction: what such a task paid before issue 31; now it skips all of it), and a
reading task's consumer from its creation (or, reused, from its new assignment) to its first record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

READER = """
import json, sys, time
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType, TimestampType
from pyspark.sql.streaming.datasource import ReadAllAvailable
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.reading import StreamReader

servers, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
schema = StructType([StructField("key", StringType()), StructField("event_ms", LongType()),
                     StructField("amount", DoubleType()), StructField("_watermark", TimestampType()),
                     StructField("_partition_watermark", TimestampType()), StructField("_control", BooleanType())])
reader = StreamReader(ReadOptions.parse({"topic": topic, "runId": "r1", "kafka.bootstrap.servers": servers}), schema)
reader.prepareForTriggerAvailableNow()
start = reader.initialOffset()
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    began = time.monotonic()
    end = reader.latestOffset(start, ReadAllAvailable())
    now = time.time()
    wm = end["bookkeeping"].get("emittedWatermark")
    print(json.dumps({"ms": (time.monotonic() - began) * 1000, "at": now, "watermark": wm,
                      "settle": bool(end.get("settle"))}), flush=True)
    start = {k: v for k, v in end.items() if k != "groups"}
reader.stop()
"""


def task_costs(config: dict[str, str], topic: str, repeat: int) -> dict[str, list[float]]:
    """See the module docstring: ms per empty write task through Kafka, per consumer to its first record."""
    from confluent_kafka import Consumer, TopicPartition

    from controlmsg.kafka import ControlWriter
    from controlmsg.kafka.markers import MarkerStore
    from controlmsg.kafka.settings import for_client

    out: dict[str, list[float]] = {"empty write task through Kafka": [], "reading task: new consumer to 1st record": [],
                                   "reading task: reused consumer to 1st record": []}
    for i in range(repeat):
        began = time.monotonic()
        txn = f"bench-scan-empty-{os.getpid()}-{i}"
        writer = ControlWriter({**config, "transactional.id": txn}, topic, task_name=f"empty-{i}", task_count=None,
                               run_id="r1", partitions=4)
        with MarkerStore(config, txn, topic) as store:
            store.load()
            with writer:
                store.add(writer, {"batch": i, "rows": 0}, 0)
        out["empty write task through Kafka"].append((time.monotonic() - began) * 1000)
    conf = for_client({**config, "group.id": "bench-scan", "enable.auto.commit": False,
                       "isolation.level": "read_committed"}, "consumer")
    kept = Consumer(conf)
    kept.assign([TopicPartition(topic, 0, 0)])  # connected once, as after a worker's first task
    while not [m for m in kept.consume(100, 0.02) if m.error() is None]:
        pass
    kept.unassign()
    for i in range(repeat):
        for reuse in (False, True):
            began = time.monotonic()
            consumer = kept if reuse else Consumer(conf)
            consumer.assign([TopicPartition(topic, i % 4, 10 * i)])
            while not [m for m in consumer.consume(100, 0.02) if m.error() is None]:
                pass
            if reuse:
                consumer.unassign()
                out["reading task: reused consumer to 1st record"].append((time.monotonic() - began) * 1000)
            else:
                consumer.close()
                out["reading task: new consumer to 1st record"].append((time.monotonic() - began) * 1000)
    kept.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", required=True, help="the other checkout (e.g. main's code)")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--rate", type=float, default=2000.0, help="records/s")
    p.add_argument("--interval", default="200ms", help="the upstream's watermark interval")
    p.add_argument("--repeat", type=int, default=10, help="times each task cost is measured")
    from common import add_cluster_options, kafka_cluster, load_average

    from controlmsg.kafka import ControlWriter, create_topic
    from spark_jobs.events import parse_duration

    add_cluster_options(p)
    args = p.parse_args()
    interval = parse_duration(args.interval) / 1000
    here = str(Path(__file__).resolve().parent.parent)
    print(f"bench_scan: load {load_average()}, {args.rate:,.0f} records/s, a watermark every {args.interval}, "
          f"{args.seconds:g} s", flush=True)
    with kafka_cluster(args) as cluster:
        config = dict(cluster.config)
        topic = f"bench-scan-{os.getpid()}-{int(time.time())}"
        create_topic(config, topic, 4)
        written: list[tuple[float, int]] = []  # (wall time the watermark was flushed, its value)
        stop = threading.Event()

        def upstream() -> None:
            with ControlWriter(config, topic, task_name="up-0", task_count=1, run_id="r1") as w:
                sent = 0
                began = time.monotonic()
                next_mark = began
                while not stop.is_set():
                    now = time.monotonic()
                    due = int((now - began) * args.rate)
                    while sent < due:
                        ms = int(time.time() * 1000)
                        w.send({"key": f"k{sent % 100}", "event_ms": ms, "amount": 1.0}, key=f"k{sent % 100}")
                        sent += 1
                    if now >= next_mark:
                        mark = int(time.time() * 1000) - 500
                        w.send_watermark(mark)
                        w.flush()
                        written.append((time.time(), mark))
                        next_mark += interval
                    time.sleep(0.005)

        thread = threading.Thread(target=upstream, daemon=True)
        thread.start()
        time.sleep(1.0)
        readers = {}
        for name, root in (("baseline", str(Path(args.baseline).resolve())), ("this", here)):
            env = {**os.environ, "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"]
                                                        if os.environ.get("PYTHONPATH") else "")}
            readers[name] = subprocess.Popen(
                [sys.executable, "-c", READER, config["bootstrap.servers"], topic, str(args.seconds)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd="/", text=True)
        outputs = {name: proc.communicate()[0] for name, proc in readers.items()}
        stop.set()
        thread.join(10)
        costs = task_costs(config, topic, args.repeat)
    print(f"load at the end {load_average()}")
    for label, values in costs.items():
        print(f"{label}: ms med / p90 {statistics.median(values):.0f} / {sorted(values)[int(0.9 * len(values))]:.0f}"
              f" ({len(values)} times)")
    print(f"{'checkout':10} {'scans':>6} {'scan ms med / p90':>18} {'settle':>7} "
          f"{'watermark -> scan returned, s, med / p90':>42}")
    for name, out in outputs.items():
        calls = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        # A call whose offset says "settle" moved the watermark; the next one is the settle micro-batch.
        scans = [c for i, c in enumerate(calls) if i == 0 or not calls[i - 1]["settle"]]
        ms = sorted(c["ms"] for c in scans)
        lags = []
        for at, mark in written[len(written) // 5:]:  # the first fifth: warm-up
            took = next((c["at"] for c in calls if c["watermark"] is not None and c["watermark"] >= mark), None)
            if took is not None:
                lags.append(took - at)
        lags.sort()

        def p90(values: list[float]) -> float:
            return values[min(len(values) - 1, int(0.9 * len(values)))] if values else float("nan")
        print(f"{name:10} {len(scans):>6} {statistics.median(ms) if ms else float('nan'):>9.0f} / {p90(ms):<6.0f} "
              f"{len(calls) - len(scans):>7} {statistics.median(lags) if lags else float('nan'):>21.2f} / "
              f"{p90(lags):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
