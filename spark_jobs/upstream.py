"""The upstream side on Spark: a DataFrame written to an intermediate topic, each write task one upstream task.

:func:`write_intermediate` runs one Spark job whose tasks each write their partition of the DataFrame
as one upstream task of the protocol: ``taskName`` ``f"{job}-{run}-p{index}"`` (``index`` = the Spark
partition id), ``taskCount`` = the number of write tasks. Each task writes its rows (JSON, keyed by the
chosen column), a watermark every so many rows or milliseconds (its largest event time so far minus the
allowed lateness), and its end of stream to every partition when its input is done; a task without
rows still writes its end of stream.

**Task count.** Python's ``TaskContext`` does not know how many partitions its stage has, so the driver
fixes it: it builds the job's RDD once (``DataFrame.rdd`` of the ``mapInArrow`` that writes), reads
its partition count (with adaptive execution this runs the upstream shuffles first, so the count is
final) and hands it to the tasks as a job-local property, tagged with a token of this call so a task
can never act on another call's count. The same RDD is then run, so the count is the number of tasks.

**Retries: one Kafka transaction per task attempt, plus a commit marker.** Every attempt of task
``index`` uses the transactional id ``controlmsg-{topic}-{job}-{run}-p{index}`` and writes everything
(records, watermarks, end of stream) in a single transaction committed at the very end; downstream
readers are ``read_committed``. So:

* an attempt that fails before its commit (exception, killed worker, lost executor) leaves nothing
  visible: an exception aborts the transaction; a dead attempt's transaction is aborted by the next
  attempt's ``init_transactions``, which also fences the old producer if it is still alive (a zombie
  can then neither write nor commit);
* an attempt that committed but whose success Spark never learned (the task failed after the commit,
  the executor died on the way back) must not write again. So the transaction also commits a marker:
  an offset for the consumer group named like the transactional id (``send_offsets_to_transaction``),
  atomically with the records. A new attempt first fences, then looks the marker up; if it is there,
  the earlier attempt's output stands and this attempt writes nothing and reports its figures.

De-duplication by (task, sequence) downstream was the alternative; it is not sound here because a
retried Spark task need not produce the same records in the same order (the order of rows after a
shuffle is not deterministic), and it would still show an early end of stream of the failed attempt.
The price of the transactions: a task's output becomes visible to readers only when the task ends, and
while it runs, ``read_committed`` readers of a partition wait at its first record (Kafka's last stable
offset). Hence ``transaction_timeout_ms`` (default 10 minutes): a task must finish within it.

Speculative attempts are covered the same way: whichever attempt initialises last fences the other,
and one that starts after the other's commit finds the marker.

The marker also makes a re-run of the same write with the same ``run_id`` resumable: tasks that had
committed are skipped. That is right only if the DataFrame puts the same rows in the same partition
again (a deterministic input); otherwise give the re-run a new run id. A marker of another task count
is refused. Markers live in one empty consumer group per task and run, which Kafka drops after
``offsets.retention.minutes`` (7 days by default); a re-run after that writes again. With ACLs, the
writer needs Write on its transactional ids and Read on those groups.

Not supported: Spark Connect sessions (there is no RDD to fix the task count on).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, TopicPartition
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, NumericType, TimestampNTZType, TimestampType

from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP
from controlmsg.errors import ControlMsgError, DeliveryError
from controlmsg.kafka.admin import connection_settings, create_topic, wait_for_topic
from controlmsg.kafka.writer import ControlWriter
from spark_jobs.progress import Progress

__all__ = [
    "FaultHook",
    "TaskWriteStats",
    "WriteResult",
    "task_name",
    "transactional_id",
    "write_intermediate",
]

FaultHook = Callable[[str, ControlWriter], None]
"""Called in the task at ``"before_commit"`` (everything written, end of stream included, transaction
still open) and ``"after_commit"``; for fault-injection tests. Runs in the Spark worker."""

_TASK_COUNT_PROPERTY: Final = "controlmsg.write.taskCount"
_CLOCK_CHECK_ROWS: Final = 1024  # with a time interval, look at the clock at least this often
_STATS_SCHEMA: Final = pa.schema(
    [
        ("task_index", pa.int32()),
        ("attempt", pa.int32()),
        ("rows", pa.int64()),
        ("watermarks", pa.int64()),
        ("max_event_time", pa.int64()),
        ("already_committed", pa.bool_()),
        ("seconds", pa.float64()),
    ]
)
_STATS_DDL: Final = (
    "task_index int, attempt int, rows long, watermarks long, max_event_time long, "
    "already_committed boolean, seconds double"
)


def task_name(job_name: str, run_id: str, index: int) -> str:
    """The protocol ``taskName`` of write task ``index``: ``f"{job_name}-{run_id}-p{index}"``."""
    return f"{job_name}-{run_id}-p{index}"


def transactional_id(topic: str, job_name: str, run_id: str, index: int) -> str:
    """The Kafka transactional id (and commit-marker group) of write task ``index``: the same for every
    attempt of the task, different for every topic, job, run and task."""
    return f"controlmsg-{topic}-{task_name(job_name, run_id, index)}"


@dataclass(frozen=True, slots=True)
class TaskWriteStats:
    """What one write task did. ``attempt`` is the attempt that reported; ``already_committed`` means
    an earlier attempt had committed (its figures are reported) and this one wrote nothing."""

    task_index: int
    task_name: str
    attempt: int
    rows: int
    watermarks: int
    max_event_time: int | None
    already_committed: bool
    seconds: float


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The outcome of :func:`write_intermediate`: one entry per write task, in task order."""

    topic: str
    run_id: str
    task_count: int
    partitions: int
    tasks: tuple[TaskWriteStats, ...]
    seconds: float

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tasks)

    @property
    def task_names(self) -> list[str]:
        return [t.task_name for t in self.tasks]


