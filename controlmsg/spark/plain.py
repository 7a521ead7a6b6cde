"""Reading a **plain** topic (option ``envelope none``): records any producer wrote, as ``format("kafka")``
reads them, with the JSON parsing, bad-record handling and dead letters of ``format("controlmsg")``.

A plain topic is where a pipeline starts: the events an application produces (a JSON object per record, no
controlmsg type byte, no control messages). Reading it with the same source as the intermediate topics
gives the first stage of a chain the same schema handling (``.schema(ddl)``, ``_partition``, ``_offset``,
``_key``, ``mode``, ``deadLetterTopic``; without a schema ``partition, offset, key, value``) on every
Spark version this project supports, where Spark's own Kafka connector is published for some only.

* **Batch** (``spark.read``): each partition from its log start to its end offset at planning time
  (``read_committed``: the last stable offset), grouped into tasks as an intermediate topic's partitions
  are (:mod:`controlmsg.spark.planning`).
* **Streaming** (``spark.readStream``): a micro-batch reads each partition from the last offsets to its end
  offset when the micro-batch is planned (at most ``maxOffsetsPerTrigger`` records in all, shared by the
  partitions in proportion to what each has). The offsets go to Spark's offset log as
  ``{"format": 1, "envelope": "none", "offsets": {partition: next offset}, "ended": bool}``, so a restart
  resumes there: nothing twice, nothing lost. A query with no checkpoint starts at ``startingOffsets``:
  ``earliest`` (the default: unlike ``format("kafka")``, whose streams start at ``latest``, nothing written
  before the query started is skipped unless asked) or ``latest``. Under ``trigger(availableNow=True)`` the
  query reads what the topic holds when it starts, and stops there. Spark's ``availableNow`` is often
  an incremental batch run again and again, so that stop is not the end of the input by default; with
  ``availableNowEnds true`` it is (a bounded input, a backfill): the offset of the micro-batch that gets
  there says ``"ended": true`` (a micro-batch that reads nothing is added when the query had read it all
  already, so that the end is always in the log), and a ``controlmsg`` stream writer passes it on as the
  end of its stream (see :mod:`controlmsg.spark.writing`).

A plain topic carries no watermark: ``_watermark`` and ``_control`` are refused. Declare the stage's
event time with Spark's ``withWatermark``; the ``controlmsg`` writer carries Spark's watermark onward.
Partitions added to the topic while a stream runs are read from their start at the next micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, cast

import pyarrow as pa
from confluent_kafka import Consumer, Message
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import LatestOffsets, wait_for_topic, watermark_offsets
from controlmsg.kafka.reader import DataColumns
from controlmsg.spark.bad_records import check_dead_letters
from controlmsg.spark.batches import WATERMARK_FIELDS, Mark, batch_builder
from controlmsg.spark.consuming import consumer_conf, read_ranges
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.planning import PlainRanges, stream_groups
from controlmsg.spark.source_progress import REPORT_TIMEOUT_S, lag_report

__all__ = ["PlainBatchReader", "PlainStreamReader", "is_plain_offset"]

_FORMAT: Final = 1
_ENVELOPE: Final = "none"
# The messages a reader's hook takes are never errors, so each has a partition and an offset (the stubs
# allow None for an error's).
_PARTITION: Final = cast("Callable[[Any], int]", Message.partition)
_OFFSET: Final = cast("Callable[[Any], int]", Message.offset)
_KEY: Final = Message.key
_VALUE: Final = Message.value


def is_plain_offset(offset: Any) -> bool:
    """Whether ``offset`` (a source's entry in Spark's offset log, parsed) is a plain stream's."""
    return isinstance(offset, dict) and offset.get("envelope") == _ENVELOPE


def _refuse_watermark(schema: StructType) -> None:
    for name in WATERMARK_FIELDS:
        if name in schema.fieldNames():
            raise ValueError(f"the field '{name}' is the watermark of an intermediate topic; a plain topic "
                             "(envelope none) carries none: declare the stage's event time with Spark's "
                             "withWatermark, and the controlmsg writer carries it onward")


