"""Writing a DataFrame to an intermediate topic: the batch and stream writers of ``controlmsg``.

**Tasks write records; the driver is the one upstream task.** Each Spark write task writes its rows,
keyed by the ``key`` column, in ONE Kafka transaction with a commit marker (see
:mod:`controlmsg.kafka.markers`; a batch write with the option ``commitRows`` commits as it goes, in several,
see :mod:`controlmsg.spark.chunks`) and reports what it wrote; its records carry its name
(:func:`~controlmsg.core.naming.task_name`: ``<job>-<runId>-p<partition id>``) in the ``controlmsg-task``
header, but it writes no control message. The driver, once every task of the write (or micro-batch) has
committed, is the **one upstream task of the protocol** (``taskName``
:func:`~controlmsg.core.naming.driver_task_name`, ``<job>-<runId>-driver``; ``taskCount`` 1): it writes one
control message to every partition in one transaction with a marker of its own. So a round is O(partitions)
messages, whatever the number of write tasks, and readers keep one task per partition. It speaks for the
tasks: every task's records are committed, so on every partition before the round, when it writes it.

* batch (``df.write``): the end of stream. No intermediate watermarks: a reader ends only at the end of
  stream, whether each task's records became visible at once when it committed or chunk by chunk.
* stream (``df.writeStream``), after every micro-batch: one watermark. When the query
  has an event-time watermark (``with_watermark``, or Spark's own ``withWatermark``), it is **the stage's
  watermark**: Spark's watermark in force in that micro-batch, read from the query's offset log, so a
  stage over a controlmsg stream carries its input's reconciled watermark onward. The offset log is read
  on the driver's local file system only: a ``checkpointLocation`` elsewhere (``hdfs:``, ``s3a:``...) or
  none is refused when the query starts, unless the option ``stageProgress`` is ``eventTime``, the weaker
  rule below with no end by itself (:mod:`controlmsg.spark.query_log` says why). Otherwise it is the
  largest ``eventTime`` written so far minus ``allowedLateness`` (Spark's own rule for ``withWatermark``:
  event time is compared across partitions, because partition *i* of one micro-batch has nothing to do
  with partition *i* of the next). The number of writer partitions may change from one micro-batch to the
  next: they are not upstream tasks of the protocol. The stream **ends by itself** when its input did: in
  the first micro-batch after which every source of the query is a controlmsg stream that has ended (or a
  plain topic read with ``availableNowEnds``, :mod:`controlmsg.spark.plain`) and, for a query that keeps
  state, whose watermark is the end of time, i.e. after the micro-batch in which Spark emitted the last
  windows (a stateless stage, such as an ingest that parses and keys a plain topic, ends with its input).
  :func:`end_stream` ends it by hand (a source that never ends, a query stopped for good).

A run that an earlier version of this writer started (one control message per write task per partition,
its marker without ``"upstream": "driver"``) goes on as the next generation of the run (docs/PROTOCOL.md,
"Generations"): the driver's transactional id is the same, so its init fences the earlier rounds, and the
driver's first round replaces the old task set on every partition.

**Exactly once.** Every attempt of a task uses the same transactional id; initialising transactions
fences older attempts and finishes their transactions, then the task reads its marker: if an attempt
already committed this write (a batch write) or this micro-batch (a stream, the marker holds the batch
id), it writes nothing and reports the committed figures. The driver's control round is guarded the same
way, so a replayed micro-batch (a query restarted from its checkpoint) writes nothing twice. A marker of
another streaming query (another ``queryId``) is refused: a new query needs a new ``runId``.

Record values are the row as a JSON object: every column, nulls kept, timestamps as ISO-8601 in UTC
(``...Z``), dates as ``YYYY-MM-DD``, decimals as exact JSON numbers, binary as base64, structs, arrays and
maps as JSON objects and arrays. Keys are the ``key`` column as a string (null without ``key``).
With the option ``value`` (a string or binary column) a record's payload is that column's bytes as they
are instead, serialized by Spark itself (``to_json(struct(*))``, ``to_avro``...) as for ``format("kafka")``:
no Python object per row (the other columns serve ``key`` and ``eventTime`` and are not written). A null in
it fails the task, naming the row. A column ``headers`` of ``format("kafka")``'s type
(``array<struct<key:string,value:binary>>``, value string taken too) is each record's headers, sent after
controlmsg's own (``controlmsg-run`` first, which readers look at) and left out of the JSON value; a header
whose name starts ``controlmsg-`` fails the task in one line, so that no row can pass for another run or
task (a ``headers`` column of any other type is a field of the value, as before).
"""

from __future__ import annotations

