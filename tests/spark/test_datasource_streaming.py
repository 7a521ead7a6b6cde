"""``readStream`` and ``writeStream`` of ``format("controlmsg")`` on a real broker and SparkSession: an
``availableNow`` query that delivers micro-batches while the upstream writes and ends by itself, a restart
from the checkpoint that repeats and loses nothing, the ``_watermark`` column, and a stream writer whose
replayed micro-batch writes nothing twice."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from controlmsg.kafka import ControlWriter
from controlmsg.spark import end_stream, run_status
from tests.spark.helpers import options, read
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

STREAM_SCHEMA = "task string, i long, t long, _watermark timestamp, _partition int, _offset long"


class Upstream:
    """Two upstream tasks of run r1 writing with the Kafka-level writer: ``fast`` and ``slow``."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.writers = {name: ControlWriter(config, topic, task_name=name, task_count=2, run_id="r1",
                                            data_headers=True) for name in ("fast", "slow")}
        self.sent: Counter[str] = Counter()
        self.marks: dict[str, list[int]] = {"fast": [], "slow": []}

    def write(self, task: str, count: int, step_ms: int, *, end: bool = False) -> None:
        w = self.writers[task]
        for _ in range(count):
            i = self.sent[task]
            w.send({"task": task, "i": i, "t": i * step_ms}, key=f"{task}-{i % 7}")
            self.sent[task] += 1
            if self.sent[task] % 10 == 0:
                mark = (self.sent[task] - 1) * step_ms
                w.send_watermark(mark)
                self.marks[task].append(mark)
        if end:
            w.send_end_of_stream()
        w.flush()


class Batches:
    """A ``foreachBatch`` sink that keeps the rows of each micro-batch id (a replayed id replaces them)."""

    def __init__(self) -> None:
        self.rows: dict[int, list[Any]] = {}
        self.arrived: dict[int, float] = {}

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.rows[batch_id] = df.collect()
        self.arrived[batch_id] = time.monotonic()

    def all_rows(self) -> list[Any]:
        return [r for b in sorted(self.rows) for r in self.rows[b]]


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def check_watermarks(batches: Batches, up: Upstream) -> None:
    """``_watermark`` never goes back (within a partition, and from one micro-batch to the next) and
    never passes the slowest task's promise."""
    ceiling = min(max(up.marks["fast"]), max(up.marks["slow"]))
    last_of_batch = None
    for b in sorted(batches.rows):
        marks = [r._watermark for r in batches.rows[b] if r._watermark is not None]
        if last_of_batch is not None and marks:
            assert min(marks) >= last_of_batch
        by_partition: dict[int, list[Any]] = {}
        for r in sorted(batches.rows[b], key=lambda r: (r._partition, r._offset)):
            by_partition.setdefault(r._partition, []).append(r._watermark)
        for seq in by_partition.values():
            defined = [m for m in seq if m is not None]
            assert defined == sorted(defined)
            assert seq[: len(seq) - len(defined)] == [None] * (len(seq) - len(defined))  # null, then defined
        if marks:
            last_of_batch = max(marks)
            assert all(int(m.timestamp() * 1000) <= ceiling for m in marks)


