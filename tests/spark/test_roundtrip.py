"""A DataFrame written by K Spark tasks to an N-partition topic and read back by the data source."""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.core.bookkeeping import PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.errors import ControlMsgError
from controlmsg.kafka import ControlReader
from spark_jobs import read_intermediate, write_intermediate
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = "user string, ts long, amount long, score double, note string"
BASE_TS = 1_767_225_600_000
LATENESS = 100


def make_rows(n: int, users: int, seed: int = 7) -> list[tuple[Any, ...]]:
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        ts = BASE_TS + i * 10 + rnd.randint(-300, 300)  # roughly rising, some out of order
        note = None if i % 5 == 0 else f"note {i} \u00e9"
        rows.append((f"u{i % users}", ts, i % 97, round(rnd.random() * 100, 3), note))
    return rows


def test_k_tasks_to_n_partitions_read_back_equal(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    rows = make_rows(600, users=5)
    # 7 write tasks for 5 distinct keys: hash partitioning leaves at least two tasks without rows.
    df = spark.createDataFrame(rows, SCHEMA).repartition(7, "user")
    result = write_intermediate(
        df, topic, bootstrap_servers=bootstrap_servers, run_id="r1", job_name="rt", key_column="user",
        event_time_column="ts", allowed_lateness_ms=LATENESS, watermark_every_rows=50,
    )
    assert result.task_count == 7 and result.partitions == 3
    assert result.rows == 600
    assert result.task_names == [f"rt-r1-p{i}" for i in range(7)]
    empty = [t for t in result.tasks if t.rows == 0]
    assert len(empty) >= 2

    # The data source, parsed: the same multiset of rows.
    back = read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id="r1", schema=SCHEMA,
                             timeout=60)
    assert sorted(tuple(r) for r in back.collect()) == sorted(rows)
    # Raw: position, key and JSON text; every key lives in one partition.
    raw = read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id="r1", timeout=60,
                            partitions_per_task=2)
    assert raw.schema.simpleString() == "struct<partition:int,offset:bigint,key:string,value:string>"
    raw_rows = raw.collect()
    assert len(raw_rows) == 600
    homes: dict[str, set[int]] = defaultdict(set)
    for r in raw_rows:
        homes[r.key].add(r.partition)
    assert sorted(homes) == [f"u{i}" for i in range(5)] and all(len(p) == 1 for p in homes.values())
    # Metadata columns next to parsed ones.
    meta = read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id="r1", timeout=60,
                             schema="_partition int, _offset long, _key string, user string, ts long")
    assert sorted((m._key, m.ts) for m in meta.collect()) == sorted((r[0], r[1]) for r in rows)

    # A plain reader of the whole topic: every partition ends with exactly the 7 tasks, once each.
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        items = list(reader.read_until_end(timeout=60))
        tracker = reader.tracker
    assert tracker.is_ended and isinstance(items[-1], StreamEnded)
    assert sorted(i.partition for i in items if isinstance(i, PartitionEnded)) == [0, 1, 2]
    for status in tracker.statuses():
        assert status.task_count == 7
        assert status.ended_tasks == frozenset(result.task_names)
    assert tracker.counters.duplicate_eos == 0 and tracker.counters.regressions == 0
    marks = [i.timestamp for i in items if isinstance(i, WatermarkAdvanced)]
    assert marks == sorted(set(marks))

    # On the wire: one end of stream per task and partition; each task's watermarks rise strictly, trail
    # its largest event time by the allowed lateness, and come every 50 rows.
    wire = dump_topic(kafka_config, topic)
    assert count_by(wire, "eos") == {(p, name): 1 for p in range(3) for name in result.task_names}
    by_task: dict[tuple[int, str | None], list[int]] = defaultdict(list)
    for rec in wire:
        if rec.kind == "watermark":
            by_task[(rec.partition, rec.task)].append(rec.value.timestamp)
    for stats in result.tasks:
        for p in range(3):
            seen = by_task.get((p, stats.task_name), [])
            assert len(seen) == stats.watermarks
            assert seen == sorted(set(seen))
            if seen:
                assert stats.max_event_time is not None and seen[-1] <= stats.max_event_time - LATENESS
        assert stats.watermarks >= (1 if stats.rows >= 50 else 0)
        assert (stats.rows == 0) == (stats.max_event_time is None)
    data_tasks = {rec.task for rec in wire if rec.kind == "data"}
    assert data_tasks == {t.task_name for t in result.tasks if t.rows}


def test_reader_takes_only_its_run(
    spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    schema = "user string, at timestamp, amount long"
    first = [(f"u{i}", dt.datetime(2026, 1, 1, 0, 0, i, tzinfo=dt.UTC), i) for i in range(20)]
    second = [(f"v{i}", dt.datetime(2026, 1, 2, 0, 0, i, tzinfo=dt.UTC), 100 + i) for i in range(30)]
    for run, rows in (("r1", first), ("r2", second)):
        write_intermediate(spark.createDataFrame(rows, schema).repartition(2), topic,
                           bootstrap_servers=bootstrap_servers, run_id=run, job_name="runs",
                           key_column="user", event_time_column="at", watermark_every_rows=5)
    for run, rows in (("r1", first), ("r2", second)):
        back = read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id=run, schema=schema,
                                 timeout=60).collect()
        assert sorted((r.user, r.at.replace(tzinfo=dt.UTC), r.amount) for r in back) == sorted(rows)


def test_rerun_of_a_committed_write_writes_nothing(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    df = spark.createDataFrame(make_rows(100, users=4), SCHEMA).repartition(3)
    args: dict[str, Any] = dict(bootstrap_servers=bootstrap_servers, run_id="r1", job_name="again",
                                key_column="user", event_time_column="ts")
    first = write_intermediate(df, topic, **args)
    before = dump_topic(kafka_config, topic, "read_uncommitted")
    second = write_intermediate(df, topic, **args)
    assert all(t.already_committed for t in second.tasks)
    assert [t.rows for t in second.tasks] == [t.rows for t in first.tasks]
    assert len(dump_topic(kafka_config, topic, "read_uncommitted")) == len(before)
    # A write of the same run with another task count is refused, before anything is written.
    for tasks in (2, 4):
        with pytest.raises(ControlMsgError, match=f"already committed with taskCount 3, this write has {tasks}"):
            write_intermediate(df.repartition(tasks), topic, **args)
    assert len(dump_topic(kafka_config, topic, "read_uncommitted")) == len(before)


def test_a_dataframe_without_partitions_still_ends_the_stream(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    # An empty RDD, and a filter the optimizer turns into an empty relation (where repartition(1) would
    # be optimized away too).
    for run, empty in (
        ("r1", spark.createDataFrame(spark.sparkContext.emptyRDD(), SCHEMA)),
        ("r2", spark.createDataFrame(make_rows(3, users=1), SCHEMA).filter("1 = 0")),
    ):
        assert empty.rdd.getNumPartitions() == 0
        topic = new_topic(2)
        result = write_intermediate(empty, topic, bootstrap_servers=bootstrap_servers, run_id=run,
                                    job_name="none", key_column="user", event_time_column="ts")
        assert result.task_count == 1 and result.rows == 0
        name = f"none-{run}-p0"
        assert count_by(dump_topic(kafka_config, topic), "eos") == {(0, name): 1, (1, name): 1}
        assert read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id=run, schema=SCHEMA,
                                 timeout=60).collect() == []
