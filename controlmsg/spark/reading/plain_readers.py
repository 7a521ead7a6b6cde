"""Reading a **plain** topic (option ``envelope none``): records any producer wrote, as ``format("kafka")``
reads them, with the JSON parsing, bad-record handling and dead letters of ``format("controlmsg")``.

A plain topic is where a pipeline starts: the events an application produces (a JSON object per record, no
controlmsg type byte, no control messages). Reading it with the same source as the intermediate topics
gives the first stage of a chain the same schema handling (``.schema(ddl)``, ``_partition``, ``_offset``,
``_key``, ``_topic``, ``_timestamp``, ``_timestampType``, ``_headers``, ``mode``, ``deadLetterTopic``; without
a schema ``format("kafka")``'s columns, :mod:`controlmsg.spark.read_schema`) on every Spark version this project
supports, where Spark's own Kafka connector is published for some only.

What is read and where it starts and stops are ``format("kafka")``'s options in its meanings
(:mod:`controlmsg.spark.positions`): ``topic`` or ``subscribe`` (several topics), ``subscribePattern``,
``assign``; ``startingOffsets`` (``earliest``, the default, ``latest`` or JSON per partition),
``startingTimestamp``, ``startingOffsetsByTimestamp`` and ``startingOffsetsByTimestampStrategy``; for a batch
``endingOffsets``, ``endingTimestamp``, ``endingOffsetsByTimestamp``; ``failOnDataLoss``; for a stream
``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` and ``maxTriggerDelay``. The offsets they name are looked
up on the cluster by :mod:`controlmsg.spark.reading.plain_offsets`; a task reads its share with
:mod:`controlmsg.spark.reading.plain_records`.

* **Batch** (``spark.read``): each partition from its starting offset (the log start by default) to its
  ending offset (its end at planning time by default; ``read_committed``: the last stable offset), grouped
  into tasks as an intermediate topic's partitions are (:mod:`controlmsg.spark.reading.planning`), a task reading
  one topic.
* **Streaming** (``spark.readStream``): a micro-batch reads each partition from the last offsets to its end
  offset when the micro-batch is planned (at most ``maxOffsetsPerTrigger`` records in all, shared by the
  partitions in proportion to what each has; with ``minOffsetsPerTrigger`` none before that many are there
  or ``maxTriggerDelay`` has passed since the last one). The offsets go to Spark's offset log as
  ``{"format": 2, "envelope": "none", "offsets": {topic: {partition: next offset}}, "ended": bool}`` (the
  format 1 of a query started before, ``{"offsets": {partition: offset}}`` of its one topic, is read on),
  with the micro-batch's task groups and, under ``"from"``, the partitions it reads from elsewhere than the
  last offsets (one that appeared, from its log start; offsets gone, under ``failOnDataLoss false``), so a
  restart resumes there: nothing twice, nothing lost. A query with no checkpoint starts at the starting
  options: ``earliest`` by default (unlike ``format("kafka")``, whose streams start at ``latest``, nothing
  written before the query started is skipped unless asked). Under ``trigger(availableNow=True)`` the
  query reads what the topics hold when it starts, and stops there. Spark's ``availableNow`` is often
  an incremental batch run again and again, so that stop is not the end of the input by default; with
  ``availableNowEnds true`` it is (a bounded input, a backfill): the offset of the micro-batch that gets
  there says ``"ended": true`` (a micro-batch that reads nothing is added when the query had read it all
  already, so that the end is always in the log), and a ``controlmsg`` stream writer passes it on as the
  end of its stream (see :mod:`controlmsg.spark.writing`).

**Data loss.** Offsets to be read that are gone (retention deleted them, a topic or partition was deleted
or made anew) fail the read with :class:`DataLoss` naming them, as ``failOnDataLoss`` (default ``true``,
as Spark's) says; with ``failOnDataLoss false`` the read goes on from the partition's log start (a task
whose planned offsets go while it reads does the same: its consumer resets to the earliest offset).

**A watermark per partition.** A plain topic carries no watermark. A stream read for
:func:`~controlmsg.spark.with_watermark` (``_watermark``, and ``_control`` for watermark rows, in the schema,
with the options ``eventTimeField`` and ``maxOutOfOrderness``, ``idleTimeout`` optional) makes one from its
records' event times: each partition's largest event time minus the bound, the minimum over the partitions
that are not idle, never going back; at the end of an ``availableNowEnds`` input, the end of time. The driver
reads each micro-batch's records for it and keeps the state in the offset (``"eventTime"``, with
``"watermarkRows": true`` when the rows carry it), and a micro-batch in which it moved is followed, under
``availableNow``, by one that reads nothing (``"settle": true`` on the offset before), so that Spark applies
it: see :mod:`controlmsg.spark.reading.plain_watermark`. Without those fields the read makes none (Spark's
``withWatermark`` then); the fields without the options, the options without the fields, and either on a
batch read are refused in one line.

Partitions, and topics of a ``subscribePattern``, added while a stream runs are read from their start at
the next micro-batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import Consumer
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from controlmsg.core.partition_watermarks import PartitionWatermarks, WatermarkStatus
from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import LatestOffsets
from controlmsg.kafka.group_offsets import GroupProgress
from controlmsg.spark.batches import batch_builder
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.phases import log_phase
from controlmsg.spark.positions import PartitionRef
from controlmsg.spark.query_log import WATERMARK_ROWS_KEY
from controlmsg.spark.read_schema import META_CONTROL, WATERMARK_FIELDS
from controlmsg.spark.reading.consuming import consumer_conf
from controlmsg.spark.reading.plain_offsets import (
    DataLoss,
    describe_parts,
    discover_partitions,
    ending_offsets,
    lost_offset,
    partition_spans,
    plain_positions,
    starting_offsets,
)
from controlmsg.spark.reading.plain_records import read_plain_ranges
from controlmsg.spark.reading.plain_watermark import (
    STATE_KEY,
    DriverScan,
    epoch_ms,
    event_time_reader,
    finished,
    rule_of,
    state_of,
    tick,
    watermark_at,
    watermark_metrics,
)
from controlmsg.spark.reading.planning import PlainRanges, plain_groups
from controlmsg.spark.reading.source_metrics import REPORT_TIMEOUT_S, SOURCE, lag_metrics, lag_report

__all__ = ["PlainBatchReader", "PlainStreamReader", "is_plain_offset"]

_FORMAT: Final = 2
_FORMAT_ONE_TOPIC: Final = 1
"""The offsets of a query started before several topics were read: ``{"offsets": {partition: offset}}`` of
the one ``topic``; read still, never written."""
_ENVELOPE: Final = "none"


def is_plain_offset(offset: Any) -> bool:
    """Whether ``offset`` (a source's entry in Spark's offset log, parsed) is a plain stream's."""
    return isinstance(offset, dict) and offset.get("envelope") == _ENVELOPE


