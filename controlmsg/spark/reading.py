"""Reading an intermediate topic into Spark: the batch reader and the stream reader of ``controlmsg``.

**Batch** (``spark.read``): each Spark task owns a group of the topic's partitions and reads them with a
:class:`~controlmsg.kafka.reader.ControlReader` (``read_committed``) until end of stream holds for every
one of them, so the DataFrame is complete exactly when every upstream task of the run has ended on every
partition; records after a partition's end are not read. Planning waits for the topic (never creating
it); with ``timeout`` a task fails with :class:`EndOfStreamTimeout` naming each partition not ended and
the upstream tasks it still waits for. Every reading task holds a core while it waits and costs a few
tenths of a second of a core however little it reads (a Python task, a consumer), so by default the
partitions are grouped by the offsets they hold at planning: one task per 200,000, at least 8 (or one per
partition when there are fewer); ``partitionsPerTask`` and ``maxTasks`` group them as the user says (the
jobs of ``spark_jobs`` set ``maxTasks`` to Spark's default parallelism, so that every task can run at once).
A consumer starts at an explicit offset, not at the logical beginning (see
:func:`~controlmsg.kafka.reader.start_offset`).

**Streaming** (``spark.readStream``): the driver plans each micro-batch by scanning the topic from the
last offsets to what is readable now, feeding the bookkeeping; the offsets Spark writes to its offset
log are ``{"offsets": {partition: next offset}, "bookkeeping": <InputTracker snapshot>}``, so a query
restarted from its ``checkpointLocation`` resumes with the same bookkeeping: no record twice or lost, no
watermark that goes back. Executors then read exactly the planned offset ranges. The scan reads every
record once more on the driver (only the first byte of a user record is looked at); that is the price of
carrying the bookkeeping in Spark's own checkpoint. Under ``trigger(availableNow=True)`` "the data
available" means the run up to its **end of stream**: the query delivers micro-batches as the upstream
commits, waits while it is still writing, and terminates once every upstream task has ended on every
partition.

**Schema.** Without a schema the columns are ``partition int, offset long, key string, value string``.
With ``.schema(ddl)`` the JSON value is parsed and each field is taken from the JSON object's member of
that name (missing: null); ``_partition``, ``_offset`` and ``_key`` are the record's position and key
(``_key`` as string or binary); in a stream, ``_watermark`` (timestamp) is the reconciled watermark of
the topic in force when the record was read: the watermark at the start of the micro-batch, advanced by
the control messages read before the record on its own partition, and never above the watermark at the
micro-batch's end; null until every upstream task has reported on every partition;
``_partition_watermark`` (timestamp) is the watermark of the record's own partition there (the minimum over
the upstream tasks on that partition alone), which depends only on what the partition holds before the
record, so that every query over the topic finds the same records behind it. With a boolean
``_control`` too, a micro-batch in which the watermark moved or the stream ended also has one watermark
row (``_control`` true, every other field null; see :mod:`controlmsg.spark.event_time`). JSON types map
directly (an integer field takes JSON integers only: a fraction or ``true`` does not fit, where pyarrow
alone would truncate ``2.5`` to ``2``; a floating-point field takes any JSON number); timestamp and date
fields take ISO-8601 strings, decimals numbers or strings, binary fields base64 strings.

**Bad records** are user records that do not fit the DataFrame: a value that is not JSON or not a JSON
object, a field that does not fit its type, a field declared ``NOT NULL`` that is missing or null, a key
(``_key``/``key`` string) or raw value (``value`` string) that is not UTF-8. Option ``mode``, in the sense
of Spark's JSON and CSV sources:

* ``FAILFAST`` (default): the task fails with a :class:`~controlmsg.errors.ReadError` naming topic,
  partition and offset of the first bad record it reads, and the reason.
* ``PERMISSIVE``: every row is kept. A value that is not a JSON object gives null JSON fields (``_partition``,
  ``_offset`` and ``_key`` are filled as for any record); a field that
  does not fit is null (the others are kept); a key that is not UTF-8 is given with those bytes written
  ``\\xNN``. The schema must declare the corrupt-record column (``columnNameOfCorruptRecord``, default
  ``_corrupt_record``), null for good records; for a bad one it holds the value (the upstream serde's
  bytes): as they are in a ``binary`` column, as UTF-8 text with bytes that are not UTF-8 written
  ``\\xNN`` in a ``string`` column. Without that column PERMISSIVE is refused, since the bad content would
  be lost (Spark's own sources drop it silently), and so it is for the schema-less raw columns (read
  ``key``/``value`` as binary instead: then no record is bad).
* ``DROPMALFORMED``, or just the option ``deadLetterTopic``: the row is left out and the record written to
  the dead-letter topic unchanged (the whole envelope, key and headers) plus the headers of
  :mod:`controlmsg.kafka.deadletter` (reason, source topic, partition, offset): the format ``controlmsg
  consume --dead-letter-topic`` writes. The topic must exist: planning fails otherwise, before any task.
  A task has the broker acknowledge its dead letters before it hands Spark the batch they came out of, so
  no record counts as read that is not in one place or the other. A retried task or a replayed
  micro-batch writes its dead letters again: they are at least once (de-duplicate on the source topic,
  partition and offset headers).

Each reading task logs its first ten bad records (partition, offset, reason, where they went) and a count.
"""

from __future__ import annotations

import base64
import heapq
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from typing import Any, Final