@dataclass(frozen=True, slots=True)
class _TaskPlan:
    """Everything a write task needs, fixed on the driver and shipped (pickled) with the job."""

    topic: str
    partitions: int
    run_id: str
    job_name: str
    token: str
    config: tuple[tuple[str, Any], ...]
    allowed_lateness_ms: int
    every_rows: int | None
    every_ms: int | None
    timeout_s: float
    data_headers: bool
    fault_hook: FaultHook | None


def write_intermediate(
    df: DataFrame,
    topic: str,
    *,
    bootstrap_servers: str,
    run_id: str,
    job_name: str,
    key_column: str | None = None,
    event_time_column: str | None = None,
    allowed_lateness_ms: int = 0,
    watermark_every_rows: int | None = 10_000,
    watermark_every_ms: int | None = None,
    partitions: int | None = None,
    value_columns: Sequence[str] | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    transaction_timeout_ms: int = 600_000,
    data_headers: bool = True,
    topic_timeout: float = 30.0,
    fault_hook: FaultHook | None = None,
) -> WriteResult:
    """Write ``df`` to intermediate ``topic`` as run ``run_id`` of job ``job_name``; block until done.

    Each Spark task of the write is one upstream task (see the module docstring). Record values are the
    JSON object of ``value_columns`` (default: all columns), made by Spark's ``to_json`` (timestamps as
    ISO-8601 in UTC, nulls kept); keys are ``key_column`` as a string (null keys if ``None``).

    ``event_time_column``: epoch milliseconds (an integer column) or a timestamp/date column; ``None``
    writes no watermarks, only ends of stream. A task sends a watermark (its largest event time so far
    minus ``allowed_lateness_ms``, only when that rose) after every ``watermark_every_rows`` rows and/or
    once ``watermark_every_ms`` ms have passed since its previous one (checked between chunks of rows).

    ``partitions``: create the topic with this many partitions if it does not exist (an existing topic
    must have as many); ``None``: the topic must exist (waits up to ``topic_timeout`` s).
    ``kafka_config``: more librdkafka producer settings (security, batching...).
    ``transaction_timeout_ms``: the longest a write task may take (its single transaction).
    ``data_headers``: put the run (and task) in headers of every record, so that readers of a topic
    that holds several runs take only their run's records. Headers cost about half of the Python-side
    write throughput; turn them off only for a topic that never holds more than one run.

    Returns a :class:`WriteResult`. Raises :class:`~controlmsg.errors.TopicError` when the topic is
    missing or has another partition count; the Spark job's error (carrying the task's
    :class:`~controlmsg.errors.ControlMsgError`) when a task fails more often than Spark retries it.
    """
    if not job_name or not run_id:
        raise ValueError("job_name and run_id must be non-empty: they name the tasks and their transactions")
    if not hasattr(df, "_jdf"):
        raise TypeError("write_intermediate needs a classic SparkSession: Spark Connect DataFrames have no RDD "
                        "to fix the task count on")
    for name, every in (("watermark_every_rows", watermark_every_rows), ("watermark_every_ms", watermark_every_ms)):
        if every is not None and every < 1:
            raise ValueError(f"{name} must be at least 1, got {every}")
    started = time.monotonic()
    base: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **(kafka_config or {})}
    if partitions is not None:
        create_topic(base, topic, partitions, timeout=topic_timeout)
    else:
        partitions = wait_for_topic(base, topic, topic_timeout)

    producer_conf = {"transaction.timeout.ms": transaction_timeout_ms, **base}
    plan = _TaskPlan(
        topic=topic,
        partitions=partitions,
        run_id=run_id,
        job_name=job_name,
        token=uuid.uuid4().hex,
        config=tuple(producer_conf.items()),
        allowed_lateness_ms=allowed_lateness_ms,
        every_rows=watermark_every_rows,
        every_ms=watermark_every_ms,
        timeout_s=max(topic_timeout, 30.0),
        data_headers=data_headers,
        fault_hook=fault_hook,
    )
    projected = df.select(
        _key_expr(key_column),
        _event_time_expr(df, event_time_column),
        _value_expr(list(value_columns) if value_columns is not None else df.columns),
    )
    write = functools.partial(_write_task, plan)
    # Build the RDD once: its partition count is the task count, and the same RDD is what runs.
    rdd = projected.mapInArrow(write, _STATS_DDL).rdd
    task_count = rdd.getNumPartitions()
    if task_count == 0:
        # A DataFrame without partitions (Spark plans an empty relation so) would run no task, so no end
        # of stream would ever come. It has no rows: one task over an empty partition stands in for it
        # (not repartition(1), which the optimizer drops for an empty relation).
        spark = df.sparkSession
        one_empty = spark.createDataFrame(spark.sparkContext.parallelize([], 1), projected.schema)
        rdd = one_empty.mapInArrow(write, _STATS_DDL).rdd
        task_count = rdd.getNumPartitions()
        if task_count != 1:
            raise ControlMsgError(f"write to topic {topic!r}: cannot give an empty DataFrame a write task")
    _refuse_other_task_count(plan, task_count)
    sc = df.sparkSession.sparkContext
    previous = sc.getLocalProperty(_TASK_COUNT_PROPERTY)
    sc.setLocalProperty(_TASK_COUNT_PROPERTY, f"{plan.token}:{task_count}")
    try:
        rows = rdd.collect()
    finally:
        sc.setLocalProperty(_TASK_COUNT_PROPERTY, previous)  # type: ignore[arg-type]  # None removes it
    stats = sorted(
        (
            TaskWriteStats(
                task_index=r.task_index,
                task_name=task_name(job_name, run_id, r.task_index),
                attempt=r.attempt,
                rows=r.rows,
                watermarks=r.watermarks,
                max_event_time=r.max_event_time,
                already_committed=r.already_committed,
                seconds=r.seconds,
            )
            for r in rows
        ),
        key=lambda s: s.task_index,
    )
    if [s.task_index for s in stats] != list(range(task_count)):
        raise ControlMsgError(
            f"write to topic {topic!r}: expected reports of tasks 0..{task_count - 1}, got "
            f"{[s.task_index for s in stats]}"
        )
    return WriteResult(topic, run_id, task_count, partitions, tuple(stats), time.monotonic() - started)


