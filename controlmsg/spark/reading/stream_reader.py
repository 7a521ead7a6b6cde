"""Reading an intermediate topic into Spark: the batch reader and the stream reader of ``controlmsg``.

**Batch** (``spark.read``): each Spark task owns a group of the topic's partitions and reads them with a
:class:`~controlmsg.kafka.reader.ControlReader` (``read_committed``) until end of stream holds for every
one of them, so the DataFrame is complete exactly when every upstream task of the run has ended on every
partition; records after a partition's end are not read. Planning waits for the topic (never creating
it); with ``timeout`` a task fails with :class:`EndOfStreamTimeout` naming each partition not ended and
the upstream tasks it still waits for. The partitions are grouped into tasks by the offsets they hold at
planning, or as ``partitionsPerTask`` and ``maxTasks`` say (:mod:`controlmsg.spark.planning`).
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

The columns a record becomes (``.schema(ddl)``, ``_partition``, ``_offset``, ``_key``, ``_watermark``,
``_partition_watermark``, ``_control``) are :mod:`controlmsg.spark.batches`; what becomes of the records
that do not fit (option ``mode``, ``deadLetterTopic``) is :mod:`controlmsg.spark.bad_records`; how the
partitions are grouped into tasks is :mod:`controlmsg.spark.planning`; a micro-batch's task reads its
planned offsets with the loop of :mod:`controlmsg.spark.consuming`, whose hook here is
:class:`_EnvelopeRecords`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from controlmsg.core.bookkeeping import InputTracker, PartitionStatus
from controlmsg.core.codec import decode
from controlmsg.core.progress import expected_task_names, waiting_for
from controlmsg.errors import ControlMsgError, Location, ProtocolError, ReadError
from controlmsg.kafka.admin import LatestOffsets, offset_spans, wait_for_topic, watermark_offsets
from controlmsg.kafka.periodic_log import Progress
from controlmsg.kafka.reader import ControlReader, DataColumns, same_run
from controlmsg.kafka.refusals import check_client, mark_reached
from controlmsg.kafka.retry import ConsumerErrors
from controlmsg.kafka.settings import worker_logging
from controlmsg.kafka.writer import HEADER_RUN
from controlmsg.spark.bad_records import SetAside, check_dead_letters
from controlmsg.spark.batches import META_CONTROL, WATERMARK_FIELDS, Mark, batch_builder, tick_batch
from controlmsg.spark.consuming import POLL_S, consumer_conf, read_ranges
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.phases import log_phase, task_batch_id
from controlmsg.spark.planning import StreamRange, TopicPartitions, stream_groups, task_groups
from controlmsg.spark.query_log import END_OF_TIME_MS, WATERMARK_ROWS_KEY
from controlmsg.spark.source_progress import REPORT_TIMEOUT_S, lag_report, upstream_metrics

__all__ = [
    "BatchReader",
    "EndOfStreamTimeout",
    "StreamReader",
]

_OFFSETS_FORMAT: Final = 1
_PLANNED_KEYS: Final = ("groups", WATERMARK_ROWS_KEY)  # in an offset from latestOffset, not in the scan's


class EndOfStreamTimeout(ControlMsgError):
    """A reader's partitions did not all reach end of stream in time. The message names each partition
    still open and the upstream tasks it waits for; ``statuses`` holds the details."""

    def __init__(self, message: str, statuses: Sequence[PartitionStatus]) -> None:
        super().__init__(message)
        self.statuses = list(statuses)


# ---------------------------------------------------------------------------------------------- batch


class BatchReader(DataSourceReader):
    """``spark.read.format("controlmsg")``: see the module docstring."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        for name in WATERMARK_FIELDS:
            if name in schema.fieldNames():
                raise ValueError(f"the field '{name}' is filled by readStream only; a batch read ends at end of "
                                 "stream, where every window can close")
        batch_builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        """Runs at planning time: waits for the topic (up to ``timeout``), checks that the dead-letter
        topic exists (if any), then groups the partitions."""
        opts = self.opts
        count = wait_for_topic(dict(opts.config), opts.topic, opts.timeout)
        check_dead_letters(opts)
        sizes = None
        if opts.partitions_per_task is None and opts.max_tasks is None:
            try:
                sizes = offset_spans(dict(opts.config), opts.topic, count, opts.timeout or 30.0)
            except ControlMsgError:
                sizes = None  # one task per partition, as with partitionsPerTask 1
        return [TopicPartitions(group) for group in task_groups(range(count), opts, sizes)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartitions)
        return _read_to_end(self.opts, self.schema, list(partition.partitions))


