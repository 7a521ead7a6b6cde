"""Option ``commitRows``: a batch write task that commits as it goes keeps exactly once under retries. A
retry resumes after the chunks an earlier attempt committed; a retry whose input is not the same rows in
the same order fails instead of writing anything twice, and the run does not end.

Faults are injected through the writer's ``at_stage`` seam and by overriding its ``write``, in data
source subclasses this module registers (pickled by value)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import StructType

from controlmsg.core.naming import transactional_id
from controlmsg.kafka import ControlWriter
from controlmsg.kafka.markers import MarkerStore
from controlmsg.spark import ControlMsgDataSource, run_status
from controlmsg.spark.options import WriteOptions
from controlmsg.spark.writing.batch_writer import BatchWriter
from controlmsg.spark.writing.task import TaskCommit
from tests.spark.helpers import SCHEMA, make_rows, options, read
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

_ROWS_PER_BATCH = 25
_COMMIT_ROWS = 80  # a chunk is committed after every fourth Arrow batch of 25 rows


def _chunked(rows: int) -> int:
    """How many of a task's ``rows`` its chunks commit before its last transaction: Arrow batches of
    ``_ROWS_PER_BATCH``, a commit after the batch that brings ``_COMMIT_ROWS`` or more since the last."""
    sent = since = committed = 0
    for size in [_ROWS_PER_BATCH] * (rows // _ROWS_PER_BATCH) + [rows % _ROWS_PER_BATCH]:
        sent += size
        since += size
        if since >= _COMMIT_ROWS:
            committed, since = sent, 0
    return committed


def _attempt() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None
    return ctx.partitionId(), ctx.attemptNumber()


class _FailsBeforeLastCommit(BatchWriter):
    """Task 0's first attempt dies after its chunks but the last are committed, the last one sent."""

    def at_stage(self, stage: str, writer: ControlWriter) -> None:
        if stage == "before_commit" and _attempt() == (0, 0):
            writer.flush()  # the last chunk's records are in the log, in the open transaction
            raise RuntimeError("injected failure before the last commit")


class _ReorderedRetry(_FailsBeforeLastCommit):
    """As above, and the retry's input comes in another order (as after a shuffle)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        if _attempt()[1] == 0:
            return super().write(iterator)
        batches = list(iterator)
        table = pa.Table.from_batches(batches[::-1]).combine_chunks()
        return super().write(iter(table.to_batches(max_chunksize=_ROWS_PER_BATCH)))


def _source(writer: type[BatchWriter], source_name: str) -> type[ControlMsgDataSource]:
    class Source(ControlMsgDataSource):
        @classmethod
        def name(cls) -> str:
            return source_name

        def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
            return writer(WriteOptions.parse(self.options), schema)

    return Source


@pytest.fixture
def small_batches(spark: SparkSession) -> Iterator[None]:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key) or "1000"
    spark.conf.set(key, str(_ROWS_PER_BATCH))
    yield
    spark.conf.set(key, before)


def _sorted_input(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    # 2 tasks, each sorted on every column (the rows are unique): a retry sees the same rows in the same order.
    return spark.createDataFrame(rows, SCHEMA).repartition(2).sortWithinPartitions("ts", "user", "amount", "score")


def test_a_retry_resumes_after_the_committed_chunks(
    spark: SparkSession, small_batches: None, bootstrap_servers: str, kafka_config: dict[str, Any],
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic(3)
    rows = make_rows(300, users=7)
    assert len({r[:4] for r in rows}) == 300
    spark.dataSource.register(_source(_FailsBeforeLastCommit, "controlmsg_chunk_fault"))
    # runTag headers: each record names its task, which the counts per task below need.
    opts = options(topic, bootstrap_servers, job="chunk", key="user", eventTime="ts", commitRows=str(_COMMIT_ROWS),
                   runTag="headers")
    _sorted_input(spark, rows).write.format("controlmsg_chunk_fault").mode("append").options(**opts).save()

    status = run_status(opts)
    assert status is not None and status["ended"] and status["rows"] == 300
    committed = dump_topic(kafka_config, topic, "read_committed")
    assert count_by(committed, "eos") == {(p, "chunk-r1-driver"): 1 for p in range(3)}
    per_task = Counter(r.task for r in committed if r.kind == "data")
    assert set(per_task) == {"chunk-r1-p0", "chunk-r1-p1"} and sum(per_task.values()) == 300
    back = read(spark, topic, bootstrap_servers, schema=SCHEMA).collect()
    assert sorted(tuple(r) for r in back) == sorted(rows)
    n0 = per_task["chunk-r1-p0"]
    with MarkerStore(kafka_config, transactional_id(topic, "chunk-r1-p0"), topic) as store:
        marker = store.load()
    assert marker is not None and marker["attempt"] >= 1 and not marker.get("partial") and marker["rows"] == n0

    # The first attempt's committed chunks stayed and were not written again: read_uncommitted holds task
    # 0's rows once, plus the records of the first attempt's last transaction, which was aborted.
    chunked = _chunked(n0)
    assert 0 < chunked < n0  # the test exercises a resume in the middle
    written = Counter(r.task for r in dump_topic(kafka_config, topic, "read_uncommitted") if r.kind == "data")
    assert written["chunk-r1-p0"] == n0 + (n0 - chunked)
    assert written["chunk-r1-p1"] == per_task["chunk-r1-p1"]


def test_a_retry_with_its_input_in_another_order_fails_and_the_run_does_not_end(
    spark: SparkSession, small_batches: None, bootstrap_servers: str, kafka_config: dict[str, Any],
    new_topic: Callable[..., str],
) -> None:
    topic = new_topic(3)
    rows = make_rows(300, users=7)
    spark.dataSource.register(_source(_ReorderedRetry, "controlmsg_chunk_reorder"))
    opts = options(topic, bootstrap_servers, job="reorder", key="user", eventTime="ts",
                   commitRows=str(_COMMIT_ROWS), runTag="headers")  # records that name their task, counted below
    with pytest.raises(Exception, match="cannot resume exactly once"):
        _sorted_input(spark, rows).write.format("controlmsg_chunk_reorder").mode("append").options(**opts).save()

    assert run_status(opts) is None  # the driver wrote no round: no end of stream
    committed = dump_topic(kafka_config, topic, "read_committed")
    assert count_by(committed, "eos") == {}
    data = [r for r in committed if r.kind == "data"]
    per_task = Counter(r.task for r in data)
    # The first attempt's chunks, and nothing of the retries (task 1 had committed whole: no round came).
    assert per_task["reorder-r1-p0"] == _chunked(300 - per_task["reorder-r1-p1"]) > 0
    assert len({(r.partition, r.offset) for r in data}) == len(data)
    with MarkerStore(kafka_config, transactional_id(topic, "reorder-r1-p0"), topic) as store:
        marker = store.load()
    assert marker is not None and marker["partial"] and marker["attempt"] == 0
    assert marker["rows"] == per_task["reorder-r1-p0"]
