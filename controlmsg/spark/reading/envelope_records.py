"""What a micro-batch's task of an intermediate topic's stream makes of the records it reads (in a Spark
Python worker): the planned ``[start, end)`` offsets read with the loop of
:mod:`controlmsg.spark.reading.consuming`, whose hook here is :class:`EnvelopeRecords` (the run's user records
as rows, with their watermark marks), then the micro-batch's watermark row if this task has it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.codec import decode
from controlmsg.errors import DecodeError, Location
from controlmsg.kafka.data_records import DataColumns, own_run_tag, same_run, tagged_payload, whole_batch
from controlmsg.kafka.writer import HEADER_RUN
from controlmsg.spark.batches import batch_builder, tick_batch
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.phases import log_phase, task_batch_id
from controlmsg.spark.query_log import END_OF_TIME_MS
from controlmsg.spark.read_schema import Mark
from controlmsg.spark.reading.consuming import read_ranges
from controlmsg.spark.reading.planning import StreamRange

__all__ = ["EnvelopeRecords", "read_range"]


def read_range(opts: ReadOptions, schema: StructType, part: StreamRange) -> Iterator[pa.RecordBatch]:
    """Read the planned ``[start, end)`` offsets of some partitions (runs in a worker), then the
    micro-batch's watermark row if this task has it. The driver has read them already, so every offset up
    to ``end - 1`` that ``read_committed`` delivers is there: no end-of-partition events needed."""
    began = time.monotonic()
    build, with_watermark = batch_builder(schema, opts)
    rows = 0
    for batch in read_ranges(opts, build, part.ranges, EnvelopeRecords(opts, part, with_watermark), eof=False):
        rows += batch.num_rows
        yield batch
    if part.tick is not None:
        yield tick_batch(schema, part.tick)
    if opts.log_phases:
        log_phase("read", opts.topic, batch=task_batch_id(), ms=round((time.monotonic() - began) * 1000, 1),
                  rows=rows, partitions=len(part.ranges))


class EnvelopeRecords:
    """The envelope reader's :class:`~controlmsg.spark.reading.consuming.RangeRecords`: the user records of the
    run become rows (the payload without its type byte, or without its run tag in wire format 2); with a
    watermark field in the schema, each row gets the :data:`~controlmsg.spark.read_schema.Mark` of its
    partition, which the control messages before it on that partition moved (one bookkeeping per partition,
    restored from the micro-batch's start, since a record's marks depend on its own partition's messages
    only)."""

    def __init__(self, opts: ReadOptions, part: StreamRange, with_watermark: bool) -> None:
        self._run = (HEADER_RUN, opts.run_id.encode())
        self._own = own_run_tag(opts.run_id)
        self._topic = opts.topic
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
        own = self._own
        assert own is not None  # a reader of an intermediate topic follows a run
        whole = whole_batch(messages, own, run) if messages else None
        if whole is not None:  # the usual batch, every message a record of the run: taken column by column
            partitions = rows.take_batch(messages, *whole)
            if row_marks is not None:
                row_marks += map(marks.__getitem__, partitions)
            return len(rows)
        own_end = len(own)
        for msg in messages:
            value = msg.value()
            if value and value[0] == 0:
                # same_run(), with its usual answer (no headers, or the run header first) decided inline.
                if (headers := msg.headers()) and headers[0] != run and not same_run(headers, run):
                    continue
                payload = value[1:]
            elif value and value[0] == 3:  # wire format 2: the run in the envelope
                if value.startswith(own):
                    payload = value[own_end:]
                else:
                    try:
                        other = tagged_payload(value, own)
                    except DecodeError as exc:  # the driver's scan refuses it first; here too, never skipped
                        raise exc.at(Location(self._topic, msg.partition(), msg.offset())) from None
                    assert other is None  # of another run
                    continue
            else:
                if self._with_watermark:
                    p = msg.partition()
                    decoded = decode(value)
                    assert not isinstance(decoded, bytes)
                    self._trackers[p].on_control(p, decoded, msg.offset())
                    marks[p] = _marks(self._trackers[p], p, self._end_watermark)
                continue
            p = msg.partition()
            rows.partitions.append(p)
            rows.offsets.append(msg.offset())
            rows.keys.append(msg.key())
            rows.payloads.append(payload)
            rows.messages.append(msg)
            if row_marks is not None:
                row_marks.append(marks[p])
        return len(rows)

    def drain(self) -> tuple[DataColumns, list[Mark] | None]:
        rows, self._rows = self._rows, DataColumns()
        row_marks = self._row_marks
        if row_marks is not None:
            self._row_marks = []
        return rows, row_marks


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