import base64
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    DateType,
    NumericType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from controlmsg.core.codec import encode_json_rows, encode_user, encode_user_rows
from controlmsg.core.messages import MAX_TIMESTAMP, EndOfStreamMessage, WatermarkMessage
from controlmsg.core.naming import (
    driver_task_name,
    driver_transactional_id,
    stage_transactional_id,
    task_name,
    transactional_id,
)
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import create_topic, partition_count
from controlmsg.kafka.background import run_later
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.refusals import mark_reached
from controlmsg.kafka.settings import worker_logging
from controlmsg.kafka.writer import RESERVED_HEADER_PREFIX, ControlWriter, fence_transactions
from controlmsg.spark.arrow_json import flat_json_envelopes
from controlmsg.spark.chunks import Chunks
from controlmsg.spark.options import STAGE_PROGRESS_DRIVER, STAGE_PROGRESS_OFFSET_LOG, WriteOptions
from controlmsg.spark.phases import log_phase
from controlmsg.spark.query_log import (
    END_OF_TIME_MS,
    check_offset_log_follows,
    offset_log_dir,
    query_id,
    stage_progress,
)

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow (and pyarrow.compute, the slowest of all to import) is imported in the task functions that use it,
# not here: the driver's short-lived Python workers that unpickle the writer to call commit() need neither.

__all__ = ["BatchWriter", "StreamWriter", "TaskCommit", "end_stream", "run_status", "upstream_of"]

_BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
_QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
_QUERY_RUN_PROPERTIES: Final = ("sql.streaming.runId", "spark.jobGroup.id")
"""Where a task finds its streaming query's run id: Spark's run-id property, else the job group, which a
streaming query sets to its run id."""
_JSON_OPTIONS: Final = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS
_USER_ENVELOPE: Final = encode_user(b"")
"""A user record's envelope before its payload: a flat row's JSON is made after it in Arrow (arrow_json)."""
_DRIVER: Final = "driver"
"""The driver's marker says ``"upstream": "driver"``: the driver is the run's one upstream task."""


@dataclass(frozen=True, slots=True)
class TaskCommit(WriterCommitMessage):
    """What one write task reports to the driver. ``already_committed``: an earlier attempt had committed
    and this one wrote nothing (the figures are the committed ones)."""

    index: int
    attempt: int
    rows: int
    max_event_time: int | None
    already_committed: bool
    query_id: str | None
    seconds: float
    query_run: str | None = None
    """The streaming query's run (Spark's ``runId``: a new one at every start of the query)."""
    skipped: bool = False
    """A stream's first attempt of a task with no row: it did not touch Kafka (no transaction, no marker)."""


@dataclass(frozen=True, slots=True)
class _Plan:
    """Everything a write task needs, fixed on the driver and pickled with the writer."""

    opts: WriteOptions
    partitions: int
    key_index: int | None
    event_time_index: int | None
    value_index: int | None = None
    """The column whose bytes are each record's payload (option ``value``); ``None``: the row as JSON."""
    headers_index: int | None = None
    """The column ``headers`` (``array<struct<key string, value binary>>``, as ``format("kafka")`` writes
    it): each row's record headers, after controlmsg's own; not part of the JSON value."""


def _plan(opts: WriteOptions, schema: StructType) -> _Plan:
    """Check the columns against ``schema``, create the topic when missing; returns the plan."""
    names = schema.fieldNames()
    key_index = event_index = value_index = None
    if opts.value is not None:
        if opts.value not in names:
            raise ValueError(f"option 'value': no column {opts.value!r} (columns: {', '.join(names)})")
        value_index = names.index(opts.value)
        dtype = schema[opts.value].dataType
        if not isinstance(dtype, StringType | BinaryType):
            raise ValueError(f"option 'value': column {opts.value!r} must be a string or binary column (the "
                             f"payload as the downstream's serde reads it, e.g. to_json(struct(*))), not "
                             f"{dtype.simpleString()}")
    if opts.key is not None:
        if opts.key not in names:
            raise ValueError(f"option 'key': no column {opts.key!r} (columns: {', '.join(names)})")
        key_index = names.index(opts.key)
    if opts.event_time is not None:
        if opts.event_time not in names:
            raise ValueError(f"option 'eventTime': no column {opts.event_time!r} (columns: {', '.join(names)})")
        event_index = names.index(opts.event_time)
        dtype = schema[opts.event_time].dataType
        if not isinstance(dtype, TimestampType | TimestampNTZType | DateType | NumericType):
            raise ValueError(f"option 'eventTime': column {opts.event_time!r} must be a timestamp, a date or epoch "
                             f"milliseconds (a number), not {dtype.simpleString()}")
    headers_index = _headers_column(schema)
    if not names or names == [_HEADERS]:
        raise ValueError("a record value needs at least one column")
    config = dict(opts.config)
    have = partition_count(config, opts.topic, opts.timeout)
    if have is None:
        create_topic(config, opts.topic, opts.partitions, replication_factor=opts.replication_factor,
                     topic_config=dict(opts.topic_config), timeout=opts.timeout)
        have = opts.partitions
    return _Plan(opts, have, key_index, event_index, value_index, headers_index)