# ---------------------------------------------------------------------------------------------- driver


def _quoted(column: str) -> Column:
    return F.col("`" + column.replace("`", "``") + "`")


def _key_expr(key_column: str | None) -> Column:
    if key_column is None:
        return F.lit(None).cast("string").alias("k")
    return _quoted(key_column).cast("string").alias("k")


def _event_time_expr(df: DataFrame, column: str | None) -> Column:
    if column is None:
        return F.lit(None).cast("long").alias("t")
    dtype = df.schema[column].dataType
    col = _quoted(column)
    if isinstance(dtype, TimestampType | TimestampNTZType):
        return F.unix_millis(col.cast("timestamp")).alias("t")
    if isinstance(dtype, DateType):
        return F.unix_millis(col.cast("timestamp")).alias("t")
    if isinstance(dtype, NumericType):
        return col.cast("long").alias("t")
    raise TypeError(f"event time column {column!r} must be epoch ms (a number), a timestamp or a date, not {dtype}")


def _value_expr(columns: list[str]) -> Column:
    if not columns:
        raise ValueError("a record value needs at least one column")
    struct = F.struct(*[_quoted(c) for c in columns])
    options = {"timeZone": "UTC", "ignoreNullFields": "false"}
    return F.to_json(struct, options).cast("binary").alias("v")