import orjson
import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from controlmsg.core.bookkeeping import InputTracker, PartitionStatus
from controlmsg.core.codec import decode
from controlmsg.core.progress import expected_task_names, waiting_for
from controlmsg.errors import ControlMsgError, Location, ProtocolError, ReadError
from controlmsg.kafka.admin import offset_spans, wait_for_topic, watermark_offsets
from controlmsg.kafka.deadletter import DeadLetters, check_dead_letter_topic
from controlmsg.kafka.reader import ControlReader, DataColumns, DataRecord, same_run
from controlmsg.kafka.refusals import check_client, mark_reached
from controlmsg.kafka.retry import ConsumerErrors
from controlmsg.kafka.settings import for_client, worker_logging
from controlmsg.kafka.writer import HEADER_RUN
from controlmsg.spark.options import BadRecordMode, ReadOptions
from controlmsg.spark.progress import Progress
from controlmsg.spark.query_log import END_OF_TIME_MS

__all__ = [
    "RAW_SCHEMA",
    "BatchReader",
    "EndOfStreamTimeout",
    "StreamReader",
    "TopicPartitions",
]

RAW_SCHEMA: Final = "partition int, offset long, key string, value string"
_RAW_NAMES: Final = ("partition", "offset", "key", "value")
_META_PARTITION: Final = "_partition"
_META_OFFSET: Final = "_offset"
_META_KEY: Final = "_key"
_META_WATERMARK: Final = "_watermark"
_META_CONTROL: Final = "_control"
_META_PARTITION_WATERMARK: Final = "_partition_watermark"
_WATERMARK_FIELDS: Final = (_META_WATERMARK, _META_PARTITION_WATERMARK, _META_CONTROL)
# consume() waits for a whole batch or this: short polls keep a small stream moving, and a read of a few
# records ends when they are read, not a poll later (a batch read of 200 partitions, one task each, paid
# 0.1 s per task at 0.1). A full batch returns at once, so a large read is not slowed.
_POLL_S: Final = 0.02
_OFFSETS_FORMAT: Final = 1
_RECORDS_PER_TASK: Final = 200_000
"""Offsets a reading task takes by default (about half a second of reading here, against a fixed cost per
task of 0.2-0.4 s)."""
_MIN_TASKS: Final = 8
"""Reading tasks by default at least (or one per partition), whatever the size: a batch read planned
before its upstream wrote sees empty partitions, and its tasks should still share the work when it comes."""

Mark = tuple["int | None", "int | None"]
"""A record's ``_watermark`` and ``_partition_watermark`` in epoch ms (``None``: undefined)."""
Built = tuple[pa.RecordBatch, "list[tuple[DataRecord, str]]"]
"""A batch, and the bad records set aside while building it (with their reasons, in reading order)."""
Builder = Callable[[DataColumns, str, "list[Mark] | None"], Built]
"""Builds a batch from records (parallel lists, no object per record) and their watermark values."""


class EndOfStreamTimeout(ControlMsgError):
    """A reader's partitions did not all reach end of stream in time. The message names each partition
    still open and the upstream tasks it waits for; ``statuses`` holds the details."""

    def __init__(self, message: str, statuses: Sequence[PartitionStatus]) -> None:
        super().__init__(message)
        self.statuses = list(statuses)


class TopicPartitions(InputPartition):
    """One batch task's share of the topic: the partitions it reads to end of stream."""

    def __init__(self, partitions: Sequence[int]) -> None:
        super().__init__(tuple(partitions))
        self.partitions = tuple(partitions)


