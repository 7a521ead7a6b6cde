"""Task retries lose and duplicate nothing: first attempts that fail after writing leave nothing that
``read_committed`` readers see, and a retry of an attempt that had committed writes nothing again.

The faults are injected through the writer's ``at_stage`` seam, by a data source subclass that this
module registers (pickled by value, so Spark's workers need not import the tests)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from controlmsg.core.naming import transactional_id
from controlmsg.kafka import ControlReader, ControlWriter
from controlmsg.kafka.markers import MarkerStore
from controlmsg.spark import ControlMsgDataSource, run_status
from controlmsg.spark.options import WriteOptions
from controlmsg.spark.writing.batch_writer import BatchWriter
from tests.spark.helpers import SCHEMA, make_rows, options, read
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


class _FaultyWriter(BatchWriter):
    def at_stage(self, stage: str, writer: ControlWriter) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.attemptNumber() != 0:
            return
        task = ctx.partitionId()
        if stage == "before_commit" and task == 0:
            writer.flush()  # the records are in the broker's log, in the open transaction
            os._exit(3)  # the Python worker dies: no abort; the retry must fence and abort
        if stage == "before_commit" and task == 1:
            writer.flush()
            raise RuntimeError("injected failure before commit")
        if stage == "after_commit" and task == 2:
            raise RuntimeError("injected failure after commit")


class _FaultySource(ControlMsgDataSource):
    @classmethod
    def name(cls) -> str:
        return "controlmsg_faulty"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _FaultyWriter(WriteOptions.parse(self.options), schema)


def test_failed_first_attempts_leave_no_duplicates_and_no_early_end(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    rows = make_rows(400, users=9)
    df = spark.createDataFrame(rows, SCHEMA).repartition(4)  # round robin: every task has rows
    spark.dataSource.register(_FaultySource)
    opts = options(topic, bootstrap_servers, job="retry", key="user", eventTime="ts",
                   runTag="headers")  # records that name their task: counted per task below
    df.write.format("controlmsg_faulty").mode("append").options(**opts).save()

    status = run_status(opts)
    assert status is not None and status["ended"] and status["writeTasks"] == 4 and status["rows"] == 400
    names = [f"retry-r1-p{i}" for i in range(4)]
    attempts = {}
    for i, name in enumerate(names):
        with MarkerStore(kafka_config, transactional_id(topic, name), topic) as store:
            marker = store.load()
        assert marker is not None
        attempts[i] = marker["attempt"]
    assert attempts[0] >= 1 and attempts[1] >= 1  # their first attempts never committed
    assert attempts[2] == 0  # attempt 0 had committed: the retry found its marker and wrote nothing
    assert attempts[3] == 0

    # What read_committed readers see: every row once, the driver's end of stream once per partition.
    committed = dump_topic(kafka_config, topic, "read_committed")
    assert count_by(committed, "eos") == {(p, "retry-r1-driver"): 1 for p in range(3)}
    per_task = Counter(r.task for r in committed if r.kind == "data")
    assert sum(per_task.values()) == 400 and set(per_task) == set(names)
    back = read(spark, topic, bootstrap_servers, schema=SCHEMA).collect()
    assert sorted(tuple(r) for r in back) == sorted(rows)
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        list(reader.read_until_end(timeout=60))
        assert reader.tracker.is_ended
        assert reader.tracker.counters.duplicate_eos == 0
        assert all(s.ended_tasks == {"retry-r1-driver"} for s in reader.tracker.statuses())

    # The failed attempts did write (their records sit in aborted transactions), so the test exercised
    # what it claims: read_uncommitted shows the records of tasks 0 and 1 twice, of 2 and 3 once.
    everything = dump_topic(kafka_config, topic, "read_uncommitted")
    data = Counter(r.task for r in everything if r.kind == "data")
    for i, name in enumerate(names):
        assert data[name] == per_task[name] * (2 if i in (0, 1) else 1)
