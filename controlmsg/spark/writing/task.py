"""A task of a ``controlmsg`` write (:mod:`controlmsg.spark.writing`), in a Spark Python worker: its rows sent
as records in one transaction with its marker (or chunk by chunk, :mod:`controlmsg.spark.writing.chunks`), an
attempt that an earlier one already committed skipped, and what it reports to the driver
(:class:`TaskCommit`), which the driver's commit reads back (:func:`task_commits`)."""

from __future__ import annotations

import base64
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import orjson
from pyspark.sql.datasource import WriterCommitMessage

from controlmsg.core.codec import encode_json_rows, encode_user_rows
from controlmsg.core.naming import task_name, transactional_id
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.background import run_later
from controlmsg.kafka.markers import MarkerStore
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.refusals import mark_reached
from controlmsg.kafka.settings import worker_logging
from controlmsg.kafka.writer import RESERVED_HEADER_PREFIX, ControlWriter
from controlmsg.spark.options import WriteOptions
from controlmsg.spark.writing.arrow_json import flat_json_envelopes
from controlmsg.spark.writing.chunks import Chunks
from controlmsg.spark.writing.plan import HEADERS_COLUMN, WritePlan

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow (and pyarrow.compute, the slowest of all to import) is imported in the task functions that use it,
# not here: the driver's short-lived Python workers that unpickle the writer to call commit() need neither.

__all__ = ["TaskCommit", "max_time", "query_run_of", "rows_ahead", "task_commits", "write_task"]

_QUERY_RUN_PROPERTIES: Final = ("sql.streaming.runId", "spark.jobGroup.id")
"""Where a task finds its streaming query's run id: Spark's run-id property, else the job group, which a
streaming query sets to its run id."""
_JSON_OPTIONS: Final = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC | orjson.OPT_NON_STR_KEYS


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


def task_commits(opts: WriteOptions, messages: Sequence[WriterCommitMessage | None]) -> list[TaskCommit]:
    """The driver's side: the tasks' reports in task order, one for every task of the write."""
    commits = sorted((m for m in messages if isinstance(m, TaskCommit)), key=lambda c: c.index)
    if [c.index for c in commits] != list(range(len(messages))):
        raise ControlMsgError(f"write to topic {opts.topic!r}: expected reports of tasks 0..{len(messages) - 1}, "
                              f"got {[c.index for c in commits]}")
    return commits


def max_time(commits: Sequence[TaskCommit]) -> int | None:
    """The largest event time the tasks wrote (``None``: none had one)."""
    times = [c.max_event_time for c in commits if c.max_event_time is not None]
    return max(times) if times else None


# ---------------------------------------------------------------------------------------------- tasks


def rows_ahead(batches: Iterator[pa.RecordBatch]) -> tuple[Iterator[pa.RecordBatch], bool]:
    """``batches`` as they were, and whether none has a row (then all are consumed)."""
    for batch in batches:
        if batch.num_rows:
            return itertools.chain([batch], batches), False
    return iter(()), True


def query_run_of(ctx: Any) -> str | None:
    """The streaming query's run id, from a task's ``TaskContext``."""
    for name in _QUERY_RUN_PROPERTIES:
        value = ctx.getLocalProperty(name)
        if value:
            return str(value)
    return None


def write_task(plan: WritePlan, batches: Iterator[pa.RecordBatch], *, batch_id: int, query_id: str | None,
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
        data_headers=opts.data_headers, run_in_envelope=opts.run_in_envelope, topic_timeout=opts.timeout,
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
        chunked: tuple[Chunks, Callable[[], bool]] | None = None  # option commitRows: controlmsg.spark.writing.chunks
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


def _payloads(column: pa.Array, plan: WritePlan, task: str, rows_before: int, prefix: bytes) -> list[bytes]:
    """The ``value`` column of a batch as envelopes (``prefix``: their first bytes), its bytes untouched. A
    null fails the task (its transaction is aborted: nothing of it is readable), naming the topic, task,
    column and row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        row = rows_before + int(pc.index(column.is_null(), True).as_py())
        raise ControlMsgError(
            f"write to topic {plan.opts.topic!r}, task {task!r}: column {plan.opts.value!r} (option 'value') is "
            f"null in row {row} of the task; a record's payload cannot be null: filter such rows out or give "
            "them a value (nothing of this task was committed)")
    return encode_user_rows(column.cast(pa.binary()).to_pylist(), prefix)


def _record_headers(column: pa.Array, plan: WritePlan, task: str,
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


def _write_rows(writer: ControlWriter, batches: Iterator[pa.RecordBatch], plan: WritePlan,
                chunks: tuple[Chunks, Callable[[], bool]] | None = None) -> tuple[int, int | None]:
    """Send every row as a record, its payload the ``value`` column's bytes or else the row as JSON; return
    the number of rows and the largest event time. One
    :meth:`~controlmsg.kafka.writer.ControlWriter.send_encoded` per Arrow batch: its values encoded in one
    loop (a batch of strings, numbers and booleans only: column by column in Arrow, the same JSON,
    :mod:`controlmsg.spark.writing.arrow_json`), its keys taken from the key column as one list. ``chunks`` (option
    ``commitRows``): the task's :class:`~controlmsg.spark.writing.chunks.Chunks`, which skips what an earlier attempt
    committed, and the call that commits when a chunk is due, after each batch."""
    import pyarrow as pa

    send, prefix = writer.send_encoded, writer.user_prefix
    rows = 0
    max_t: int | None = None
    progress = Progress(f"writer {writer.topic} task {writer.task_name}")
    for batch in batches:
        if progress.due():
            progress.log(f"{rows} rows written")
        if batch.num_rows == 0:
            continue
        if plan.value_index is not None:
            values = _payloads(batch.column(plan.value_index), plan, writer.task_name, rows, prefix)
        else:
            body = batch if plan.headers_index is None else batch.drop_columns([HEADERS_COLUMN])
            flat = flat_json_envelopes(body, prefix)
            # A column of another type: the row as a dict, through orjson.
            values = flat if flat is not None else encode_json_rows(_utc(body).to_pylist(), _json_default,
                                                                    _JSON_OPTIONS, prefix)
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
