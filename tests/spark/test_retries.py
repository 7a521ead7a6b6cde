"""Task retries lose and duplicate nothing: first attempts that fail after writing (with their end of
stream) leave nothing that ``read_committed`` readers see, and a retry of an attempt that had
committed writes nothing again."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.kafka import ControlReader, ControlWriter
from spark_jobs import read_intermediate, write_intermediate
from tests.spark.test_roundtrip import SCHEMA, make_rows
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_failed_first_attempts_leave_no_duplicates_and_no_early_end(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    rows = make_rows(400, users=9)
    df = spark.createDataFrame(rows, SCHEMA).repartition(4)  # round robin: every task has rows

    def faults(stage: str, writer: ControlWriter) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.attemptNumber() != 0:
            return
        task = ctx.partitionId()
        if stage == "before_commit" and task == 0:
            writer.flush()  # records and end of stream are in the broker's log, in the open transaction
            os._exit(3)  # the Python worker dies: no abort; the retry must fence and abort
        if stage == "before_commit" and task == 1:
            writer.flush()
            raise RuntimeError("injected failure before commit")
        if stage == "after_commit" and task == 2:
            raise RuntimeError("injected failure after commit")

    result = write_intermediate(
        df, topic, bootstrap_servers=bootstrap_servers, run_id="r1", job_name="retry", key_column="user",
        event_time_column="ts", watermark_every_rows=20, fault_hook=faults,
    )
    names = result.task_names
    by_index = {t.task_index: t for t in result.tasks}
    assert by_index[0].attempt >= 1 and not by_index[0].already_committed
    assert by_index[1].attempt >= 1 and not by_index[1].already_committed
    assert by_index[2].attempt >= 1 and by_index[2].already_committed  # attempt 0 had committed
    assert by_index[3].attempt == 0
    assert result.rows == 400

    # What read_committed readers see: every row once, every task's end of stream once per partition.
    committed = dump_topic(kafka_config, topic, "read_committed")
    assert count_by(committed, "eos") == {(p, n): 1 for p in range(3) for n in names}
    assert Counter(r.task for r in committed if r.kind == "data") == {t.task_name: t.rows for t in result.tasks}
    back = read_intermediate(spark, topic, bootstrap_servers=bootstrap_servers, run_id="r1", schema=SCHEMA,
                             timeout=60).collect()
    assert sorted(tuple(r) for r in back) == sorted(rows)
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        list(reader.read_until_end(timeout=60))
        assert reader.tracker.is_ended
        assert reader.tracker.counters.duplicate_eos == 0
        assert all(s.ended_tasks == frozenset(names) for s in reader.tracker.statuses())

    # The failed attempts did write (their records and end of stream sit in aborted transactions), so
    # the test exercised what it claims: read_uncommitted shows tasks 0 and 1 twice, 2 and 3 once.
    everything = dump_topic(kafka_config, topic, "read_uncommitted")
    eos = count_by(everything, "eos")
    data = Counter(r.task for r in everything if r.kind == "data")
    for t in result.tasks:
        twice = t.task_index in (0, 1)
        assert data[t.task_name] == t.rows * (2 if twice else 1)
        assert all(eos[(p, t.task_name)] == (2 if twice else 1) for p in range(3))