def _read_to_end(opts: ReadOptions, schema: StructType, partitions: list[int]) -> Iterator[pa.RecordBatch]:
    """Read ``partitions`` to end of stream, yielding Arrow batches of ``schema`` (runs in a worker)."""
    worker_logging()
    mark_reached(dict(opts.config))  # planned with the cluster's answers: see consuming.read_ranges
    started = time.monotonic()
    deadline = None if opts.timeout is None else started + opts.timeout
    build, _ = batch_builder(schema, opts)
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
    aside = SetAside(opts, progress)
    try:
        pending = DataColumns()
        tracker = reader.tracker
        records = 0
        while not tracker.is_ended:
            if progress.due():
                progress.log(f"{records} records, watermark {_mark(tracker.emitted_watermark)}, "
                             f"{len(tracker.ended_partitions)} of {len(partitions)} partitions ended")
            wait = POLL_S
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
        batch_builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self._ticks = META_CONTROL in schema.fieldNames()
        self._available_now = False
        self._started = time.monotonic()
        self._consumer: Consumer | None = None
        self._consumer_settings: dict[str, Any] = {}
        self._scan: _Scan | None = None  # where the consumer stands, when it is in step with a scan
        self._at_end: set[int] = set()  # partitions the consumer has read to their end (no record since)
        self._eof: dict[int, int] = {}  # where the consumer found each partition's end, last time it did
        self._latest: LatestOffsets | None = None
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
        began = time.monotonic()
        scan = self._resume(start)
        if scan.settle:
            # The last micro-batch moved Spark's watermark (its watermark row). Spark applies a watermark in
            # the micro-batch after the one that moved it; under availableNow the next call below may wait
            # for the upstream, or end the query, first. So one micro-batch that reads nothing comes now.
            scan.settle = False
            self._log_scan(began, 0, "settle", moved=False, settle=True)
            return self._planned(start, scan.offset())
        if scan.tracker.is_ended:
            return start
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        before = (scan.tracker.emitted_watermark, scan.tracker.is_ended)
        records = 0
        while True:
            moved, read, why = self._advance(scan, max_rows)
            records += read
            if moved or not self._available_now or scan.tracker.is_ended:
                break
            # AvailableNow ends the query when no offset moves; a controlmsg run is available up to its
            # end of stream, so wait for the upstream instead (or fail after `timeout`).
            self._check_deadline(scan)
        changed = before != (scan.tracker.emitted_watermark, scan.tracker.is_ended)
        self._log_scan(began, records, why, moved=changed, settle=False)
        if not moved:
            return start
        scan.settle = self._ticks and self._available_now and changed
        return self._planned(start, scan.offset())

    def _log_scan(self, began: float, records: int, stop: str, *, moved: bool, settle: bool) -> None:
        if self.opts.log_phases:
            log_phase("scan", self.opts.topic, ms=round((time.monotonic() - began) * 1000, 1), records=records,
                      stop=stop, moved=moved, settle=settle)

    def _planned(self, start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
        """``end`` with the micro-batch's reading tasks (``groups``: partitions per task) planned now and
        logged with it in Spark's offset log: a micro-batch replayed after a restart with other options
        (``maxTasks``, ``partitionsPerTask``) runs the same tasks, which the writer's exactly-once relies
        on (a write task's id is its index; docs/SPARK.md)."""
        end["groups"] = stream_groups(_positions(start), _positions(end), self.opts)
        if self._ticks:  # the stream gives watermark rows: the writer checks Spark's watermark follows them
            end[WATERMARK_ROWS_KEY] = True
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = _positions(start), _positions(end)
        logged = end.get("groups")
        groups = ([[int(p) for p in g] for g in logged] if isinstance(logged, list)  # planned in latestOffset
                  else stream_groups(begin, stop, self.opts))  # an offset logged before groups were
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

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Spark calls this right after :meth:`latestOffset` and shows the answer in the progress's
        ``latestOffset`` (:mod:`controlmsg.spark.source_progress`): the partitions' end offsets now, the
        lag of the micro-batch just planned behind them, and the upstream tasks as the bookkeeping sees
        them at its end. A partition read to its end counts from where the consumer found that end (a
        transaction's commit marker follows the last record); one whose end of stream was read lags by 0.
        End offsets that cannot be had are reported as such, without failing the query."""
        scan = self._scan
        if scan is None:
            return None
        if self._latest is None:
            self._latest = LatestOffsets(dict(self.opts.config), self.opts.topic)
        ask = self._latest
        consumed = {p: max(o, self._eof.get(p, o)) if p in self._at_end else o for p, o in scan.positions.items()}
        return lag_report(self.opts.topic, lambda parts: ask(parts, REPORT_TIMEOUT_S), consumed,
                          caught_up=scan.tracker.ended_partitions, metrics=upstream_metrics(scan.tracker))

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
            check_dead_letters(self.opts)
            self._partitions = list(range(count))
        return self._partitions

    def _resume(self, start: dict[str, Any]) -> _Scan:
        """The scan state at ``start``: the one in memory when the consumer stands there, else restored
        from the offset (after a restart, or a replanned batch) and the consumer moved there."""
        if self._scan is not None and self._scan.offset() == {k: v for k, v in start.items() if k not in _PLANNED_KEYS}:
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
            self._consumer_settings = consumer_conf(self.opts, eof=True)
            self._consumer = Consumer(self._consumer_settings)
        return self._consumer

    def _advance(self, scan: _Scan, max_rows: int | None) -> tuple[bool, int, str]:
        """Read from the scan's position to what was readable when this call began (each partition up to
        its end offset then, as the consumer last heard it, or to its end), at most ``max_rows`` user
        records, at most ``maxScanMs``; feed control messages to the bookkeeping. Returns whether any
        position moved, the records read, and why it stopped (``end``, ``limit``, ``maxScanMs``).

        Not to the end of every partition at once: behind an upstream that keeps writing that end is rarely
        there, and every scan ran for the whole ``maxScanMs`` (a window waited for it). Nor only to the first
        poll that moves the watermark: behind a backlog, with a round every few hundred records, that makes
        micro-batches of a poll each, and the query falls behind."""
        consumer = self._open_consumer()
        topic = self.opts.topic
        tracker = scan.tracker
        positions = scan.positions
        at_end = self._at_end
        errors = self._errors
        before = dict(positions)
        # What was readable when the scan began: each partition's end offset as the consumer last heard it
        # (the last stable offset under read_committed; unknown before its first fetch: then its end event).
        targets: dict[int, int] = {}
        for p in positions:
            if p not in at_end:
                high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                if high is not None and high[1] >= 0:
                    targets[p] = high[1]
        rows = 0
        read = 0
        deadline = time.monotonic() + self.opts.max_scan_ms / 1000.0
        limited = False
        why = "end"
        first = True  # one consume at least: partitions at their end last time may have more now
        while first or any(p not in at_end and positions[p] < targets.get(p, END_OF_TIME_MS) for p in positions):
            if not first and time.monotonic() >= deadline:
                why = "maxScanMs"
                break
            first = False
            try:
                msgs: list[Any] = consumer.consume(1000, POLL_S)
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
                        self._eof[p] = msg.offset()
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
            read += len(msgs)
            if limited:
                why = "limit"
                break
        if limited:
            self._seek(scan)  # the consumer read ahead of the positions
        return positions != before, read, why

    def _check_deadline(self, scan: _Scan) -> None:
        timeout = self.opts.timeout
        if timeout is not None and time.monotonic() - self._started > timeout:
            raise _timeout_error(self.opts, scan.tracker, sorted(scan.positions))


def _positions(offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset["offsets"].items()}


def _read_range(opts: ReadOptions, schema: StructType, part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Read the planned ``[start, end)`` offsets of some partitions (runs in a worker), then the
    micro-batch's watermark row if this task has it. The driver has read them already, so every offset up
    to ``end - 1`` that ``read_committed`` delivers is there: no end-of-partition events needed."""
    began = time.monotonic()
    build, with_watermark = batch_builder(schema, opts)
    rows = 0
    for batch in read_ranges(opts, build, part.ranges, _EnvelopeRecords(opts, part, with_watermark), eof=False):
        rows += batch.num_rows
        yield batch
    if part.tick is not None:
        yield tick_batch(schema, part.tick)
    if opts.log_phases:
        log_phase("read", opts.topic, batch=task_batch_id(), ms=round((time.monotonic() - began) * 1000, 1),
                  rows=rows, partitions=len(part.ranges))


class _EnvelopeRecords:
    """The envelope reader's :class:`~controlmsg.spark.consuming.RangeRecords`: the user records of the
    run become rows (the payload without its type byte); with a watermark field in the schema, each row
    gets the :data:`~controlmsg.spark.batches.Mark` of its partition, which the control messages before it
    on that partition moved (one bookkeeping per partition, restored from the micro-batch's start, since a
    record's marks depend on its own partition's messages only)."""

    def __init__(self, opts: ReadOptions, part: StreamRange, with_watermark: bool) -> None:
        self._run = (HEADER_RUN, opts.run_id.encode())
        self._end_watermark = part.end_watermark
        self._trackers: dict[int, InputTracker] = {}
        self._marks: dict[int, Mark] = {}
        self._with_watermark = with_watermark
        if with_watermark:
            for p, start, stop in part.ranges:
                if start != stop:
                    tracker = self._trackers[p] = InputTracker.restore(part.bookkeeping, opts.run_id)
                    tracker.topic = opts.topic
                    self._marks[p] = _marks(tracker, p, part.end_watermark)
        self._rows = DataColumns()
        self._row_marks: list[Mark] | None = [] if with_watermark else None

    def take(self, messages: list[Any]) -> int:
        rows = self._rows
        row_marks = self._row_marks
        marks = self._marks
        run = self._run
        for msg in messages:
            value = msg.value()
            if value and value[0] == 0:
                # same_run(), with its usual answer (no headers, or the run header first) decided inline.
                if (headers := msg.headers()) and headers[0] != run and not same_run(headers, run):
                    continue
                p = msg.partition()
                rows.partitions.append(p)
                rows.offsets.append(msg.offset())
                rows.keys.append(msg.key())
                rows.payloads.append(value[1:])
                rows.messages.append(msg)
                if row_marks is not None:
                    row_marks.append(marks[p])
            elif self._with_watermark:
                p = msg.partition()
                decoded = decode(value)
                assert not isinstance(decoded, bytes)
                self._trackers[p].on_control(p, decoded, msg.offset())
                marks[p] = _marks(self._trackers[p], p, self._end_watermark)
        return len(rows)

    def drain(self) -> tuple[DataColumns, list[Mark] | None]:
        rows, self._rows = self._rows, DataColumns()
        row_marks = self._row_marks
        if row_marks is not None:
            self._row_marks = []
        return rows, row_marks


def _tick(start: dict[str, Any], end: dict[str, Any]) -> int | None:
    """The watermark row's ``_watermark`` for a micro-batch from bookkeeping snapshot ``start`` to ``end``:
    :data:`END_OF_TIME_MS` when the stream ended in it, the end's watermark when it moved, else ``None``
    (no row)."""
    if end.get("streamEnded"):
        return None if start.get("streamEnded") else END_OF_TIME_MS
    wm = end.get("emittedWatermark")
    return wm if wm is not None and wm != start.get("emittedWatermark") else None


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