def _ends(opts: ReadOptions, consumer: Consumer, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Each partition's (log start, end) offsets now; the end is the last stable offset under
    ``read_committed`` (the reader's isolation level)."""
    timeout = opts.timeout or 30.0
    return {p: watermark_offsets(consumer, opts.topic, p, timeout) for p in partitions}


def _plan(begin: dict[int, int], end: dict[int, int], opts: ReadOptions,
          groups: list[list[int]] | None = None) -> list[PlainRanges]:
    chosen = stream_groups(begin, end, opts) if groups is None else groups
    return [PlainRanges([(p, begin.get(p, 0), end[p]) for p in group]) for group in chosen]


class PlainBatchReader(DataSourceReader):
    """``spark.read.format("controlmsg").option("envelope", "none")``: see the module docstring."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        _refuse_watermark(schema)
        batch_builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        count = wait_for_topic(dict(opts.config), opts.topic, opts.timeout)
        check_dead_letters(opts)
        consumer = Consumer(consumer_conf(opts, eof=False))
        try:
            spans = _ends(opts, consumer, range(count))
        finally:
            consumer.close()
        return _plan({p: lo for p, (lo, _) in spans.items()}, {p: hi for p, (_, hi) in spans.items()}, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PlainRanges)
        return _read(self.opts, self.schema, partition.ranges)


class PlainStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("controlmsg").option("envelope", "none")``: see the module docstring.
    Runs on the driver."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        _refuse_watermark(schema)
        batch_builder(schema, options)
        self.opts = options
        self.schema = schema
        self._consumer: Consumer | None = None
        self._target: dict[int, int] | None = None  # availableNow: the end of the input
        self._planned: dict[str, Any] | None = None  # what latestOffset returned last: reportLatestOffset's start
        self._latest: LatestOffsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        spans = _ends(self.opts, self._open(), self._topic_partitions())
        latest = self.opts.starting_offsets == "latest"
        return _offset({p: hi if latest else lo for p, (lo, hi) in spans.items()}, ended=False)

    def prepareForTriggerAvailableNow(self) -> None:
        spans = _ends(self.opts, self._open(), self._topic_partitions())
        self._target = {p: hi for p, (_, hi) in spans.items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = _positions(start)
        parts = self._topic_partitions(refresh=True)
        if self._target is not None:
            end = {p: max(self._target.get(p, begin.get(p, 0)), begin.get(p, 0)) for p in parts}
        else:
            spans = _ends(self.opts, self._open(), parts)
            end = {p: max(hi, begin.get(p, lo)) for p, (lo, hi) in spans.items()}
            for p in parts:  # a partition added since: from its start
                begin.setdefault(p, spans[p][0])
        if isinstance(limit, ReadMaxRows):
            end = _limited(begin, end, limit.max_rows)
        ended = (self.opts.available_now_ends and self._target is not None
                 and all(end[p] >= self._target.get(p, 0) for p in parts))
        offset = _offset(end, ended=ended)
        if offset["offsets"] == start["offsets"] and not (ended and not start.get("ended")):
            self._planned = start
            return start  # nothing new (under availableNow: the query ends)
        # The tasks are planned now and logged with the offset: a micro-batch replayed after a restart with
        # other options (maxTasks...) runs the same tasks, whose ids the writer's exactly-once relies on.
        offset["groups"] = stream_groups(begin, end, self.opts)
        self._planned = offset
        return offset

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The partitions' end offsets now and the lag behind them of the micro-batch just planned, for
        the progress's ``latestOffset`` (:mod:`controlmsg.spark.source_progress`)."""
        if self._planned is None:
            return None
        if self._latest is None:
            self._latest = LatestOffsets(dict(self.opts.config), self.opts.topic)
        ask = self._latest
        return lag_report(self.opts.topic, lambda parts: ask(parts, REPORT_TIMEOUT_S), _positions(self._planned))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        groups = end.get("groups")
        return _plan(_positions(start), _positions(end), self.opts,
                     [[int(p) for p in g] for g in groups] if isinstance(groups, list) else None)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PlainRanges)
        return _read(self.opts, self.schema, partition.ranges)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the position lives in Spark's offset log

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_conf(self.opts, eof=False))
        return self._consumer

    def _topic_partitions(self, refresh: bool = False) -> list[int]:
        if refresh:
            metadata = self._open().list_topics(self.opts.topic, timeout=self.opts.timeout or 30.0)
            topic = metadata.topics.get(self.opts.topic)
            if topic is not None and topic.error is None and topic.partitions:
                return sorted(topic.partitions)
        count = wait_for_topic(dict(self.opts.config), self.opts.topic, self.opts.timeout)
        check_dead_letters(self.opts)
        return list(range(count))


def _offset(positions: dict[int, int], *, ended: bool) -> dict[str, Any]:
    return {"format": _FORMAT, "envelope": _ENVELOPE,
            "offsets": {str(p): o for p, o in sorted(positions.items())}, "ended": ended}


def _positions(offset: dict[str, Any]) -> dict[int, int]:
    if not is_plain_offset(offset) or offset.get("format") != _FORMAT:
        raise ControlMsgError("the streaming checkpoint's offset is not a plain (envelope none) controlmsg offset "
                              f"of format {_FORMAT}: {str(offset)[:200]}; a query's checkpoint belongs to its "
                              "source: start the query with a new checkpointLocation")
    return {int(p): int(o) for p, o in offset["offsets"].items()}


def _limited(begin: dict[int, int], end: dict[int, int], max_rows: int) -> dict[int, int]:
    """``end`` cut so that at most ``max_rows`` offsets are read in all, each partition getting a share in
    proportion to what it has (at least one offset while it has any, so that every partition moves)."""
    spans = {p: end[p] - begin.get(p, 0) for p in end}
    total = sum(spans.values())
    if total <= max_rows:
        return end
    return {p: begin.get(p, 0) + (min(span, max(1, span * max_rows // total)) if span else 0)
            for p, span in spans.items()}


def _read(opts: ReadOptions, schema: StructType, ranges: Sequence[tuple[int, int, int]]) -> Iterator[pa.RecordBatch]:
    """Read the ``[start, end)`` offsets of some partitions of a plain topic into Arrow batches of
    ``schema`` (runs in a worker): :func:`~controlmsg.spark.consuming.read_ranges` with every record kept
    as it is. End-of-partition events are on: the last offsets may be transaction markers or aborted
    records, which ``read_committed`` does not deliver."""
    build, _ = batch_builder(schema, opts)
    yield from read_ranges(opts, build, ranges, _PlainRecords(), eof=True)


class _PlainRecords:
    """The plain reader's :class:`~controlmsg.spark.consuming.RangeRecords`: every record is a row, its
    value the whole payload (a record without one: empty bytes)."""

    def __init__(self) -> None:
        self._rows = DataColumns()

    def take(self, messages: list[Any]) -> int:
        rows = self._rows
        # Whole columns at once: map() over the messages' C methods, no Python call per record.
        rows.partitions.extend(map(_PARTITION, messages))
        rows.offsets.extend(map(_OFFSET, messages))
        rows.keys.extend(map(_KEY, messages))
        rows.payloads.extend([value or b"" for value in map(_VALUE, messages)])
        rows.messages.extend(messages)
        return len(rows)

    def drain(self) -> tuple[DataColumns, list[Mark] | None]:
        rows, self._rows = self._rows, DataColumns()
        return rows, None