_HEADERS: Final = "headers"
_HEADERS_TYPE: Final = "array<struct<key:string,value:binary>>"


def _headers_column(schema: StructType) -> int | None:
    """The index of the column ``headers`` when it is an array of ``key``/``value`` structs (record
    headers, as ``format("kafka")`` takes them); ``None`` when there is none, or it is of another type (then
    it is an ordinary field of the JSON value, as before). A key that is not a string, or a value that is
    not binary or a string, is refused."""
    from pyspark.sql.types import ArrayType

    if _HEADERS not in schema.fieldNames():
        return None
    dtype = schema[_HEADERS].dataType
    if not (isinstance(dtype, ArrayType) and isinstance(dtype.elementType, StructType)
            and dtype.elementType.fieldNames() == ["key", "value"]):
        return None
    element = dtype.elementType
    if not isinstance(element["key"].dataType, StringType) or not isinstance(element["value"].dataType,
                                                                               BinaryType | StringType):
        raise ValueError(f"column 'headers' (record headers) must be {_HEADERS_TYPE} (value binary or string), "
                         f"not {dtype.simpleString()}")
    return schema.fieldNames().index(_HEADERS)


def _refuse_ended(opts: WriteOptions, query: str | None = None) -> dict[str, Any] | None:
    """The driver's committed marker of this run; refuse to write to a run that has ended, unless streaming
    query ``query`` ended it (its micro-batches after the end, which have no rows, write nothing)."""
    marker = run_status(opts)
    if marker is not None and marker.get("ended") and (query is None or marker.get("queryId") != query):
        raise ControlMsgError(
            f"topic {opts.topic!r}: run {opts.run_id!r} of job {opts.job!r} has already ended (its end of stream "
            "is written); write a new run with a new runId")
    return marker


def upstream_of(opts: WriteOptions, committed: Mapping[str, Any] | None) -> tuple[str, int, bool]:
    """The driver's ``taskName``, the generation of its rounds, and whether that generation starts now: the
    committed generation, or the next one when an earlier version of this writer started the run (its
    marker has no ``"upstream": "driver"``: each write task was an upstream task, with its own control
    messages). The driver's transactional id is that writer's too, so its init has fenced those rounds."""
    generation = 0 if committed is None else int(committed.get("generation", 0))
    switch = committed is not None and committed.get("upstream") != _DRIVER
    return driver_task_name(opts.job, opts.run_id), generation + switch, switch


# ---------------------------------------------------------------------------------------------- batch


class BatchWriter(DataSourceArrowWriter):
    """``df.write.format("controlmsg")``: see the module docstring. Created on the driver."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        _refuse_ended(opts)  # before anything is created
        self.plan = _plan(opts, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        return _write_task(self.plan, iterator, batch_id=0, query_id=None, stage=self.at_stage)

    def at_stage(self, stage: str, writer: ControlWriter) -> None:
        """Called in the task at ``"before_commit"`` (records and marker sent, the transaction open) and
        ``"after_commit"``. Does nothing; a seam for the tests of the exactly-once machinery."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self.plan.opts
        commits = _task_commits(opts, messages)
        # Spark runs no task for a DataFrame without partitions (an empty relation): the driver ends the run
        # all the same, so that readers see it end.
        tasks = len(commits)
        rows = sum(c.rows for c in commits)

        def plan(committed: dict[str, Any] | None) -> Round | None:
            if committed is not None and committed.get("ended"):
                return None
            name, generation, _ = upstream_of(opts, committed)
            marker = {"upstream": _DRIVER, "taskCount": 1, "generation": generation, "ended": True,
                      "writeTasks": tasks, "rows": rows, "maxEventTime": _max_time(commits)}
            return [EndOfStreamMessage(name, 1, opts.run_id, generation=generation)], marker

        done = write_control_round(dict(opts.config), opts.topic, self.plan.partitions, plan,
                                   transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                                   timeout=opts.timeout)
        if done is not None and (done.get("writeTasks", done.get("taskCount")), done.get("rows")) != (tasks, rows):
            raise ControlMsgError(f"topic {opts.topic!r}: run {opts.run_id!r} had already ended with "
                                  f"{done.get('rows')} rows from {done.get('writeTasks', done.get('taskCount'))} "
                                  f"tasks, this write has {rows} from {tasks}; use a new runId")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # failed tasks aborted their transactions; committed ones stay, and a rerun skips them