# ---------------------------------------------------------------------------------------------- task


def _task_count(plan: _TaskPlan) -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None
    value = ctx.getLocalProperty(_TASK_COUNT_PROPERTY) or ""
    token, _, count = value.partition(":")
    if token != plan.token or not count.isdigit():
        raise ControlMsgError(
            f"write to topic {plan.topic!r}: the task count did not reach the task (local property "
            f"{_TASK_COUNT_PROPERTY!r} is {value!r}); write_intermediate needs PySpark's pinned threads "
            "(PYSPARK_PIN_THREAD, on by default)"
        )
    return int(count)


def _refuse_other_task_count(plan: _TaskPlan, task_count: int) -> None:
    """On the driver, before any task runs: refuse a write of a run that already committed with another
    task count (seen from task 0's marker), so that no task of this write commits anything. Each task
    checks its own marker too."""
    consumer = Consumer({**connection_settings(dict(plan.config)), "enable.auto.commit": False,
                         "group.id": transactional_id(plan.topic, plan.job_name, plan.run_id, 0),
                         "isolation.level": "read_committed"})
    try:
        earlier = _committed_marker(consumer, plan.topic, plan.timeout_s)
    finally:
        consumer.close()
    if earlier is not None and earlier.get("taskCount") != task_count:
        raise ControlMsgError(
            f"write to topic {plan.topic!r}: run {plan.run_id!r} of job {plan.job_name!r} was already "
            f"committed with taskCount {earlier.get('taskCount')}, this write has {task_count} tasks; use a "
            "new run id"
        )


def _committed_marker(consumer: Consumer, topic: str, timeout: float) -> dict[str, Any] | None:
    """The marker an earlier attempt committed with its transaction, or ``None``."""
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=timeout)
    except KafkaException as exc:
        raise DeliveryError(f"cannot look up the commit marker on topic {topic!r}: {exc.args[0]}") from exc
    if tp.error is not None:
        raise DeliveryError(f"cannot look up the commit marker on topic {topic!r}: {tp.error}")
    if tp.offset < 0:
        return None
    marker: dict[str, Any] = orjson.loads(tp.metadata or "{}")
    return marker


def _send_marker(writer: ControlWriter, consumer: Consumer, marker: dict[str, Any], timeout: float) -> None:
    """Add the commit marker to the writer's open transaction."""
    position = TopicPartition(writer.topic, 0, int(marker["rows"]), metadata=orjson.dumps(marker).decode())
    writer.send_offsets_to_transaction([position], consumer.consumer_group_metadata(), timeout)


