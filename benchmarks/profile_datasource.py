"""Where a write and a read task of ``format("controlmsg")`` spend their time: the data source's task
bodies run in this process, without Spark, on Arrow batches like those Spark hands them.

    python benchmarks/profile_datasource.py [--rows 500000] [--tasks 2] [--partitions 4] [--top 25]
        [--profiler cprofile|none] [--run-tag envelope|headers|none] [--read batch|stream|plain]
        [--bootstrap-servers HOST:PORT | -X K=V | --kafka-config F]

The rows are the synthetic events of the benchmarks (``user`` skewed over ``--keys`` users, ``event_time``
epoch ms over 30 days, ``amount`` 2% null, ``items``), ``--batch-rows`` rows per Arrow batch (Spark's
``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000). The write goes through the source's own
``writer(...).write(batches)`` (one task after another, as Spark's tasks on one core) then ``commit``,
the read through ``reader(...).partitions()`` and ``read(partition)`` of each, with ``.schema(...)``:
both the objects Spark calls. ``--read`` picks the read measured: ``batch`` (the default: ``spark.read``, each
task reading its partitions to end of stream), ``stream`` (``spark.readStream``'s executor tasks, planned
untimed by the driver's ``latestOffset`` and ``partitions`` until the stream ended, reading the planned
offset ranges with ``_watermark`` and ``_partition_watermark`` columns), or ``plain`` (a topic of the same
events as plain JSON records, produced untimed, read with ``envelope none``). Prints rows/s of each, and
with ``--profiler cprofile`` (the default) the functions with the largest own time, as a share of the phase.
cProfile adds a cost to every Python call, which inflates per-record Python code; ``--profiler none`` runs
unprofiled, for a sampling profiler such as
``py-spy record -- python benchmarks/profile_datasource.py --profiler none``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from common import DAY_MS, EVENTS_START_MS, add_cluster_options, delete_topics, kafka_cluster


def event_batches(rows: int, keys: int, batch_rows: int, seed: int) -> list[pa.RecordBatch]:
    """The benchmarks' synthetic events (see ``common.synthetic_events``) as Arrow batches."""
    import numpy as np

    rng = np.random.default_rng(seed)
    users = (rng.random(rows) ** 3 * keys).astype(np.int64)
    user = pa.array([f"user-{u}" for u in users], pa.string())
    event_time = pa.array(EVENTS_START_MS + (rng.random(rows) * 30 * DAY_MS).astype(np.int64), pa.int64())
    amount = np.round(rng.random(rows) * 100, 2)
    amounts = pa.array(amount, pa.float64(), mask=rng.random(rows) < 0.02)
    items = pa.array((rng.random(rows) * 5 + 1).astype(np.int32), pa.int32())
    table = pa.table({"user": user, "event_time": event_time, "amount": amounts, "items": items})
    batches: list[pa.RecordBatch] = table.to_batches(max_chunksize=batch_rows)
    return batches


class FakeTask:
    """Python's ``TaskContext`` as a Spark worker sets it, for one task after another."""

    def __init__(self) -> None:
        from pyspark import TaskContext

        self.context = TaskContext._getOrCreate()

    def enter(self, partition: int) -> None:
        self.context._partitionId = partition
        self.context._attemptNumber = 0
        self.context._localProperties = {}


class Timed:
    """Wall seconds, and CPU seconds of this (Python) thread and of the whole process (librdkafka's threads
    included), of one phase. On a busy machine the wall clock swings with the other work; the calling
    thread's CPU time is the steadier figure of what the task's own Python work costs."""

    def __init__(self) -> None:
        self.wall = self.thread = self.process = 0.0

    def per_row(self, rows: int) -> str:
        return (f"CPU {self.thread / rows * 1e6:.2f} us/row Python thread, {self.process / rows * 1e6:.2f} us/row "
                "process")


def profiled(profiler: str, work: Callable[[], Any]) -> tuple[Timed, cProfile.Profile | None]:
    timed = Timed()
    wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
    prof = None
    if profiler == "cprofile":
        prof = cProfile.Profile()
        prof.runcall(work)
    else:
        work()
    timed.wall = time.perf_counter() - wall
    timed.thread = time.thread_time() - thread
    timed.process = time.process_time() - process
    return timed, prof


def top_functions(prof: cProfile.Profile, top: int) -> str:
    """The ``top`` functions by own time, each with its share of the profiled time (own and cumulative)."""
    stats = pstats.Stats(prof, stream=io.StringIO())
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
    lines = [f"  {'own %':>6} {'cum %':>6} {'calls':>10}  function"]
    for (filename, line, name), (_, calls, own, cumulative, _) in rows:
        where = filename if filename == "~" else f"{'/'.join(filename.split('/')[-2:])}:{line}"
        lines.append(f"  {100 * own / total:6.1f} {100 * cumulative / total:6.1f} {calls:>10,}  {name} ({where})")
    return "\n".join(lines)