def test_available_now_delivers_before_the_end_and_terminates(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(3)
    up = Upstream(kafka_config, topic)
    up.write("fast", 30, 1000)
    up.write("slow", 10, 500)
    batches = Batches()
    stream = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, timeout="120"))
              .schema(STREAM_SCHEMA).load())
    query = (stream.writeStream.foreachBatch(batches).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        wait_for(lambda: sum(len(r) for r in batches.rows.values()) == 40, 90, "the first 40 records")
        time.sleep(2)
        assert query.isActive, "the query must wait while the upstream has not ended"
        before_end = time.monotonic()
        up.write("fast", 30, 1000, end=True)
        up.write("slow", 20, 500)
        time.sleep(1)
        assert query.isActive  # slow has not ended yet
        up.write("slow", 10, 500, end=True)
        assert query.awaitTermination(120), "an availableNow query ends by itself at the end of stream"
    finally:
        query.stop()
    assert query.exception() is None
    rows = batches.all_rows()
    assert Counter((r.task, r.i) for r in rows) == Counter({("fast", i): 1 for i in range(60)}
                                                           | {("slow", i): 1 for i in range(40)})
    assert any(arrived < before_end for arrived in batches.arrived.values())
    assert len(batches.rows) >= 2
    check_watermarks(batches, up)
    late = [r for b in sorted(batches.rows)[1:] for r in batches.rows[b]]
    assert any(r._watermark is not None for r in late), "after the first batch every task had reported"


def test_restart_from_the_checkpoint_repeats_and_loses_nothing(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(2)
    up = Upstream(kafka_config, topic)
    up.write("fast", 40, 1000)
    up.write("slow", 20, 1000)
    checkpoint = str(tmp_path / "ck")
    stream = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, timeout="120"))
              .schema(STREAM_SCHEMA).load())
    first = Batches()
    query = (stream.writeStream.foreachBatch(first).option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    try:
        wait_for(lambda: sum(len(r) for r in first.rows.values()) == 60, 90, "the first 60 records")
    finally:
        query.stop()
    first_max = max((r._watermark for r in first.all_rows() if r._watermark is not None), default=None)

    up.write("fast", 20, 1000, end=True)
    up.write("slow", 30, 1000, end=True)
    second = Batches()
    query = (stream.writeStream.foreachBatch(second).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    # A micro-batch that ran but was not committed before the stop is run again with the same id: the
    # rows of each id once, over both runs, are every record exactly once.
    merged = {**first.rows, **second.rows}
    rows = [r for b in sorted(merged) for r in merged[b]]
    assert Counter((r.task, r.i) for r in rows) == Counter({("fast", i): 1 for i in range(60)}
                                                           | {("slow", i): 1 for i in range(50)})
    new_marks = [r._watermark for b in second.rows if b not in first.rows for r in second.rows[b]
                 if r._watermark is not None]
    if first_max is not None and new_marks:
        assert min(new_marks) >= first_max  # the watermark did not go back across the restart
    restarted = Batches()
    restarted.rows = merged
    check_watermarks(restarted, up)


def test_write_stream_replayed_batch_writes_nothing_twice(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    expected = []
    for f in range(3):
        lines = []
        for j in range(20):
            ts = 1_767_225_600 + f * 60 + j  # each file a later minute
            lines.append(json.dumps({"user": f"u{j % 4}", "ts": ts, "n": f * 100 + j}))
            expected.append(f * 100 + j)
        path = source / f"part-{f}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))  # the file source takes files by age
    topic = new_topic(3)
    checkpoint = tmp_path / "ck"
    opts = options(topic, bootstrap_servers, key="user", eventTime="ts", allowedLateness="5s")

    def run() -> list[tuple[int, int]]:
        stream = (spark.readStream.schema("user string, ts timestamp, n long").option("maxFilesPerTrigger", 1)
                  .json(str(source)).repartition(2))
        query = (stream.writeStream.format("controlmsg").options(**opts)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        assert query.exception() is None
        return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress]

    assert [b for b, rows in run() if rows] == [0, 1, 2]
    status = run_status(opts)
    assert status is not None and status["batch"] == 2 and status["taskCount"] == 2 and not status.get("ended")
    before = dump_topic(kafka_config, topic, "read_uncommitted")
    # Forget that batch 2 was committed: the restarted query runs it again, with the same id.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    assert (2, 20) in run(), "batch 2 ran again"
    assert len(dump_topic(kafka_config, topic, "read_uncommitted")) == len(before), "the replay wrote again"
    assert end_stream(opts) == 2
    assert end_stream(opts) == 2  # idempotent

    back = read(spark, topic, bootstrap_servers, schema="n long").collect()
    assert sorted(r.n for r in back) == sorted(expected)
    wire = dump_topic(kafka_config, topic)
    names = ["spark-r1-p0", "spark-r1-p1"]
    assert count_by(wire, "eos") == {(p, n): 1 for p in range(3) for n in names}
    for p in range(3):
        for name in names:
            marks = [r.value.timestamp for r in wire if r.kind == "watermark" and r.partition == p and r.task == name]
            # One watermark per micro-batch, rising: the latest event time so far minus 5 s.
            assert marks == [(1_767_225_600 + f * 60 + 19) * 1000 - 5000 for f in range(3)]
