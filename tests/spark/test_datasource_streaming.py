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

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.beside]  # make test's second lane (tests/lanes.py)

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
    assert status is not None and status["batch"] == 2 and status["writeTasks"] == 2 and not status.get("ended")
    assert status["taskCount"] == 1 and status["upstream"] == "driver"
    before = dump_topic(kafka_config, topic, "read_uncommitted")
    # Forget that batch 2 was committed: the restarted query runs it again, with the same id.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
    assert (2, 20) in run(), "batch 2 ran again"
    assert len(dump_topic(kafka_config, topic, "read_uncommitted")) == len(before), "the replay wrote again"
    assert end_stream(opts) == 1  # the driver: the one upstream task
    assert end_stream(opts) == 1  # idempotent

    back = read(spark, topic, bootstrap_servers, schema="n long").collect()
    assert sorted(r.n for r in back) == sorted(expected)
    wire = dump_topic(kafka_config, topic)
    # Two writer partitions per micro-batch, one upstream task of the protocol: the driver.
    assert count_by(wire, "eos") == {(p, "spark-r1-driver"): 1 for p in range(3)}
    assert {(r.run, r.task) for r in wire if r.kind == "data"} == {("r1", None)}  # the run in the envelope only
    for p in range(3):
        marks = [r.value.timestamp for r in wire if r.kind == "watermark" and r.partition == p]
        assert {r.task for r in wire if r.kind == "watermark"} == {"spark-r1-driver"}
        # One watermark per micro-batch, rising: the latest event time so far minus 5 s.
        assert marks == [(1_767_225_600 + f * 60 + 19) * 1000 - 5000 for f in range(3)]