def _refuse_watermark(schema: StructType, opts: ReadOptions) -> None:
    """A batch read of a plain topic has no watermark: it reads what is there."""
    for name in WATERMARK_FIELDS:
        if name in schema.fieldNames():
            raise ValueError(f"the field '{name}' is a stream's watermark; a batch read of a plain topic (envelope "
                             "none) reads what is there and has none: read it with readStream for with_watermark")
    if opts.max_out_of_orderness_ms is not None or opts.event_time_field is not None:
        raise ValueError("options maxOutOfOrderness, eventTimeField and idleTimeout make a plain stream's watermark; "
                         "a batch read reads what is there and has none: read it with readStream")


# ------------------------------------------------------------------------------------ offsets in Spark's log


def _offset(positions: Mapping[PartitionRef, int], *, ended: bool) -> dict[str, Any]:
    offsets: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(positions.items()):
        offsets.setdefault(t, {})[str(p)] = o
    return {"format": _FORMAT, "envelope": _ENVELOPE, "offsets": offsets, "ended": ended}


def _positions(offset: dict[str, Any], opts: ReadOptions) -> dict[PartitionRef, int]:
    if is_plain_offset(offset) and offset.get("format") == _FORMAT:
        return {(t, int(p)): int(o) for t, parts in offset["offsets"].items() for p, o in parts.items()}
    if is_plain_offset(offset) and offset.get("format") == _FORMAT_ONE_TOPIC and len(opts.subscription.topics) == 1:
        topic = opts.subscription.topics[0]
        return {(topic, int(p)): int(o) for p, o in offset["offsets"].items()}
    raise ControlMsgError("the streaming checkpoint's offset is not a plain (envelope none) controlmsg offset of "
                          f"format {_FORMAT}, or of format {_FORMAT_ONE_TOPIC} for the one 'topic' read: "
                          f"{str(offset)[:200]}; a query's checkpoint belongs to its source: start the query with "
                          "a new checkpointLocation")