def planned_read(kind: str, options: dict[str, str], schema: Any, batches: list[pa.RecordBatch],
                 config: dict[str, str]) -> tuple[Any, list[Any]]:
    """The reader Spark's executors would call and the input partitions its driver planned (untimed) for
    the read ``kind`` of the topic of ``options`` (see the module docstring)."""
    from pyspark.sql.types import StructField, StructType, TimestampType

    from controlmsg.spark.datasource import ControlMsgDataSource

    if kind == "batch":
        reader = ControlMsgDataSource(options).reader(schema)
        return reader, list(reader.partitions())
    if kind == "stream":
        marked = StructType([*schema.fields, StructField("_watermark", TimestampType()),
                             StructField("_partition_watermark", TimestampType())])
        stream = ControlMsgDataSource(options).streamReader(marked)
        parts: list[Any] = []
        start = stream.initialOffset()
        while True:  # micro-batches until the driver's scan has the stream ended
            end = stream.latestOffset(start, stream.getDefaultReadLimit())
            if end == start:
                break
            parts.extend(stream.partitions(start, end))
            start = end
        stream.stop()
        return stream, parts
    import orjson
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    plain_topic = f"{options['topic']}-plain"
    partitions = int(options["partitions"])
    admin = AdminClient(dict(config))  # alive until the future resolves
    for done in admin.create_topics([NewTopic(plain_topic, partitions, 1)]).values():
        done.result()
    producer = Producer(dict(config))
    produced = 0
    for batch in batches:
        for row in batch.to_pylist():
            while True:
                try:
                    producer.produce(plain_topic, orjson.dumps(row), str(row["user"]).encode(),
                                     partition=produced % partitions)
                    break
                except BufferError:
                    producer.poll(0.1)
            produced += 1
    producer.flush()
    plain = {k: v for k, v in options.items() if k not in ("runId", "job", "key", "eventTime", "partitions")}
    reader = ControlMsgDataSource({**plain, "topic": plain_topic, "envelope": "none"}).reader(schema)
    return reader, list(reader.partitions())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--tasks", type=int, default=2, help="write tasks, run one after another")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--profiler", choices=("cprofile", "none"), default="cprofile")
    parser.add_argument("--read", choices=("batch", "stream", "plain"), default="batch",
                        help="the read measured (default batch; see the module docstring)")
    parser.add_argument("--run-tag", choices=("envelope", "headers", "none"), default="envelope",
                        help="the writer's option runTag (default envelope, as the source's): how every record "
                             "names its run")
    add_cluster_options(parser)
    args = parser.parse_args()

    from pyspark.sql.datasource import WriterCommitMessage
    from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

    from controlmsg.spark.datasource import ControlMsgDataSource

    schema = StructType([StructField("user", StringType()), StructField("event_time", LongType()),
                         StructField("amount", DoubleType()), StructField("items", IntegerType())])
    batches = event_batches(args.rows, args.keys, args.batch_rows, seed=1)
    shares = [batches[i::args.tasks] for i in range(args.tasks)]
    with kafka_cluster(args) as cluster:
        topic = f"bench-profile-{uuid.uuid4().hex[:8]}"
        options = {"topic": topic, "runId": "profile", "job": "profile", "key": "user", "eventTime": "event_time",
                   "partitions": str(args.partitions), "timeout": "120", "runTag": args.run_tag,
                   **{f"kafka.{k}": v for k, v in cluster.config.items()}}
        source = ControlMsgDataSource(options)
        task = FakeTask()
        try:
            # Untimed: one batch written and read back through another topic, so that a fresh broker's
            # transaction coordinator and the first connections are not in the profile.
            warm = ControlMsgDataSource({**options, "topic": f"{topic}-warm-up"})
            warm_writer = warm.writer(schema, False)
            task.enter(0)
            warm_writer.commit([warm_writer.write(iter(batches[:1]))])
            warm_reader = warm.reader(schema)
            for part in warm_reader.partitions():
                for _ in warm_reader.read(part):
                    pass
            writer = source.writer(schema, False)  # creates the topic
            messages: list[WriterCommitMessage | None] = []

            def write() -> None:
                for i, share in enumerate(shares):
                    task.enter(i)
                    messages.append(writer.write(iter(share)))

            timed, prof = profiled(args.profiler, write)
            writer.commit(messages)
            print(f"write: {args.rows:,} rows in {args.tasks} tasks, {timed.wall:.2f} s, "
                  f"{args.rows / timed.wall:,.0f} rows/s; {timed.per_row(args.rows)}")
            if prof is not None:
                print(top_functions(prof, args.top))

            reader, parts = planned_read(args.read, options, schema, batches, cluster.config)
            read_rows = 0

            def read() -> None:
                nonlocal read_rows
                for i, part in enumerate(parts):
                    task.enter(i)
                    batches_read = reader.read(part)
                    read_rows += sum(b.num_rows for b in batches_read if isinstance(b, pa.RecordBatch))

            timed, prof = profiled(args.profiler, read)
            print(f"\nread ({args.read}): {read_rows:,} rows in {len(parts)} tasks, {timed.wall:.2f} s, "
                  f"{read_rows / timed.wall:,.0f} rows/s; {timed.per_row(max(read_rows, 1))}")
            if prof is not None:
                print(top_functions(prof, args.top))
            if read_rows != args.rows:
                print(f"read {read_rows} rows, wrote {args.rows}", file=sys.stderr)
                return 1
        finally:
            plain_topic = [f"{topic}-plain"] if args.read == "plain" else []
            delete_topics(cluster.config, [topic, f"{topic}-warm-up", *plain_topic])
    return 0


if __name__ == "__main__":
    sys.exit(main())