def test_empty_write_tasks_skip_kafka_and_a_restart_fences_what_an_earlier_start_left_open(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """A first attempt of a write task with no row leaves Kafka alone (no transaction, no marker); the first
    micro-batch of a new start of the query fences the ids of such tasks, so that a transaction an earlier
    start left open under one of them (a killed attempt) holds no read_committed reader back."""
    from confluent_kafka import Producer

    from controlmsg.core.codec import encode_user_rows
    from controlmsg.core.naming import task_name, transactional_id
    from controlmsg.kafka.markers import MarkerStore

    source = tmp_path / "in"
    source.mkdir()

    def add_file(f: int) -> None:
        path = source / f"part-{f}.json"
        path.write_text("".join(json.dumps({"user": "u0", "ts": 1_767_225_600 + f * 60 + j, "n": f * 10 + j}) + "\n"
                                for j in range(10)))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))

    topic = new_topic(2)
    checkpoint = tmp_path / "ck"
    opts = options(topic, bootstrap_servers, job="skip", key="user", eventTime="ts", allowedLateness="5s")

    def run() -> None:
        stream = (spark.readStream.schema("user string, ts timestamp, n long").option("maxFilesPerTrigger", 1)
                  .json(str(source)).repartition(4, "user"))  # one user: one task with rows, three without
        query = (stream.writeStream.format("controlmsg").options(**opts)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        assert query.exception() is None

    def marker(i: int) -> dict[str, Any] | None:
        with MarkerStore(kafka_config, transactional_id(topic, task_name("skip", "r1", i)), topic) as store:
            return store.load()

    add_file(0)
    add_file(1)
    run()
    markers = {i: m for i in range(4) if (m := marker(i)) is not None}
    written = list(markers)
    assert len(written) == 1 and markers[written[0]]["rows"] == 10  # the empty tasks left no marker
    status = run_status(opts)
    assert status is not None and status["batch"] == 1 and status["writeTasks"] == 4

    # An attempt of an empty task's id, of an earlier start of the query, killed inside its transaction.
    empty = next(i for i in range(4) if i not in written)
    orphan = Producer({**kafka_config, "transactional.id": transactional_id(topic, task_name("skip", "r1", empty)),
                       "transaction.timeout.ms": 600_000})  # the broker would not abort it during the test
    orphan.init_transactions(30)
    orphan.begin_transaction()
    for p in range(2):
        orphan.produce(topic, encode_user_rows([b'{"user": "zombie", "ts": 0, "n": -1}'])[0], partition=p)
    orphan.flush(30)

    add_file(2)
    run()  # a new start: its first micro-batch skips the empty tasks and fences their ids
    assert end_stream(opts) == 1
    wire = dump_topic(kafka_config, topic)  # read_committed: an open transaction would hide what follows it
    assert count_by(wire, "eos") == {(p, "skip-r1-driver"): 1 for p in range(2)}
    data = sorted(r.value["n"] for r in wire if r.kind == "data")
    assert data == list(range(30))
    assert marker(empty) is None


def test_write_stream_takes_any_number_of_writer_partitions_and_the_driver_holds_the_watermark(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    """The driver is the one upstream task of a stream write: a micro-batch of one writer partition, then
    one of several (the file source splits three files into more than one), are one task on the wire; each
    round is one watermark per topic partition, and ``inspect`` names the job's driver as what holds the
    watermark back while the stream is open."""
    from controlmsg.kafka.inspect import inspect_topic

    source = tmp_path / "in"
    source.mkdir()

    def add_file(f: int) -> None:
        lines = [json.dumps({"user": f"u{j % 5}", "ts": 1_767_225_600 + f * 60 + j, "n": f * 100 + j})
                 for j in range(10)]
        path = source / f"part-{f}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))

    topic = new_topic(4)
    checkpoint = tmp_path / "ck"
    opts = options(topic, bootstrap_servers, job="hop", key="user", eventTime="ts")

    def run() -> list[tuple[int, int]]:
        stream = spark.readStream.schema("user string, ts timestamp, n long").json(str(source))
        query = (stream.writeStream.format("controlmsg").options(**opts)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(120)
        assert query.exception() is None
        return [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]

    add_file(0)
    assert run() == [(0, 10)]
    assert run_status(opts)["writeTasks"] == 1  # type: ignore[index]
    for f in (1, 2, 3):
        add_file(f)
    assert run() == [(1, 30)]  # another number of writer partitions: refused before the driver spoke
    status = run_status(opts)
    assert status is not None and status["writeTasks"] > 1 and status["taskCount"] == 1

    report = inspect_topic(kafka_config, topic, "r1")
    last = (1_767_225_600 + 3 * 60 + 9) * 1000  # the largest event time written (allowedLateness 0)
    assert [s.holding_task for s in report.runs["r1"].partitions] == [("hop-r1-driver", last)] * 4
    assert [s.task_count for s in report.runs["r1"].partitions] == [1] * 4

    assert end_stream(opts) == 1
    wire = dump_topic(kafka_config, topic)
    assert Counter(r.kind for r in wire if r.kind != "data") == {"watermark": 2 * 4, "eos": 4}  # O(partitions)
    assert {r.task for r in wire if r.kind != "data"} == {"hop-r1-driver"}
    assert {(r.run, r.task) for r in wire if r.kind == "data"} == {("r1", None)}  # the run in the envelope only
    back = read(spark, topic, bootstrap_servers, schema="n long").collect()
    assert sorted(r.n for r in back) == [f * 100 + j for f in range(4) for j in range(10)]


def test_a_run_started_by_per_task_control_messages_goes_on_as_the_drivers_next_generation(
    kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
) -> None:
    """A stream run that an earlier version of the writer started (each write task an upstream task, the
    driver writing every task's watermark: what its marker and the wire look like is written here by hand
    with the same transactional id) is ended by today's driver as generation 1 of the run, one end of
    stream per partition: the old tasks, which never write again, no longer hold the stream open."""
    from controlmsg.core.messages import WatermarkMessage
    from controlmsg.core.naming import driver_transactional_id
    from controlmsg.kafka import ControlReader
    from controlmsg.kafka.markers import write_control_round

    topic = new_topic(3)
    old = [WatermarkMessage(f"spark-r1-p{i}", 2, 5_000, "r1") for i in range(2)]
    write_control_round(kafka_config, topic, 3, lambda _: (old, {"batch": 0, "taskCount": 2, "watermark": 5_000,
                                                                  "queryId": "q"}),
                        transactional_id=driver_transactional_id(topic, "spark", "r1"))
    opts = options(topic, bootstrap_servers)
    assert end_stream(opts) == 1
    status = run_status(opts)
    assert status is not None and status["ended"] and status["generation"] == 1 and status["upstream"] == "driver"
    ends = [r for r in dump_topic(kafka_config, topic) if r.kind == "eos"]
    assert sorted((r.partition, r.task, r.value.task_count, r.value.generation) for r in ends) == [
        (p, "spark-r1-driver", 1, 1) for p in range(3)]
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        list(reader.read_until_end(timeout=30))
        assert reader.tracker.is_ended and reader.tracker.emitted_watermark == 5_000


def test_a_micro_batch_replayed_with_other_max_tasks_reads_with_the_tasks_it_was_planned_with(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    """The reader Spark makes on the driver, made here: ``latestOffset`` logs the micro-batch's reading
    tasks with its offset, and a reader restarted with another ``maxTasks`` plans that logged micro-batch
    (a replay after a restart) with the same tasks; a micro-batch not yet planned gets the new option."""
    from pyspark.sql.types import StructType

    from controlmsg.spark.options import ReadOptions
    from controlmsg.spark.reading.planning import StreamRange
    from controlmsg.spark.reading.stream_reader import StreamReader

    topic = new_topic(6)
    up = Upstream(kafka_config, topic)
    up.write("fast", 60, 1000)
    up.write("slow", 60, 1000)
    schema = StructType.fromDDL(STREAM_SCHEMA)
    assert isinstance(schema, StructType)

    def planned(reader: StreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[list[int]]:
        parts = reader.partitions(start, end)
        return [[p for p, _, _ in part.ranges] for part in parts if isinstance(part, StreamRange)]

    first = StreamReader(ReadOptions.parse(options(topic, bootstrap_servers, maxTasks="3")), schema)
    try:
        start = first.initialOffset()
        end = first.latestOffset(start, first.getDefaultReadLimit())
        assert end["groups"] == [[0, 1], [2, 3], [4, 5]], end["groups"]
        assert planned(first, start, end) == end["groups"]
    finally:
        first.stop()
    logged = json.loads(json.dumps(end))  # as Spark's offset log gives it back
    again = StreamReader(ReadOptions.parse(options(topic, bootstrap_servers, maxTasks="2")), schema)
    try:
        assert planned(again, start, logged) == [[0, 1], [2, 3], [4, 5]]
        unlogged = {k: v for k, v in logged.items() if k != "groups"}  # an offset written before groups were
        assert planned(again, start, unlogged) == [[0, 1, 2], [3, 4, 5]]
    finally:
        again.stop()


def test_an_intermediate_stream_holds_micro_batches_for_minOffsetsPerTrigger_not_its_end_of_stream(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    """``minOffsetsPerTrigger`` and ``maxTriggerDelay`` on an intermediate topic (the driver's side, as Spark
    asks it before each micro-batch): the first micro-batch fires; then one waits for that many new offsets
    (records and control messages), or the delay since the last one; Spark asking again with the same start
    while held reads on from where the scan stood (nothing read twice, nothing skipped); the end of stream
    is never held back."""
    from pyspark.sql.types import StructType

    from controlmsg.core.bookkeeping import InputTracker
    from controlmsg.spark.options import ReadOptions
    from controlmsg.spark.reading.stream_reader import StreamReader

    topic = new_topic(2)
    up = Upstream(kafka_config, topic)
    schema = StructType.fromDDL(STREAM_SCHEMA)
    assert isinstance(schema, StructType)
    patient, hasty = (StreamReader(ReadOptions.parse(options(topic, bootstrap_servers, minOffsetsPerTrigger="40",
                                                             maxTriggerDelay=delay)), schema)
                      for delay in ("1h", "1s"))

    def offsets(end: dict[str, Any]) -> int:
        return sum(end["offsets"].values())

    def planned(reader: StreamReader, start: dict[str, Any]) -> dict[str, Any]:
        """The next micro-batch's end: Spark asks until the reader has one (a scan may find nothing yet). The
        bound is only there so that a reader that never plans fails rather than hangs: records written before
        the call are readable at once, and a busy machine takes seconds, not minutes."""
        deadline = time.monotonic() + 180
        while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) == start:
            assert time.monotonic() < deadline, "the reader never planned a micro-batch over records it can read"
        return end

    def held(reader: StreamReader, start: dict[str, Any]) -> None:
        """Asked again and again for 2 s, the reader plans nothing (it has read what there is meanwhile)."""
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start

    try:
        start = patient.initialOffset()
        assert hasty.initialOffset() == start
        up.write("fast", 10, 1000)  # 10 records and a watermark (to each partition): 12 offsets
        first = planned(patient, start)
        assert offsets(first) == 12  # the first fires (no micro-batch before it)
        assert offsets(planned(hasty, start)) == 12
        up.write("slow", 20, 1000)  # 24 more: fewer than 40
        held(patient, first)
        up.write("fast", 10, 1000)  # 12 more: 36, still fewer
        held(patient, first)
        time.sleep(1.1)  # maxTriggerDelay since hasty's last micro-batch: it fires with what there is
        assert offsets(planned(hasty, first)) == 12 + 36
        up.write("slow", 10, 1000)  # 48 new since patient's first micro-batch
        second = planned(patient, first)
        assert offsets(second) == 12 + 48, second
        assert second["bookkeeping"]["emittedWatermark"] == 19_000  # both tasks past 19 s: fast's 19 s, slow's 29 s
        up.write("fast", 1, 1000, end=True)  # 1 record and its end of stream (to each partition): 3 offsets
        up.write("slow", 0, 1000, end=True)  # 2 more: the stream has ended, nothing is held
        third = planned(patient, second)
        assert offsets(third) == 12 + 48 + 3 + 2, third
        assert InputTracker.restore(third["bookkeeping"], "r1").is_ended
    finally:
        patient.stop()
        hasty.stop()
        for writer in up.writers.values():
            writer.close()