def _task_commits(opts: WriteOptions, messages: Sequence[WriterCommitMessage | None]) -> list[TaskCommit]:
    commits = sorted((m for m in messages if isinstance(m, TaskCommit)), key=lambda c: c.index)
    if [c.index for c in commits] != list(range(len(messages))):
        raise ControlMsgError(f"write to topic {opts.topic!r}: expected reports of tasks 0..{len(messages) - 1}, "
                              f"got {[c.index for c in commits]}")
    return commits


def _max_time(commits: Sequence[TaskCommit]) -> int | None:
    times = [c.max_event_time for c in commits if c.max_event_time is not None]
    return max(times) if times else None


# ---------------------------------------------------------------------------------------------- stream


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("controlmsg")``: see the module docstring. Created on the driver."""

    def __init__(self, opts: WriteOptions, schema: StructType) -> None:
        made = time.monotonic()
        # Made when the query starts, and again for every micro-batch: a checkpoint whose offset log the writer
        # cannot read is refused before anything is created or written.
        self.offset_log: Path | None = (offset_log_dir(opts.checkpoint, opts.topic)
                                        if opts.stage_progress == STAGE_PROGRESS_OFFSET_LOG else None)
        # Micro-batches after the end this query wrote are let through. With stageProgress driver the query's id
        # is out of reach here (its checkpoint may be anywhere): its tasks compare theirs with the marker's.
        if opts.stage_progress == STAGE_PROGRESS_DRIVER:
            marker = run_status(opts)
        else:
            marker = _refuse_ended(opts, query_id(opts.checkpoint))
        self.ended = bool(marker and marker.get("ended"))
        self.ended_by: str | None = None if marker is None else marker.get("queryId")
        """The streaming query that wrote the run, when it has ended."""
        self.plan = _plan(opts, schema)
        self.init_ms = round((time.monotonic() - made) * 1000, 1)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        batch = ctx.getLocalProperty(_BATCH_ID_PROPERTY)
        if batch is None or not batch.lstrip("-").isdigit():
            raise ControlMsgError(f"write to topic {self.plan.opts.topic!r}: the micro-batch id did not reach the "
                                  f"task (local property {_BATCH_ID_PROPERTY!r} is {batch!r})")
        if self.ended:  # a micro-batch after this query's end of stream (e.g. Spark's last no-data batch)
            if ctx.getLocalProperty(_QUERY_ID_PROPERTY) != self.ended_by:
                _refuse_ended(self.plan.opts)
            if any(b.num_rows for b in iterator):
                raise ControlMsgError(f"topic {self.plan.opts.topic!r}: run {self.plan.opts.run_id!r} has ended; "
                                      f"micro-batch {batch} of the same query has rows after its end of stream")
            return TaskCommit(ctx.partitionId(), ctx.attemptNumber(), 0, None, True,
                              ctx.getLocalProperty(_QUERY_ID_PROPERTY), 0.0, _query_run(ctx))
        began = time.monotonic()
        iterator, empty = _rows_ahead(iterator)
        if empty and ctx.attemptNumber() == 0:
            # A first attempt with nothing to write leaves Kafka alone: no earlier attempt of this task in this
            # micro-batch can have an open transaction, and any of an earlier run of the query (a replayed
            # micro-batch) is fenced by the driver's commit (see commit).
            done = TaskCommit(ctx.partitionId(), 0, 0, None, False, ctx.getLocalProperty(_QUERY_ID_PROPERTY),
                              time.monotonic() - began, _query_run(ctx), skipped=True)
        else:
            done = dataclasses.replace(_write_task(self.plan, iterator, batch_id=int(batch),
                                                   query_id=ctx.getLocalProperty(_QUERY_ID_PROPERTY), stage=None),
                                       query_run=_query_run(ctx))
        if self.plan.opts.log_phases:
            log_phase("write", self.plan.opts.topic, batch=int(batch), task=done.index, attempt=done.attempt,
                      ms=round((time.monotonic() - began) * 1000, 1), rows=done.rows, skipped=done.skipped)
        return done

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        began = time.monotonic()
        self._commit(messages, batchId)
        if self.plan.opts.log_phases:
            log_phase("commit", self.plan.opts.topic, batch=batchId, ms=round((time.monotonic() - began) * 1000, 1),
                      init_ms=self.init_ms, tasks=len(messages),
                      skipped=sum(1 for m in messages if isinstance(m, TaskCommit) and m.skipped))

    def _commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        opts = self.plan.opts
        # stageProgress eventTime: no offset log, so no stage watermark and no end by itself (end_stream);
        # stageProgress driver: the driver program writes both (controlmsg.spark.stage), this commit neither.
        stage = None if self.offset_log is None else stage_progress(self.offset_log, batchId, opts.topic)
        if stage is not None and self.offset_log is not None:  # Spark's watermark follows with_watermark's rows
            check_offset_log_follows(self.offset_log, batchId, stage, opts.topic)
        by_driver = opts.stage_progress == STAGE_PROGRESS_DRIVER
        if by_driver and self.ended:
            return  # the driver program's stage round ended the run; this micro-batch wrote nothing (its tasks said)
        # Ended input: a stateless stage ends with it; a stateful one once Spark's watermark is the end of time,
        # i.e. after the micro-batch that emitted its last windows (a plain input never gets there: end_stream).
        # Spark's watermark is 0 in a query's first micro-batch even when it has one: 0 says nothing for a
        # stateful query, which may emit its windows in the next micro-batch.
        ending = (stage is not None and stage.inputs_ended
                  and (stage.watermark == END_OF_TIME_MS or not stage.stateful))
        if not messages and not ending:
            return
        commits = _task_commits(opts, messages) if messages else []
        query = commits[0].query_id if commits else None
        run = commits[0].query_run if commits else None
        top = _max_time(commits) if commits else None

        def plan(committed: dict[str, Any] | None) -> Round | None:
            """Decided after fencing, from what the last driver committed: its watermark is the floor."""
            previous: int | None = None
            if committed is not None:
                if committed.get("ended"):
                    return None  # nothing after the end (a later micro-batch of the query that ended it)
                if int(committed.get("batch", -1)) >= batchId and (not commits or committed.get("queryId") == query):
                    return None  # a replayed micro-batch: its round is in
                if not commits and committed.get("ended"):
                    return None
                if commits:
                    _check_same_stream(opts, committed, query)
                previous = committed.get("watermark")
            name, generation, switch = upstream_of(opts, committed)
            slots = int((committed or {}).get("taskSlots", (committed or {}).get("writeTasks", 0)) or 0)
            if commits and len(commits) < slots and (committed or {}).get("queryRun") != run:
                # The first micro-batch of a new start of the query, with fewer write tasks than the query had
                # (restarted with fewer after a kill -9, say): a task that will not run again under its id may
                # have left a transaction open, which would hold every read_committed reader of its partitions
                # back until the transaction's timeout. Fence those ids now.
                fence_transactions(dict(opts.config), [transactional_id(opts.topic, task_name(opts.job, opts.run_id, i))
                                                       for i in range(len(commits), slots)], opts.timeout)
                slots = len(commits)
            skipped = [c.index for c in commits if c.skipped]
            if skipped and (committed or {}).get("queryRun") != run:
                # The first micro-batch of a start of the query may replay one that an earlier start ran: its
                # tasks that skipped Kafka (no rows) did not fence what a killed attempt of theirs left open.
                fence_transactions(dict(opts.config), [transactional_id(opts.topic, task_name(opts.job, opts.run_id, i))
                                                       for i in skipped], opts.timeout)
            tops = [t for t in (top, (committed or {}).get("maxEventTime")) if t is not None]
            status = {"upstream": _DRIVER, "taskCount": 1, "generation": generation, "batch": batchId,
                      "writeTasks": len(commits), "taskSlots": max(slots, len(commits)), "watermark": previous,
                      "queryId": query or (committed or {}).get("queryId"),
                      "queryRun": run or (committed or {}).get("queryRun"),
                      "maxEventTime": max(tops) if tops else None}
            if by_driver:
                return [], status  # the marker alone: the driver program's rounds take its maxEventTime
            if ending:
                return [EndOfStreamMessage(name, 1, opts.run_id, generation=generation)], {**status, "ended": True}
            mark = previous
            if stage is not None and stage.watermark > 0:
                candidate: int | None = min(stage.watermark, MAX_TIMESTAMP - 1)
            elif top is not None:
                candidate = WatermarkPolicy(opts.allowed_lateness_ms).watermark_for(top)
            else:
                candidate = None
            if candidate is not None:
                mark = candidate if previous is None else max(previous, candidate)
            # A new generation's first round is written even at the same watermark: it replaces the old tasks.
            marks = ([] if mark is None or (mark == previous and not switch) else
                     [WatermarkMessage(name, 1, mark, opts.run_id, generation=generation)])
            return marks, {**status, "watermark": mark}

        write_control_round(dict(opts.config), opts.topic, self.plan.partitions, plan,
                            transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                            timeout=opts.timeout)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


def _check_same_stream(opts: WriteOptions, marker: Mapping[str, Any], query: str | None) -> None:
    where = f"topic {opts.topic!r} run {opts.run_id!r}"
    if marker.get("ended"):
        raise ControlMsgError(f"{where} has already ended; a new stream needs a new runId")
    if marker.get("queryId") != query:
        raise ControlMsgError(f"{where} is written by streaming query {marker.get('queryId')}, not by this query "
                              f"{query}; a new query (a new checkpointLocation) needs a new runId")


def end_stream(options: Mapping[str, str]) -> int:
    """End the run that a ``writeStream.format("controlmsg")`` query wrote: its driver's end of stream, to
    every partition, in one transaction. ``options``: the options given to the query (at least ``topic``,
    ``runId``, ``kafka.bootstrap.servers``; ``job`` if set). Call it after the query stopped
    (``awaitTermination()`` of an ``availableNow`` query). Idempotent: a run already ended is left as it
    is. Returns the run's upstream task count (``taskCount``: 1, the driver; a run ended by an earlier
    version of this writer says how many tasks it had). Raises :class:`~controlmsg.errors.ControlMsgError`
    when nothing of the run was committed yet (options that name no run: a typo is not ended silently)."""
    from controlmsg.kafka.admin import wait_for_topic

    opts = WriteOptions.parse(options)
    if (run_status(opts) or {}).get("endedBy") == "stage":
        return 1  # ended by the driver program's stage round (stageProgress driver)
    config = dict(opts.config)
    partitions = wait_for_topic(config, opts.topic, opts.timeout)
    counted: list[int] = []

    def plan(committed: dict[str, Any] | None) -> Round | None:
        if committed is None:
            raise ControlMsgError(f"topic {opts.topic!r}: no micro-batch of run {opts.run_id!r} (job {opts.job!r}) "
                                  "was committed, so there is no stream to end")
        if committed.get("ended"):
            counted.append(int(committed["taskCount"]))
            return None
        name, generation, _ = upstream_of(opts, committed)
        counted.append(1)
        return ([EndOfStreamMessage(name, 1, opts.run_id, generation=generation)],
                {**committed, "upstream": _DRIVER, "taskCount": 1, "generation": generation, "ended": True})

    write_control_round(config, opts.topic, partitions, plan,
                        transactional_id=driver_transactional_id(opts.topic, opts.job, opts.run_id),
                        timeout=opts.timeout)
    return counted[0]


def run_status(options: WriteOptions | Mapping[str, str]) -> dict[str, Any] | None:
    """What the driver of a ``controlmsg`` write has committed for its run: ``None`` before the first
    commit, else ``{"upstream": "driver", "taskCount": 1, "generation", "ended", "writeTasks", ...}``
    (``taskCount`` the run's upstream tasks on the wire, the driver alone; ``writeTasks`` the Spark tasks
    that wrote records: of the write, or of the last micro-batch; a batch write adds ``rows`` and
    ``maxEventTime``; a stream the last ``batch``, its ``watermark``, ``queryId`` and ``maxEventTime``). With
    ``stageProgress driver`` in ``options``, a run that the driver program's stage round ended
    (:mod:`controlmsg.spark.stage`) says ``"ended": true, "endedBy": "stage"``."""
    opts = options if isinstance(options, WriteOptions) else WriteOptions.parse(options)
    group = driver_transactional_id(opts.topic, opts.job, opts.run_id)
    with MarkerStore(dict(opts.config), group, opts.topic, opts.timeout) as store:
        marker = store.load()
    if marker is not None and not marker.get("ended") and opts.stage_progress == STAGE_PROGRESS_DRIVER:
        # The stage rounds of a driver program (controlmsg.spark.stage) may have ended the run.
        with MarkerStore(dict(opts.config), stage_transactional_id(opts.topic, opts.job, opts.run_id), opts.topic,
                         opts.timeout) as store:
            stage = store.load()
        if stage is not None and stage.get("ended"):
            marker = {**marker, "ended": True, "endedBy": "stage"}
    return marker


# ---------------------------------------------------------------------------------------------- tasks


def _rows_ahead(batches: Iterator[pa.RecordBatch]) -> tuple[Iterator[pa.RecordBatch], bool]:
    """``batches`` as they were, and whether none has a row (then all are consumed)."""
    for batch in batches:
        if batch.num_rows:
            return itertools.chain([batch], batches), False
    return iter(()), True


def _query_run(ctx: Any) -> str | None:
    for name in _QUERY_RUN_PROPERTIES:
        value = ctx.getLocalProperty(name)
        if value:
            return str(value)
    return None


def _write_task(plan: _Plan, batches: Iterator[pa.RecordBatch], *, batch_id: int, query_id: str | None,
                stage: Callable[[str, ControlWriter], None] | None) -> TaskCommit:
    """The body of one write task (runs in a Spark Python worker)."""
    from pyspark import TaskContext

    worker_logging()
    # The driver planned this task from the cluster's answers: a refused connection here is a broker that
    # restarts, left to the retries; a refusal of the client itself fails at once (controlmsg.kafka.refusals).
    mark_reached(dict(plan.opts.config))

    started = time.monotonic()
    ctx = TaskContext.get()
    assert ctx is not None
    index, attempt = ctx.partitionId(), ctx.attemptNumber()
    opts = plan.opts
    name = task_name(opts.job, opts.run_id, index)
    txn_id = transactional_id(opts.topic, name)
    config = dict(opts.config)
    writer = ControlWriter(
        {"transaction.timeout.ms": opts.transaction_timeout_ms, **config, "transactional.id": txn_id},
        opts.topic, task_name=name, task_count=None, run_id=opts.run_id, partitions=plan.partitions,
        data_headers=opts.data_headers, topic_timeout=opts.timeout,
    )
    # init_transactions (in the writer) has fenced earlier attempts and finished their transactions, so the
    # marker now tells for sure whether one of them committed.
    with MarkerStore(config, txn_id, opts.topic, opts.timeout) as store:
        earlier = store.load()
        if earlier is not None and earlier.get("queryId") != query_id:
            writer.close(opts.timeout)
            raise ControlMsgError(
                f"topic {opts.topic!r}: task {name!r} was written by streaming query {earlier.get('queryId')}, "
                f"not by this one ({query_id}); a new query (a new checkpointLocation) needs a new runId")
        if earlier is not None and not earlier.get("partial") and int(earlier.get("batch", 0)) >= batch_id:
            writer.close(opts.timeout)  # nothing was sent: ends the empty transaction
            run_later(writer.destroy)
            for _ in batches:  # the input must still be consumed
                pass
            return TaskCommit(index, attempt, int(earlier["rows"]), earlier.get("maxEventTime"), True, query_id,
                              time.monotonic() - started)
        chunked: tuple[Chunks, Callable[[], bool]] | None = None  # option commitRows: controlmsg.spark.chunks
        resume = earlier if earlier is not None and earlier.get("partial") else None
        if (opts.commit_rows is not None and query_id is None) or resume is not None:
            # A partial marker is resumed even when this write has no commitRows (a rerun of the same runId).
            chunks = Chunks(opts.commit_rows or sys.maxsize, resume, name, opts.topic)
            partial = {"batch": batch_id, "attempt": attempt, "queryId": query_id}
            chunked = chunks, lambda: chunks.commit_if_due(writer, store, partial, opts.timeout)
        with writer:  # an exception inside aborts the transaction
            rows, max_t = _write_rows(writer, batches, plan, chunked)
            store.add(writer, {"batch": batch_id, "rows": rows, "maxEventTime": max_t, "attempt": attempt,
                               "queryId": query_id}, rows)
            if stage is not None:
                stage("before_commit", writer)
        # Leaving the block committed the transaction: the records and the marker together.
        if stage is not None:
            stage("after_commit", writer)
    # Nothing waits for the producer's end (tens of ms of librdkafka's threads ending): off the task's path.
    run_later(writer.destroy)
    return TaskCommit(index, attempt, rows, max_t, False, query_id, time.monotonic() - started)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return orjson.Fragment(str(value))
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot write a value of type {type(value).__name__} as JSON")


def _utc(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Zoned timestamp columns in UTC (the instant is the same), so the JSON says ``Z``."""
    import pyarrow as pa

    columns = []
    changed = False
    for column in batch.columns:
        dtype = column.type
        if pa.types.is_timestamp(dtype) and dtype.tz is not None and dtype.tz != "UTC":
            column = column.cast(pa.timestamp(dtype.unit, tz="UTC"))
            changed = True
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names) if changed else batch