def _write_task(plan: _TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of one write task (runs in a Spark Python worker)."""
    from pyspark import TaskContext

    started = time.monotonic()
    ctx = TaskContext.get()
    assert ctx is not None
    index, attempt = ctx.partitionId(), ctx.attemptNumber()
    count = _task_count(plan)
    if index >= count:
        raise ControlMsgError(f"write to topic {plan.topic!r}: task {index} is beyond the task count {count}")
    name = task_name(plan.job_name, plan.run_id, index)
    txn_id = transactional_id(plan.topic, plan.job_name, plan.run_id, index)
    config = dict(plan.config)
    writer = ControlWriter(
        {**config, "transactional.id": txn_id},
        plan.topic,
        task_name=name,
        task_count=count,
        run_id=plan.run_id,
        partitions=plan.partitions,
        data_headers=plan.data_headers,
        topic_timeout=plan.timeout_s,
    )
    # The writer's init_transactions has fenced earlier attempts and finished their transactions, so
    # the marker now tells for sure whether one of them committed.
    consumer = Consumer(
        {
            **connection_settings(config),
            "group.id": txn_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        earlier = _committed_marker(consumer, plan.topic, plan.timeout_s)
        if earlier is not None:
            writer.close(plan.timeout_s)  # nothing was sent: ends the empty transaction
            if earlier.get("taskCount") != count:
                raise ControlMsgError(
                    f"write to topic {plan.topic!r}: task {name!r} was already committed with taskCount "
                    f"{earlier.get('taskCount')}, this write has {count}; use a new run id"
                )
            for _ in batches:  # the input must still be consumed
                pass
            yield _stats_batch(index, attempt, earlier, True, started)
            return
        with writer:  # an exception inside aborts the transaction
            rows, marks, max_t = _write_rows(writer, batches, plan)
            writer.send_end_of_stream()
            if plan.fault_hook is not None:
                plan.fault_hook("before_commit", writer)
            marker = {"taskCount": count, "rows": rows, "watermarks": marks, "maxEventTime": max_t,
                      "attempt": attempt}
            _send_marker(writer, consumer, marker, plan.timeout_s)
        # Leaving the block committed the transaction: records, end of stream and marker together.
        if plan.fault_hook is not None:
            plan.fault_hook("after_commit", writer)
    finally:
        consumer.close()
    yield _stats_batch(index, attempt, marker, False, started)


def _stats_batch(index: int, attempt: int, marker: Mapping[str, Any], already: bool, started: float) -> pa.RecordBatch:
    row = {
        "task_index": index,
        "attempt": attempt,
        "rows": marker["rows"],
        "watermarks": marker["watermarks"],
        "max_event_time": marker["maxEventTime"],
        "already_committed": already,
        "seconds": time.monotonic() - started,
    }
    return pa.RecordBatch.from_pylist([row], schema=_STATS_SCHEMA)


def _write_rows(
    writer: ControlWriter, batches: Iterator[pa.RecordBatch], plan: _TaskPlan
) -> tuple[int, int, int | None]:
    """Send every row (column 0 key, 1 event time, 2 JSON value) and the watermarks; return the number
    of rows, of watermarks sent and the largest event time."""
    send = writer.send_bytes
    every_rows = plan.every_rows
    every_s = plan.every_ms / 1000.0 if plan.every_ms is not None else None
    lateness = plan.allowed_lateness_ms
    rows = marks = since = 0
    max_t: int | None = None
    last_sent: int | None = None
    last_time = time.monotonic()
    progress = Progress(f"writer {writer.topic} task {writer.task_name}")
    for batch in batches:
        if progress.due():
            progress.log(f"{rows} rows written, watermark {last_sent if last_sent is not None else 'none yet'}")
        n = batch.num_rows
        start = 0
        while start < n:
            take = n - start
            if every_rows is not None:
                take = min(take, every_rows - since)
            if every_s is not None:
                take = min(take, _CLOCK_CHECK_ROWS)
            chunk = batch.slice(start, take)
            for key, value in zip(chunk.column(0).to_pylist(), chunk.column(2).to_pylist(), strict=True):
                send(value, key)
            top = pc.max(chunk.column(1)).as_py()
            if top is not None and (max_t is None or top > max_t):
                max_t = top
            rows += take
            since += take
            start += take
            due = every_rows is not None and since >= every_rows
            if every_s is not None:
                now = time.monotonic()
                if now - last_time >= every_s:
                    due = True
            if due:
                since = 0
                last_time = time.monotonic()
                if max_t is not None:
                    mark = min(max(max_t - lateness, MIN_TIMESTAMP), MAX_TIMESTAMP - 1)
                    if last_sent is None or mark > last_sent:
                        writer.send_watermark(mark)
                        last_sent = mark
                        marks += 1
    return rows, marks, max_t