def _logged_groups(end: dict[str, Any], opts: ReadOptions) -> list[tuple[str, list[int]]] | None:
    groups = end.get("groups")
    if not isinstance(groups, list):
        return None
    if end.get("format") == _FORMAT_ONE_TOPIC:
        return [(opts.subscription.topics[0], [int(p) for p in g]) for g in groups]
    return [(str(t), [int(p) for p in ps]) for t, ps in groups]


def _plan(begin: Mapping[PartitionRef, int], end: Mapping[PartitionRef, int], opts: ReadOptions,
          groups: list[tuple[str, list[int]]] | None = None) -> list[PlainRanges]:
    chosen = plain_groups(begin, end, opts) if groups is None else groups
    return [PlainRanges(t, [(p, begin.get((t, p), 0), end[(t, p)]) for p in ps]) for t, ps in chosen]


# ------------------------------------------------------------------------------------ the readers


class PlainBatchReader(DataSourceReader):
    """``spark.read.format("controlmsg").option("envelope", "none")``: see the module docstring."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        _refuse_watermark(schema, options)
        batch_builder(schema, options)  # refuse a schema that cannot be built, at planning time
        self.opts = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        consumer = Consumer(consumer_conf(opts, eof=False))
        try:
            spans = partition_spans(opts, consumer, discover_partitions(opts, consumer, wait=True))
            begin = starting_offsets(opts, consumer, spans, batch=True)
            end = ending_offsets(opts, consumer, spans)
        finally:
            consumer.close()
        for tp in sorted(spans):
            if begin[tp] > end[tp]:
                pos = plain_positions(opts)
                raise ValueError(f"topic {tp[0]!r} partition {tp[1]}: the read would start at {begin[tp]} "
                                 f"({pos.starting.option}) after it ends at {end[tp]} ({pos.ending.option})")
        return _plan(begin, end, opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PlainRanges)
        return read_plain_ranges(self.opts, self.schema, partition)


class PlainStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("controlmsg").option("envelope", "none")``: see the module docstring.
    Runs on the driver."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self._rule = rule_of(options, schema)  # None: no watermark of ours (Spark's withWatermark)
        self._ticks = self._rule is not None and META_CONTROL in schema.fieldNames()
        batch_builder(schema, options)
        pos = plain_positions(options)
        if pos.ending_given:
            raise ValueError(f"option {pos.ending.option!r} is for batch reads; a stream reads on (to stop at what "
                             "the topic holds when it starts: trigger(availableNow=True), with availableNowEnds "
                             "true to end the stream there)")
        self.opts = options
        self.schema = schema
        self._consumer: Consumer | None = None
        self._target: dict[PartitionRef, int] | None = None  # availableNow: the end of the input
        # minOffsetsPerTrigger: when the last micro-batch was planned (monotonic s); None before the first, which
        # is never held (monotonic time starts near 0 at boot: 0.0 here held a new machine's first micro-batch).
        self._last_trigger: float | None = None
        self._planned: dict[str, Any] | None = None  # what latestOffset returned last: reportLatestOffset's start
        self._latest: dict[str, LatestOffsets] = {}  # by topic
        self._available_now = False
        self._scan = DriverScan(options, event_time_reader(options, schema)) if self._rule is not None else None
        self._status: WatermarkStatus[PartitionRef] | None = None  # the watermark at the micro-batch just planned
        self._group: GroupProgress | None = None  # option groupId

    def initialOffset(self) -> dict[str, Any]:
        consumer = self._open()
        spans = partition_spans(self.opts, consumer, discover_partitions(self.opts, consumer, wait=True))
        return _offset(starting_offsets(self.opts, consumer, spans, batch=False), ended=False)

    def prepareForTriggerAvailableNow(self) -> None:
        consumer = self._open()
        spans = partition_spans(self.opts, consumer, discover_partitions(self.opts, consumer, wait=True))
        self._target = {tp: hi for tp, (_, hi) in spans.items()}
        self._available_now = True

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._report_to_group(start)
        if start.get("settle"):
            # The last micro-batch moved the watermark (its watermark row); Spark applies a watermark in the
            # micro-batch after the one that moved it, and under availableNow the query could end first. So
            # one micro-batch that reads nothing comes now.
            settled = {k: v for k, v in start.items() if k not in ("settle", "from")}
            settled["groups"] = []
            self._planned = settled
            return settled
        opts = self.opts
        pos = plain_positions(opts)
        logged = _positions(start, opts)
        consumer = self._open()
        spans = partition_spans(opts, consumer, discover_partitions(opts, consumer, wait=False))
        gone = sorted(set(logged) - set(spans))
        if gone and pos.fail_on_data_loss:
            raise DataLoss(f"{describe_parts(gone)} (topic:partition) of {opts.topic!r} are gone: a topic or "
                           "partition was deleted; the option failOnDataLoss false reads on without them")
        # Where this micro-batch reads each partition from: the logged offset, else a partition's log start
        # (one that appeared since, or whose offsets are gone under failOnDataLoss false).
        reading: dict[PartitionRef, int] = {}
        for tp, (lo, hi) in spans.items():
            at = logged.get(tp)
            if at is None:
                reading[tp] = lo
            elif at < lo or at > hi:
                reading[tp] = lost_offset(opts, tp, at, lo, hi, "the query's next offset")
            else:
                reading[tp] = at
        if self._target is not None:
            end = {tp: max(self._target.get(tp, at), at) for tp, at in reading.items()}
        else:
            end = {tp: max(spans[tp][1], at) for tp, at in reading.items()}
        if (pos.min_offsets_per_trigger is not None and self._target is None
                and 0 < _count(reading, end) < pos.min_offsets_per_trigger
                and self._last_trigger is not None
                and time.monotonic() - self._last_trigger < pos.max_trigger_delay_ms / 1000.0):
            self._planned = start
            return start  # wait for more (minOffsetsPerTrigger), at most maxTriggerDelay since the last one
        if isinstance(limit, ReadMaxRows):
            end = _limited(reading, end, limit.max_rows)
        state = self._watermark(start, reading, end)  # with maxWatermarkDrift, cuts end where partitions run ahead
        ended = (opts.available_now_ends and self._target is not None
                 and all(end[tp] >= self._target.get(tp, 0) for tp in end))
        if state is not None and ended:
            finished(state)
        moved_mark = state is not None and state.watermark != watermark_at(start)
        if end == logged and not (ended and not start.get("ended")) and not moved_mark:
            self._planned = start
            return start  # nothing new (under availableNow: the query ends)
        self._last_trigger = time.monotonic()
        offset = _offset(end, ended=ended)
        if state is not None:
            offset[STATE_KEY] = state.snapshot()
            if self._ticks:  # the stream gives watermark rows: the writer checks Spark's watermark follows them
                offset[WATERMARK_ROWS_KEY] = True
                if self._available_now and moved_mark:
                    offset["settle"] = True
        moved = {tp: at for tp, at in reading.items() if at != logged.get(tp)}
        if moved:
            offset["from"] = _offset(moved, ended=False)["offsets"]
        # The tasks are planned now and logged with the offset: a micro-batch replayed after a restart with
        # other options (maxTasks...) runs the same tasks, whose ids the writer's exactly-once relies on.
        offset["groups"] = [[t, ps] for t, ps in plain_groups(reading, end, opts)]
        self._planned = offset
        return offset

    def _watermark(self, start: dict[str, Any], reading: Mapping[PartitionRef, int],
                   end: dict[PartitionRef, int]) -> PartitionWatermarks[PartitionRef] | None:
        """The watermark's state at ``end``: the one of ``start`` (new at the query's first micro-batch) fed
        the event times of the records from ``reading`` to ``end``, moved by the clock; ``None`` when the read
        makes no watermark. With ``maxWatermarkDrift``, ``end`` is cut (in place) where partitions run ahead."""
        if self._rule is None or self._scan is None:
            return None
        began = time.monotonic()
        state: PartitionWatermarks[PartitionRef] = (state_of(start, self._rule, self.opts.topic)
                                                    or PartitionWatermarks(self._rule))
        state.track(end, epoch_ms())
        records, cut = self._scan.scan({tp: (reading[tp], end[tp]) for tp in end}, state, epoch_ms)
        end.update(cut)
        self._status = state.advance(epoch_ms())
        if self.opts.log_phases:
            log_phase("scan", self.opts.topic, ms=round((time.monotonic() - began) * 1000, 1), records=records,
                      stop="end", moved=state.watermark != watermark_at(start), settle=False)
        return state

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The partitions' end offsets now and the lag behind them of the micro-batch just planned, for
        the progress's ``latestOffset`` (:mod:`controlmsg.spark.reading.source_metrics`). A read of several topics
        reports them as one: ``topic`` names them comma-separated, ``offsets`` is by topic (the shape of its
        own offsets) and the lag is over every partition of every topic."""
        if self._planned is None:
            return None
        by_topic: dict[str, dict[int, int]] = {}
        for (topic, partition), at in _positions(self._planned, self.opts).items():
            by_topic.setdefault(topic, {})[partition] = at
        marks = watermark_metrics(self._status) if self._rule is not None else {}
        if marks and watermark_at(self._planned) is not None:
            marks["watermark"] = str(watermark_at(self._planned))
        if len(by_topic) == 1:
            ((topic, consumed),) = by_topic.items()
            ask = self._latest_of(topic)
            return lag_report(topic, lambda parts: ask(parts, REPORT_TIMEOUT_S), consumed, metrics=marks)
        names = ",".join(sorted(by_topic))
        try:
            latest = {t: self._latest_of(t)(sorted(c), REPORT_TIMEOUT_S) for t, c in sorted(by_topic.items())}
        except ControlMsgError as exc:
            return {"source": SOURCE, "topic": names, "metrics": {**marks, "latestOffsetsError": str(exc)}}
        tps = [(t, p) for t in sorted(latest) for p in sorted(latest[t])]
        lag = lag_metrics({i: by_topic[t].get(p, latest[t][p]) for i, (t, p) in enumerate(tps)},
                          {i: latest[t][p] for i, (t, p) in enumerate(tps)})
        return {"source": SOURCE, "topic": names, "metrics": {**marks, **lag},
                "offsets": {t: {str(p): o for p, o in sorted(ends.items())} for t, ends in latest.items()}}

    def _latest_of(self, topic: str) -> LatestOffsets:
        if topic not in self._latest:
            self._latest[topic] = LatestOffsets(dict(self.opts.config), topic)
        return self._latest[topic]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = _positions(start, self.opts)
        moved = end.get("from")  # partitions read from elsewhere than the start offset (see latestOffset)
        if isinstance(moved, dict):
            begin.update({(t, int(p)): int(o) for t, parts in moved.items() for p, o in parts.items()})
        planned = _plan(begin, _positions(end, self.opts), self.opts, _logged_groups(end, self.opts))
        if self._rule is None:
            return planned
        # Every row of the micro-batch carries the watermark in force when it began; the watermark row, the
        # one at its end when it moved (see controlmsg.spark.reading.plain_watermark).
        mark = watermark_at(start)
        for part in planned:
            part.watermark = mark
        row = tick(start, end) if self._ticks else None
        if row is not None:
            if not planned:
                first = sorted(_positions(end, self.opts))[0][0] if _positions(end, self.opts) else self.opts.topic
                planned.append(PlainRanges(first, []))
            planned[0].tick = row
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PlainRanges)
        return read_plain_ranges(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the position lives in Spark's offset log (option groupId: _report_to_group)

    def _report_to_group(self, start: dict[str, Any]) -> None:
        """Option ``groupId``: commit where the last micro-batch ended (``start`` of the next: Spark asks for
        it only once that one has run; its own ``commit`` comes a micro-batch later, and never for a query's
        last) to that consumer group, for lag tools."""
        if self.opts.group_id is None:
            return
        if self._group is None:
            self._group = GroupProgress(dict(self.opts.config), self.opts.group_id)
        self._group.commit(_positions(start, self.opts))

    def stop(self) -> None:
        if self._scan is not None:
            self._scan.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._group is not None:
            self._group.close()
            self._group = None

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_conf(self.opts, eof=False))
        return self._consumer


def _count(begin: Mapping[PartitionRef, int], end: Mapping[PartitionRef, int]) -> int:
    return sum(max(end[tp] - begin.get(tp, 0), 0) for tp in end)


def _limited(begin: Mapping[PartitionRef, int], end: dict[PartitionRef, int], max_rows: int) -> dict[PartitionRef, int]:
    """``end`` cut so that at most ``max_rows`` offsets are read in all, each partition getting a share in
    proportion to what it has (at least one offset while it has any, so that every partition moves)."""
    spans = {tp: max(end[tp] - begin.get(tp, 0), 0) for tp in end}
    total = sum(spans.values())
    if total <= max_rows:
        return end
    return {tp: begin.get(tp, 0) + min(span, max(1, span * max_rows // total)) if span else end[tp]
            for tp, span in spans.items()}