def _event_ms(column: pa.Array) -> int | None:
    """The largest event time of ``column`` in epoch ms (``None`` if all null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    dtype = column.type
    if pa.types.is_timestamp(dtype):
        column = column.cast(pa.timestamp(dtype.unit, tz=dtype.tz)).cast(pa.int64())
        top = pc.max(column).as_py()
        if top is None:
            return None
        per_ms = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[dtype.unit]
        return int(top // per_ms) if per_ms >= 1 else int(top * 1000)
    if pa.types.is_date(dtype):
        top = pc.max(column.cast(pa.date32()).cast(pa.int32())).as_py()
        return None if top is None else int(top) * 86_400_000
    top = pc.max(column).as_py()
    return None if top is None else int(top)


def _payloads(column: pa.Array, plan: _Plan, task: str, rows_before: int) -> list[bytes]:
    """The ``value`` column of a batch as envelopes, its bytes untouched. A null fails the task (its
    transaction is aborted: nothing of it is readable), naming the topic, task, column and row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        row = rows_before + int(pc.index(column.is_null(), True).as_py())
        raise ControlMsgError(
            f"write to topic {plan.opts.topic!r}, task {task!r}: column {plan.opts.value!r} (option 'value') is "
            f"null in row {row} of the task; a record's payload cannot be null: filter such rows out or give "
            "them a value (nothing of this task was committed)")
    return encode_user_rows(column.cast(pa.binary()).to_pylist())