def _arrow_schema(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _builder(schema: StructType, opts: ReadOptions) -> tuple[Builder, bool]:
    """The batch builder for ``schema`` and whether it has a ``_watermark`` field. Raises ``ValueError``
    (at planning time) for a schema the bad-record options cannot work with."""
    arrow_schema = _arrow_schema(schema)
    names = schema.fieldNames()
    raw = tuple(names) == _RAW_NAMES
    corrupt = opts.corrupt_column if opts.corrupt_column in names else None
    binary = False
    if corrupt is not None:
        ctype = arrow_schema.field(corrupt).type
        if not (pa.types.is_string(ctype) or pa.types.is_large_string(ctype) or pa.types.is_binary(ctype)):
            raise ValueError(f"the corrupt-record column {corrupt!r} must be of type string or binary, not "
                             f"{schema[corrupt].dataType.simpleString()}")
        binary = pa.types.is_binary(ctype)
    if opts.mode is BadRecordMode.PERMISSIVE and (raw or corrupt is None):
        raise ValueError(
            "mode PERMISSIVE keeps a bad record's row and its value in the corrupt-record column, and nothing may "
            f"be lost: declare the column in the schema ('{opts.corrupt_column} string', or binary; see the option "
            "columnNameOfCorruptRecord)" + (" next to the JSON fields; without a schema, read key and value as "
                                            "binary and no record is bad" if raw else ""))
    if _META_CONTROL in names:
        if not pa.types.is_boolean(arrow_schema.field(_META_CONTROL).type):
            raise ValueError(f"the field '{_META_CONTROL}' marks the rows that carry only a watermark: declare it "
                             f"boolean, not {schema[_META_CONTROL].dataType.simpleString()}")
        if _META_WATERMARK not in names:
            raise ValueError(f"the field '{_META_CONTROL}' marks rows that carry only a '{_META_WATERMARK}': "
                             f"declare '{_META_WATERMARK} timestamp' too")
    policy = _Policy(opts.mode, corrupt, binary)
    if raw:
        return _raw_builder(arrow_schema, policy), False
    return _json_builder(arrow_schema, policy), any(name in names for name in _WATERMARK_FIELDS)


# ---------------------------------------------------------------------------------------------- batch


class BatchReader(DataSourceReader):
    """``spark.read.format("controlmsg")``: see the module docstring."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        for name in _WATERMARK_FIELDS:
            if name in schema.fieldNames():
                raise ValueError(f"the field '{name}' is filled by readStream only; a batch read ends at end of "
                                 "stream, where every window can close")
        _builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        """Runs at planning time: waits for the topic (up to ``timeout``), checks that the dead-letter
        topic exists (if any), then groups the partitions."""
        opts = self.opts
        count = wait_for_topic(dict(opts.config), opts.topic, opts.timeout)
        _check_dead_letters(opts)
        sizes = None
        if opts.partitions_per_task is None and opts.max_tasks is None:
            try:
                sizes = offset_spans(dict(opts.config), opts.topic, count, opts.timeout or 30.0)
            except ControlMsgError:
                sizes = None  # one task per partition, as with partitionsPerTask 1
        return [TopicPartitions(group) for group in _groups(range(count), opts, sizes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartitions)
        return _read_to_end(self.opts, self.schema, list(partition.partitions))


def _groups(partitions: Sequence[int], opts: ReadOptions, sizes: Mapping[int, int] | None = None) -> list[list[int]]:
    """The reading tasks' shares of ``partitions``. With ``partitionsPerTask`` or ``maxTasks`` given: runs of
    ``partitionsPerTask`` (default 1) partitions, more per task when there would be more tasks than
    ``maxTasks``. With neither, and the ``sizes`` (offsets per partition) known: one task per
    :data:`_RECORDS_PER_TASK` offsets, at least :data:`_MIN_TASKS` (or one per partition when there are
    fewer), the partitions spread so that each task has about as many offsets, largest first. So a read's
    task count, and its fixed cost per task (a Python task, a consumer, a metadata request: about 0.2-0.4 s
    of a core here), follows the data rather than the partition count."""
    parts = list(partitions)
    if opts.partitions_per_task is None and opts.max_tasks is None and sizes is not None and parts:
        total = sum(sizes.get(p, 0) for p in parts)
        n = min(len(parts), max(_MIN_TASKS, -(-total // _RECORDS_PER_TASK)))
        tasks: list[tuple[int, int, int]] = [(0, 0, i) for i in range(n)]  # (offsets, partitions, index)
        shares: list[list[int]] = [[] for _ in range(n)]
        for p in sorted(parts, key=lambda q: -sizes.get(q, 0)):
            offsets, count, i = heapq.heappop(tasks)
            shares[i].append(p)
            heapq.heappush(tasks, (offsets + sizes.get(p, 0), count + 1, i))
        return sorted(sorted(share) for share in shares)
    step = opts.partitions_per_task or 1
    if opts.max_tasks is not None:
        step = max(step, -(-len(parts) // opts.max_tasks))
    return [parts[i:i + step] for i in range(0, len(parts), step)]


def _read_to_end(opts: ReadOptions, schema: StructType, partitions: list[int]) -> Iterator[pa.RecordBatch]:
    """Read ``partitions`` to end of stream, yielding Arrow batches of ``schema`` (runs in a worker)."""
    worker_logging()
    mark_reached(dict(opts.config))  # the driver planned this task with the cluster's answers: see _read_range
    started = time.monotonic()
    deadline = None if opts.timeout is None else started + opts.timeout
    build, _ = _builder(schema, opts)
    reader = ControlReader(
        dict(opts.config),
        opts.topic,
        partitions=partitions,
        run_id=opts.run_id,
        stop_at_end=True,
        batch_size=max(opts.batch_rows, 1000),
        topic_timeout=opts.timeout if opts.timeout is not None else 30.0,
    )
    progress = Progress(f"reader {opts.topic} partitions {partitions}")
    aside = _SetAside(opts, progress)
    try:
        pending = DataColumns()
        tracker = reader.tracker
        records = 0
        while not tracker.is_ended:
            if progress.due():
                progress.log(f"{records} records, watermark {_mark(tracker.emitted_watermark)}, "
                             f"{len(tracker.ended_partitions)} of {len(partitions)} partitions ended")
            wait = _POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    raise _timeout_error(opts, tracker, partitions)
            before = len(pending)
            reader.poll_columns(pending, wait)  # the events are in the tracker
            records += len(pending) - before
            if len(pending) >= opts.batch_rows:
                batch = aside.take(build(pending, opts.topic, None))
                if batch is not None:
                    yield batch
                pending = DataColumns()
        if pending:
            batch = aside.take(build(pending, opts.topic, None))
            if batch is not None:
                yield batch
        aside.finish()
    finally:
        aside.close()
        reader.close()


def _mark(ts: int | None) -> str:
    return "undefined" if ts is None else str(ts)


# ---------------------------------------------------------------------------------------------- stream


class StreamRange(InputPartition):
    """One micro-batch task's share: partitions with their ``[start, end)`` offsets, the bookkeeping at
    the micro-batch's start and the watermark at its end (``None``: undefined); ``tick``, when not
    ``None``, is the ``_watermark`` of the one watermark row this task adds after its records."""

    def __init__(self, ranges: Sequence[tuple[int, int, int]], bookkeeping: dict[str, Any],
                 end_watermark: int | None, tick: int | None = None) -> None:
        super().__init__(tuple(ranges))
        self.ranges = tuple(ranges)
        self.bookkeeping = bookkeeping
        self.end_watermark = end_watermark
        self.tick = tick


@dataclass
class _Scan:
    """The driver's reading position: next offset per partition and the bookkeeping there; ``settle``:
    the micro-batch that ended here moved the watermark, and the next one is to read nothing (below)."""

    positions: dict[int, int]
    tracker: InputTracker
    settle: bool = False

    def offset(self) -> dict[str, Any]:
        out = {"format": _OFFSETS_FORMAT,
               "offsets": {str(p): o for p, o in sorted(self.positions.items())},
               "bookkeeping": self.tracker.snapshot()}
        if self.settle:
            out["settle"] = True
        return out


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("controlmsg")``: see the module docstring. Runs on the driver."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.opts = options
        self.schema = schema
        _builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self._ticks = _META_CONTROL in schema.fieldNames()
        self._available_now = False
        self._started = time.monotonic()
        self._consumer: Consumer | None = None
        self._consumer_settings: dict[str, Any] = {}
        self._scan: _Scan | None = None  # where the consumer stands, when it is in step with a scan
        self._at_end: set[int] = set()  # partitions the consumer has read to their end (no record since)
        self._errors = ConsumerErrors()
        self._partitions: list[int] | None = None

    # ---------------------------------------------------------------- Spark's calls

    def initialOffset(self) -> dict[str, Any]:
        """Each partition's log start offset now, as a number: a task (or the scan) assigned the logical
        beginning would wait about half a second for librdkafka to look it up (see
        :func:`~controlmsg.kafka.reader.start_offset`; the stream's consumers fail on an offset out of
        range, so they cannot be given 0)."""
        parts = self._topic_partitions()
        tracker = InputTracker(parts, self.opts.run_id, self.opts.topic)
        consumer = self._open_consumer()
        starts = {p: watermark_offsets(consumer, self.opts.topic, p, self.opts.timeout or 30.0)[0] for p in parts}
        return _Scan(starts, tracker).offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        scan = self._resume(start)
        if scan.settle:
            # The last micro-batch moved Spark's watermark (its watermark row). Spark applies a watermark in
            # the micro-batch after the one that moved it; under availableNow the next call below may wait
            # for the upstream, or end the query, first. So one micro-batch that reads nothing comes now.
            scan.settle = False
            return self._planned(start, scan.offset())
        if scan.tracker.is_ended:
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        before = (scan.tracker.emitted_watermark, scan.tracker.is_ended)
        while True:
            moved = self._advance(scan, max_rows)
            if moved or not self._available_now or scan.tracker.is_ended:
                break
            # AvailableNow ends the query when no offset moves; a controlmsg run is available up to its
            # end of stream, so wait for the upstream instead (or fail after `timeout`).
            self._check_deadline(scan)
        if not moved:
            return start
        scan.settle = (self._ticks and self._available_now
                       and before != (scan.tracker.emitted_watermark, scan.tracker.is_ended))
        return self._planned(start, scan.offset())

    def _planned(self, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
        """``end`` with the micro-batch's reading tasks (``groups``: partitions per task) planned now and
        logged with it in Spark's offset log: a micro-batch replayed after a restart with other options
        (``maxTasks``, ``partitionsPerTask``) runs the same tasks, which the writer's exactly-once relies
        on (a write task's id is its index; docs/SPARK.md)."""
        end["groups"] = _stream_groups(_positions(start), _positions(end), self.opts)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _positions(start), _positions(end)
        logged = end.get("groups")
        groups = ([[int(p) for p in g] for g in logged] if isinstance(logged, list)  # planned in latestOffset
                  else _stream_groups(begin, stop, self.opts))  # an offset logged before groups were
        end_wm = end["bookkeeping"].get("emittedWatermark")
        ranges = [StreamRange([(p, begin.get(p, OFFSET_BEGINNING), stop[p]) for p in group], start["bookkeeping"],
                              end_wm)
                  for group in groups]
        if self._ticks and ranges:
            ranges[0].tick = _tick(start["bookkeeping"], end["bookkeeping"])
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        return _read_range(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the position lives in Spark's offset log; Kafka holds nothing of ours

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ---------------------------------------------------------------- the driver's scan

    def _topic_partitions(self) -> list[int]:
        if self._partitions is None:
            count = wait_for_topic(dict(self.opts.config), self.opts.topic, self.opts.timeout)
            _check_dead_letters(self.opts)
            self._partitions = list(range(count))
        return self._partitions

    def _resume(self, start: dict[str, Any]) -> _Scan:
        """The scan state at ``start``: the one in memory when the consumer stands there, else restored
        from the offset (after a restart, or a replanned batch) and the consumer moved there."""
        if self._scan is not None and self._scan.offset() == {k: v for k, v in start.items() if k != "groups"}:
            return self._scan
        if start.get("format") != _OFFSETS_FORMAT:
            raise ControlMsgError(f"topic {self.opts.topic!r}: the streaming checkpoint's offset is not a "
                                  f"controlmsg offset of format {_OFFSETS_FORMAT}: {str(start)[:200]}")
        positions = _positions(start)
        if sorted(positions) != self._topic_partitions():
            raise ControlMsgError(
                f"topic {self.opts.topic!r} has partitions {self._topic_partitions()}, the query's checkpoint "
                f"has {sorted(positions)}: adding partitions to a topic in the middle of a run is not supported")
        tracker = InputTracker.restore(start["bookkeeping"], self.opts.run_id)
        tracker.topic = self.opts.topic
        scan = _Scan(positions, tracker, bool(start.get("settle")))
        self._seek(scan)
        self._scan = scan
        return scan

    def _seek(self, scan: _Scan) -> None:
        consumer = self._open_consumer()
        consumer.assign([TopicPartition(self.opts.topic, p, o) for p, o in scan.positions.items()])
        self._at_end = set(scan.tracker.ended_partitions)

    def _open_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer_settings = _consumer_conf(self.opts, eof=True)
            self._consumer = Consumer(self._consumer_settings)
        return self._consumer

    def _advance(self, scan: _Scan, max_rows: int | None) -> bool:
        """Read from the scan's position to what is readable now (every partition at its end), at most
        ``max_rows`` user records, at most ``maxScanMs``; feed control messages to the bookkeeping.
        Returns whether any position moved."""
        consumer = self._open_consumer()
        topic = self.opts.topic
        tracker = scan.tracker
        positions = scan.positions
        at_end = self._at_end
        errors = self._errors
        before = dict(positions)
        rows = 0
        deadline = time.monotonic() + self.opts.max_scan_ms / 1000.0
        limited = False
        first = True  # one consume at least: partitions at their end last time may have more now
        while (first or len(at_end) < len(positions)) and time.monotonic() < deadline:
            first = False
            try:
                msgs: list[Any] = consumer.consume(1000, _POLL_S)
            except KafkaException as exc:
                raise ReadError(f"reading topic {topic!r} failed: {exc.args[0]}") from exc
            if not msgs:
                check_client(self._consumer_settings)  # a cluster that refuses the consumer
            for i, msg in enumerate(msgs):
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(p)
                        continue
                    if errors.passes(err, p):
                        continue
                    raise ReadError(f"reading topic {topic!r} partition {p} failed: {err.str()}")
                if p in tracker.ended_partitions:
                    continue  # after a partition's end: not part of the run
                at_end.discard(p)
                off = msg.offset()
                value = msg.value()
                if value and value[0] == 0:
                    if max_rows is not None and rows >= max_rows:
                        limited = True
                        break
                    rows += 1
                else:
                    try:
                        decoded = decode(value)
                        assert not isinstance(decoded, bytes)
                        tracker.on_control(p, decoded, off)
                    except ProtocolError as exc:
                        self._scan = None
                        raise exc.at(Location(topic, p, off)) from None
                    if p in tracker.ended_partitions:
                        at_end.add(p)
                    if tracker.is_ended:
                        positions[p] = off + 1
                        limited = i + 1 < len(msgs)
                        at_end.update(positions)
                        break
                positions[p] = off + 1
            if limited:
                break
        if limited:
            self._seek(scan)  # the consumer read ahead of the positions
        return positions != before

    def _check_deadline(self, scan: _Scan) -> None:
        timeout = self.opts.timeout
        if timeout is not None and time.monotonic() - self._started > timeout:
            raise _timeout_error(self.opts, scan.tracker, sorted(scan.positions))


def _stream_groups(begin: Mapping[int, int], stop: Mapping[int, int], opts: ReadOptions) -> list[list[int]]:
    """The reading tasks of a micro-batch from ``begin`` to ``stop``: the partitions that moved, grouped."""
    moved = [p for p in sorted(stop) if stop[p] != begin.get(p, OFFSET_BEGINNING)]
    return _groups(moved, opts, {p: max(stop[p] - max(begin.get(p, 0), 0), 0) for p in moved})


def _positions(offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset["offsets"].items()}


def _consumer_conf(opts: ReadOptions, *, eof: bool) -> dict[str, Any]:
    return for_client({
        "group.id": f"controlmsg-stream-{opts.topic}",  # never joins nor commits: assign() only
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",
        # A planned offset that is gone (retention) is data loss: fail, naming it, rather than skip.
        "auto.offset.reset": "error",
        "enable.partition.eof": eof,
        **dict(opts.config),
    }, "consumer")


def _read_range(opts: ReadOptions, schema: StructType, part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Read the planned ``[start, end)`` offsets of some partitions (runs in a worker). The driver has read
    them already, so every offset up to ``end - 1`` that ``read_committed`` delivers is there."""
    worker_logging()
    # The driver planned this task from the cluster's answers: a refused connection here is a broker that
    # restarts (a task started while it is down), left to the retries; only a refusal of the client itself
    # (authentication, TLS) fails at once (controlmsg.kafka.refusals).
    mark_reached(dict(opts.config))
    build, with_watermark = _builder(schema, opts)
    topic = opts.topic
    run = (HEADER_RUN, opts.run_id.encode())
    end = {p: stop for p, _, stop in part.ranges}
    open_parts = {p for p, start, stop in part.ranges if start != stop}
    trackers: dict[int, InputTracker] = {}
    marks: dict[int, Mark] = {}
    if with_watermark:
        for p in open_parts:
            trackers[p] = InputTracker.restore(part.bookkeeping, opts.run_id)
            trackers[p].topic = topic
            marks[p] = _marks(trackers[p], p, part.end_watermark)
    conf = _consumer_conf(opts, eof=False)
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(topic, p, start) for p, start, stop in part.ranges if start != stop])
    wait_s = opts.timeout if opts.timeout is not None else 120.0
    last_record = time.monotonic()
    pending = DataColumns()
    pending_marks: list[Mark] | None = [] if with_watermark else None
    aside = _SetAside(opts, Progress(f"reader {topic} partitions {sorted(end)}"))
    try:
        while open_parts:
            try:
                msgs: list[Any] = consumer.consume(max(opts.batch_rows, 1000), _POLL_S)
            except KafkaException as exc:
                raise ReadError(f"reading topic {topic!r} failed: {exc.args[0]}") from exc
            if not msgs:
                check_client(conf)  # a cluster that refuses the consumer (controlmsg.kafka.refusals)
            if not msgs and time.monotonic() - last_record > wait_s:
                raise ReadError(
                    f"topic {topic!r}: partitions {sorted(open_parts)} gave no record for {wait_s:g} s before "
                    f"the planned offsets {({p: end[p] for p in open_parts})}")
            for msg in msgs:
                p = msg.partition()
                err = msg.error()
                if err is not None:
                    raise ReadError(f"reading topic {topic!r} partition {p} failed: {err.str()}")
                if p not in open_parts:
                    continue
                last_record = time.monotonic()
                off = msg.offset()
                if off >= end[p]:
                    open_parts.discard(p)
                    continue
                if off == end[p] - 1:
                    open_parts.discard(p)
                value = msg.value()
                if value and value[0] == 0:
                    # same_run(), with its usual answer (no headers, or the run header first) decided inline.
                    if (headers := msg.headers()) and headers[0] != run and not same_run(headers, run):
                        continue
                    pending.partitions.append(p)
                    pending.offsets.append(off)
                    pending.keys.append(msg.key())
                    pending.payloads.append(value[1:])
                    pending.messages.append(msg)
                    if pending_marks is not None:
                        pending_marks.append(marks[p])
                elif with_watermark:
                    decoded = decode(value)
                    assert not isinstance(decoded, bytes)
                    trackers[p].on_control(p, decoded, off)
                    marks[p] = _marks(trackers[p], p, part.end_watermark)
            if len(pending) >= opts.batch_rows:
                batch = aside.take(build(pending, topic, pending_marks))
                if batch is not None:
                    yield batch
                pending = DataColumns()
                pending_marks = [] if with_watermark else None
        if pending:
            batch = aside.take(build(pending, topic, pending_marks))
            if batch is not None:
                yield batch
        aside.finish()
        if part.tick is not None:
            yield _tick_batch(schema, part.tick)
    finally:
        aside.close()
        consumer.close()


def _tick(start: dict[str, Any], end: dict[str, Any]) -> int | None:
    """The watermark row's ``_watermark`` for a micro-batch from bookkeeping snapshot ``start`` to ``end``:
    :data:`END_OF_TIME_MS` when the stream ended in it, the end's watermark when it moved, else ``None``
    (no row)."""
    if end.get("streamEnded"):
        return None if start.get("streamEnded") else END_OF_TIME_MS
    wm = end.get("emittedWatermark")
    return wm if wm is not None and wm != start.get("emittedWatermark") else None


def _tick_batch(schema: StructType, watermark: int) -> pa.RecordBatch:
    """One watermark row: ``_control`` true, ``_watermark`` set, every other field null."""
    arrow_schema = _arrow_schema(schema)
    arrays = []
    for field in arrow_schema:
        if field.name == _META_CONTROL:
            arrays.append(pa.array([True]))
        elif field.name == _META_WATERMARK:
            arrays.append(pa.array([watermark], pa.int64()).cast(pa.timestamp("ms", tz="UTC")).cast(field.type))
        else:
            arrays.append(pa.nulls(1, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _marks(tracker: InputTracker, partition: int, cap: int | None) -> Mark:
    """A record's marks on ``partition`` now: the reconciled watermark in force (``_watermark``: the
    tracker's, capped at the micro-batch's end) and the partition's own watermark (``_partition_watermark``:
    the minimum over the upstream tasks on this partition alone; the end of time once all ended there).
    The second depends only on what the partition holds before the record, not on where micro-batches
    begin, so every query that reads the topic finds the same records behind it."""
    own = tracker.status(partition).watermark
    return _capped(tracker.emitted_watermark, cap), None if own is None else min(own, END_OF_TIME_MS)


def _capped(mark: int | None, cap: int | None) -> int | None:
    if mark is None or cap is None:
        return None
    return min(mark, cap)


# ---------------------------------------------------------------------------------------------- timeouts


def _timeout_error(opts: ReadOptions, tracker: InputTracker, partitions: list[int]) -> EndOfStreamTimeout:
    statuses = [s for s in tracker.statuses() if not s.is_ended]
    expected = expected_task_names(tracker)
    lines = [f"partition {s.partition}: {waiting_for(s, expected)}" for s in statuses]
    message = (
        f"topic {opts.topic!r} run {opts.run_id!r}: end of stream not reached within {opts.timeout:g} s on "
        f"partitions {[s.partition for s in statuses]} (this reader reads {partitions}); " + "; ".join(lines)
    )
    return EndOfStreamTimeout(message, statuses)


# ---------------------------------------------------------------------------------------------- bad records


_LOGGED_BAD: Final = 10


def _check_dead_letters(opts: ReadOptions) -> None:
    if opts.dead_letter_topic is not None:
        check_dead_letter_topic(dict(opts.config), opts.dead_letter_topic, opts.timeout or 10.0)


class _SetAside:
    """What one reading task does with the bad records its batches set aside: logs the first
    :data:`_LOGGED_BAD` (topic, partition, offset, reason) and counts the rest; under DROPMALFORMED writes
    each to the dead-letter topic, and has the broker acknowledge them before the batch they were taken
    out of goes to Spark, so no record counts as handled that was not."""

    def __init__(self, opts: ReadOptions, progress: Progress) -> None:
        self.opts = opts
        self.progress = progress
        self.count = 0
        self._letters: DeadLetters | None = None

    def take(self, built: Built) -> pa.RecordBatch | None:
        """The batch of ``built`` once its bad records are handled (``None`` if it has no row left).
        Blocks until the dead-letter topic acknowledged them; raises DeliveryError when it did not."""
        batch, aside = built
        if aside:
            topic = self.opts.topic
            dead_letters = self.opts.dead_letter_topic
            for record, reason in aside:
                self.count += 1
                if self.count <= _LOGGED_BAD:
                    where = (f"written to dead-letter topic {dead_letters!r}" if dead_letters is not None
                             else f"kept in column {self.opts.corrupt_column!r}")
                    self.progress.log(f"bad record at partition {record.partition} offset {record.offset}: "
                                      f"{reason}; {where}")
                if dead_letters is not None:
                    if self._letters is None:
                        self._letters = DeadLetters(dict(self.opts.config), dead_letters)
                    msg = record.message
                    value = msg.value() if msg is not None else bytes([0]) + record.payload
                    self._letters.send(value, record.key, msg.headers() if msg is not None else None, reason,
                                       Location(topic, record.partition, record.offset))
            if self._letters is not None:
                self._letters.flush(topic)
        return batch if batch.num_rows else None

    def finish(self) -> None:
        """At the end of a task that read everything: one line with the count, if any was bad."""
        if self.count > _LOGGED_BAD:
            self.progress.log(f"{self.count} bad records in all ({self.count - _LOGGED_BAD} not logged one by one)")

    def close(self) -> None:
        if self._letters is not None:
            self._letters.close()


# ---------------------------------------------------------------------------------------------- batches

_FIT_ERRORS: Final = (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, ArithmeticError)
_HINT: Final = ("; to read past such records, set the option deadLetterTopic (they go there) or mode PERMISSIVE "
                "(their rows are kept)")


@dataclass(frozen=True, slots=True)
class _Policy:
    """How a builder treats bad records: ``mode``, and the corrupt-record column when the schema has it."""

    mode: BadRecordMode
    corrupt: str | None
    corrupt_binary: bool


Columns = Callable[[DataColumns, str, "list[Mark] | None", dict[int, str]], "list[pa.Array | None]"]
"""Builds a batch's columns from its records (and ``_watermark`` values), entering each bad record's index
and reason in the dict; ``None`` stands for the corrupt-record column, which the builder fills."""


def _settling(schema: pa.Schema, policy: _Policy, columns: Columns) -> Builder:
    """A builder that applies ``policy`` to what ``columns`` found bad.

    FAILFAST raises :class:`ReadError` for the first bad record of the batch (in reading order), naming
    topic, partition, offset and reason. DROPMALFORMED builds the batch from the good records only.
    PERMISSIVE keeps every row (``columns`` has nulled what could not be read) and puts the value of each
    bad record in the corrupt-record column. The records set aside (all but FAILFAST) are returned with
    their reasons, in reading order."""

    def build(records: DataColumns, topic: str, marks: list[Mark] | None) -> Built:
        bad: dict[int, str] = {}
        arrays = columns(records, topic, marks, bad)
        if bad:
            first = min(bad)
            if policy.mode is BadRecordMode.FAILFAST:
                raise ReadError(f"topic {topic!r} partition {records.partitions[first]} offset "
                                f"{records.offsets[first]}: {bad[first]}{_HINT}")
            aside = [(records.record(i), bad[i]) for i in sorted(bad)]
            if policy.mode is BadRecordMode.DROPMALFORMED:
                keep = [i for i in range(len(records)) if i not in bad]
                batch, again = build(records.select(keep), topic,
                                     None if marks is None else [marks[i] for i in keep])
                if again:  # a record good on its own but not with the others: no way to tell which to drop
                    raise ReadError(f"topic {topic!r} partitions {_parts(records)}: cannot make a batch of the "
                                    f"records that fit the schema: {again[0][1]}")
                return batch, aside
        else:
            aside = []
        if policy.corrupt is not None:  # the schema has the column: null but for the bad records' values
            ctype = schema.field(policy.corrupt).type
            payloads = records.payloads
            corrupt = (pa.array([_raw_value(payloads[i], policy.corrupt_binary) if i in bad else None
                                 for i in range(len(records))], pa.binary() if policy.corrupt_binary else pa.string())
                       .cast(ctype) if bad else pa.nulls(len(records), ctype))
            arrays = [corrupt if a is None else a for a in arrays]
        return pa.RecordBatch.from_arrays(arrays, schema=schema), aside

    return build


def _raw_value(payload: bytes, binary: bool) -> bytes | str:
    """A bad record's value for the corrupt-record column: the user serde's bytes as they are (binary
    column), or as UTF-8 text with every byte that is not UTF-8 written ``\\xNN`` (string column)."""
    return payload if binary else payload.decode("utf-8", "backslashreplace")


def _all_utf8(chunks: list[bytes | None]) -> bool:
    """Whether every chunk (``None`` skipped) is UTF-8 text, as Python's strict decoder judges it, in one
    decode: pieces joined by an ASCII byte form valid UTF-8 exactly when every piece does."""
    try:
        b"\n".join(filter(None, chunks)).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _keys_as_text(records: DataColumns, bad: dict[int, str], escape: bool) -> pa.Array | list[str | None]:
    """Keys as UTF-8 text: an Arrow string array when every key is UTF-8 (the usual case, without a Python
    object per key); otherwise a list in which a key that is not UTF-8 is entered as bad, and given with
    its bytes escaped (``\\xNN``) when ``escape``, else as null."""
    keys = records.keys
    if _all_utf8(keys):
        return pa.array(keys, pa.binary()).cast(pa.string())
    out: list[str | None] = []
    for i, key in enumerate(keys):
        if key is None:
            out.append(None)
            continue
        try:
            out.append(key.decode("utf-8"))
        except UnicodeDecodeError:
            bad.setdefault(i, "the key is not UTF-8 text; declare the key field as binary to read it as bytes")
            out.append(key.decode("utf-8", "backslashreplace") if escape else None)
    return out


def _raw_builder(schema: pa.Schema, policy: _Policy) -> Builder:
    key_type = schema.field("key").type
    value_type = schema.field("value").type

    def columns(records: DataColumns, _topic: str, _marks: list[Mark] | None,
                bad: dict[int, str]) -> list[pa.Array | None]:
        if pa.types.is_binary(key_type):
            keys = pa.array(records.keys, pa.binary())
        else:
            texts = _keys_as_text(records, bad, escape=False)
            keys = (texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())).cast(key_type)
        values = pa.array(records.payloads, pa.binary())
        if not pa.types.is_binary(value_type):
            try:
                values = values.cast(value_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                decoded: list[str | None] = []
                for i, payload in enumerate(records.payloads):
                    try:
                        decoded.append(payload.decode("utf-8"))
                    except UnicodeDecodeError:
                        bad.setdefault(i, "the value is not UTF-8 text; declare the value field as binary to "
                                          "read it as bytes")
                        decoded.append(None)
                values = pa.array(decoded, pa.string()).cast(value_type)
        return [
            pa.array(records.partitions, schema.field("partition").type),
            pa.array(records.offsets, schema.field("offset").type),
            keys,
            values,
        ]

    return _settling(schema, policy, columns)


def _json_builder(schema: pa.Schema, policy: _Policy) -> Builder:
    loads = orjson.loads
    escape_keys = policy.mode is BadRecordMode.PERMISSIVE
    get = dict.get

    def columns(records: DataColumns, topic: str, marks: list[Mark] | None,
                bad: dict[int, str]) -> list[pa.Array | None]:
        payloads = records.payloads
        try:
            objects = list(map(loads, payloads))
        except orjson.JSONDecodeError:
            objects = [_loads_or_none(payload) for payload in payloads]
            for i, obj in enumerate(objects):
                if obj is _NOT_JSON:
                    bad[i] = "the value is not JSON"
        if objects and set(map(type, objects)) != {dict}:
            for i, obj in enumerate(objects):
                if type(obj) is not dict:
                    if i not in bad:
                        bad[i] = f"the value is a JSON {type(obj).__name__}, not an object"
                    objects[i] = _NO_FIELDS
        arrays: list[pa.Array | None] = []
        for field in schema:
            name = field.name
            if name == policy.corrupt:
                arrays.append(None)
                continue
            if name == _META_PARTITION:
                values: list[Any] = records.partitions
            elif name == _META_OFFSET:
                values = records.offsets
            elif name == _META_KEY:
                if pa.types.is_binary(field.type):
                    arrays.append(pa.array(records.keys, field.type))
                    continue
                texts = _keys_as_text(records, bad, escape_keys)
                if isinstance(texts, pa.Array):
                    if pa.types.is_string(field.type):
                        arrays.append(texts)
                        continue
                    texts = texts.to_pylist()
                values = texts
            elif name in (_META_WATERMARK, _META_PARTITION_WATERMARK) and marks is not None:
                which = 0 if name == _META_WATERMARK else 1
                arrays.append(pa.array([m[which] for m in marks], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
                              .cast(field.type))
                continue
            elif name == _META_CONTROL:
                arrays.append(pa.repeat(False, len(records)))
                continue
            else:
                values = list(map(get, objects, repeat(name)))
                if not field.nullable and None in values:
                    for i in (i for i, value in enumerate(values) if value is None):
                        bad.setdefault(i, f"field {name!r} is missing or null, and the schema says NOT NULL")
            arrays.append(_column(values, field, records, topic, bad))
        return arrays

    return _settling(schema, policy, columns)


_NOT_JSON: Final = object()
_NO_FIELDS: Final[dict[str, Any]] = {}


def _loads_or_none(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _column(values: list[Any], field: pa.Field, records: DataColumns, topic: str,
            bad: dict[int, str]) -> pa.Array:
    """``values`` as an Arrow array of ``field``'s type. When some do not fit, each of them is entered in
    ``bad`` with the reason and made null. Raises :class:`ReadError` when the column does not fit while
    every value fits on its own."""
    try:
        return _to_arrow(values, field.type)
    except _FIT_ERRORS as exc:
        misfits = []
        for i, value in enumerate(values):
            if value is None:
                continue
            try:
                _to_arrow([value], field.type)
            except _FIT_ERRORS as one:
                misfits.append(i)
                bad.setdefault(i, f"field {field.name!r} does not fit type {field.type}: {one}")
        if not misfits:
            raise ReadError(f"topic {topic!r} partitions {_parts(records)}: field {field.name!r} does not fit type "
                            f"{field.type}: {exc}") from exc
        values = list(values)  # may be the records' own column (_partition, _offset)
        for i in misfits:
            values[i] = None
        return _to_arrow(values, field.type)


_NONE: Final = type(None)
_INTEGERS: Final = frozenset({int, _NONE})
_NUMBERS: Final = frozenset({int, float, _NONE})
_JSON_KINDS: Final = {float: "a number with a fraction or an exponent", bool: "true or false", str: "a string",
                      list: "an array", dict: "an object"}


def _check_numbers(values: list[Any], dtype: pa.DataType) -> None:
    """Raise ``TypeError`` when a value of an integer or floating-point field is not a JSON number of
    that kind. pyarrow would take them: a fraction into an integer type truncated (2.5 as 2), true as 1."""
    integer = pa.types.is_integer(dtype)
    kinds = set(map(type, values)) - (_INTEGERS if integer else _NUMBERS)
    if kinds:
        wrong = sorted(_JSON_KINDS.get(kind, kind.__name__) for kind in kinds)
        raise TypeError(f"a value is {' or '.join(wrong)}, not {'an integer' if integer else 'a number'}")


def _to_arrow(values: list[Any], dtype: pa.DataType) -> pa.Array:
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        _check_numbers(values, dtype)
        return pa.array(values, dtype)
    if pa.types.is_timestamp(dtype) or pa.types.is_date(dtype) or pa.types.is_time(dtype):
        return pa.array(values, pa.string()).cast(dtype)
    if pa.types.is_decimal(dtype):
        return pa.array([None if v is None else Decimal(v if isinstance(v, str) else repr(v)) for v in values], dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return pa.array([None if v is None else base64.b64decode(v, validate=True) for v in values], dtype)
    return pa.array(values, dtype)


def _parts(records: DataColumns) -> list[int]:
    return sorted(set(records.partitions))