def _record_headers(column: pa.Array, plan: _Plan, task: str,
                    rows_before: int) -> list[list[tuple[str, bytes | None]] | None]:
    """The ``headers`` column of a batch as each record's headers. A header named like controlmsg's own
    (:data:`~controlmsg.kafka.writer.RESERVED_HEADER_PREFIX`), or without a name, fails the task: the
    run and task headers say whose a record is, and a reader trusts them."""
    out: list[list[tuple[str, bytes | None]] | None] = []
    for i, row in enumerate(column.to_pylist()):
        if not row:
            out.append(None)
            continue
        headers: list[tuple[str, bytes | None]] = []
        for header in row:
            name, value = (header or {}).get("key"), (header or {}).get("value")
            if name is None or name.startswith(RESERVED_HEADER_PREFIX):
                raise ControlMsgError(
                    f"write to topic {plan.opts.topic!r}, task {task!r}: row {rows_before + i} of the task has a "
                    "header "
                    + ("without a key" if name is None else f"named {name!r}, and names starting "
                       f"{RESERVED_HEADER_PREFIX!r} are controlmsg's own (the run, the task): rename it")
                    + " (nothing of this task was committed)")
            headers.append((name, value.encode() if isinstance(value, str) else value))
        out.append(headers)
    return out


def _write_rows(writer: ControlWriter, batches: Iterator[pa.RecordBatch], plan: _Plan,
                chunks: tuple[Chunks, Callable[[], bool]] | None = None) -> tuple[int, int | None]:
    """Send every row as a record, its payload the ``value`` column's bytes or else the row as JSON; return
    the number of rows and the largest event time. One
    :meth:`~controlmsg.kafka.writer.ControlWriter.send_encoded` per Arrow batch: its values encoded in one
    loop (a batch of strings, numbers and booleans only: column by column in Arrow, the same JSON,
    :mod:`controlmsg.spark.arrow_json`), its keys taken from the key column as one list. ``chunks`` (option
    ``commitRows``): the task's :class:`~controlmsg.spark.chunks.Chunks`, which skips what an earlier attempt
    committed, and the call that commits when a chunk is due, after each batch."""
    import pyarrow as pa

    send = writer.send_encoded
    rows = 0
    max_t: int | None = None
    progress = Progress(f"writer {writer.topic} task {writer.task_name}")
    for batch in batches:
        if progress.due():
            progress.log(f"{rows} rows written")
        if batch.num_rows == 0:
            continue
        if plan.value_index is not None:
            values = _payloads(batch.column(plan.value_index), plan, writer.task_name, rows)
        else:
            body = batch if plan.headers_index is None else batch.drop_columns([_HEADERS])
            flat = flat_json_envelopes(body, _USER_ENVELOPE)
            # A column of another type: the row as a dict, through orjson.
            values = flat if flat is not None else encode_json_rows(_utc(body).to_pylist(), _json_default,
                                                                    _JSON_OPTIONS)
        headers = (None if plan.headers_index is None else
                   _record_headers(batch.column(plan.headers_index), plan, writer.task_name, rows))
        keys: list[Any] | None = None
        if plan.key_index is not None:
            column = batch.column(plan.key_index)
            keys = (column if pa.types.is_string(column.type) else column.cast(pa.string())).to_pylist()
        if chunks is None:
            send(values, keys, headers)
        else:
            left = len(values)
            values, keys = chunks[0].skip(values, keys)
            if values:
                send(values, keys, None if headers is None else headers[left - len(values):])
                chunks[0].sent(values, keys)
                chunks[1]()
        if plan.event_time_index is not None:
            top = _event_ms(batch.column(plan.event_time_index))
            if top is not None and (max_t is None or top > max_t):
                max_t = top
        rows += batch.num_rows
    if chunks is not None:
        chunks[0].finish_skipping()
    return rows, max_t
