"""The stream reader of an intermediate topic, on the driver.

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

The driver's side is here; a micro-batch's task reads its planned offsets with
:func:`~controlmsg.spark.reading.envelope_records.read_range`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.codec import decode, whole_tagged
from controlmsg.errors import ControlMsgError, Location, ProtocolError, ReadError, TopicError
from controlmsg.kafka.admin import LatestOffsets, wait_for_topic, watermark_offsets
from controlmsg.kafka.fetching import consume_ready
from controlmsg.kafka.group_offsets import GroupProgress
from controlmsg.kafka.refusals import check_client
from controlmsg.kafka.retry import ConsumerErrors
from controlmsg.spark.batches import batch_builder
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.phases import log_phase
from controlmsg.spark.query_log import END_OF_TIME_MS, WATERMARK_ROWS_KEY
from controlmsg.spark.read_schema import META_CONTROL
from controlmsg.spark.reading.bad_records import check_dead_letters
from controlmsg.spark.reading.consuming import POLL_S, consumer_conf
from controlmsg.spark.reading.envelope_records import read_range
from controlmsg.spark.reading.planning import StreamRange, stream_groups
from controlmsg.spark.reading.source_metrics import REPORT_TIMEOUT_S, lag_report, upstream_metrics
from controlmsg.spark.reading.timeouts import timeout_error

__all__ = ["StreamReader"]

_OFFSETS_FORMAT: Final = 1
_PLANNED_KEYS: Final = ("groups", WATERMARK_ROWS_KEY)  # in an offset from latestOffset, not in the scan's


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
    """``spark.readStream.format("controlmsg")``: see the module docstring and :mod:`controlmsg.spark.reading`.
    Runs on the driver."""

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
        self._group: GroupProgress | None = None  # option groupId
        # Options minOffsetsPerTrigger and maxTriggerDelay: the scan read past the offset Spark holds (``start``,
        # returned again while too little came), and when the last micro-batch was planned (monotonic s).
        # The third item: what the held micro-batch's start told downstream (_progress).
        self._held: tuple[dict[str, Any], _Scan, tuple[int | None, bool]] | None = None
        self._last_trigger: float | None = None  # None before the first, which is never held

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
        if self._held is None:  # a held scan stands past what the micro-batches so far consumed
            self._report_to_group(scan)
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
        begin = _positions(start)
        before = self._held[2] if self._held is not None else _progress(scan)  # _resume kept it: held from start
        records = 0
        while True:
            _, read, why = self._advance(scan, max_rows)
            records += read
            moved = scan.positions != begin
            held = moved and self._holding(scan, begin)
            if (moved and not held) or not self._available_now or scan.tracker.is_ended:
                break
            # AvailableNow ends the query when no offset moves; a controlmsg run is available up to its
            # end of stream, so wait for the upstream instead (or fail after `timeout`). A held micro-batch
            # waits for its minimum or its delay, with the upstream writing: not a wait for the upstream.
            if not moved:
                self._check_deadline(scan)
        changed = before != _progress(scan)
        self._log_scan(began, records, "held" if held and not scan.tracker.is_ended else why, moved=changed,
                       settle=False)
        if not moved:
            return start
        if held and not scan.tracker.is_ended:  # Spark asks again with the same start; the scan goes on from here
            self._held = ({k: v for k, v in start.items() if k not in _PLANNED_KEYS}, scan, before)
            return start
        self._held = None
        self._last_trigger = time.monotonic()
        scan.settle = self._ticks and self._available_now and changed
        return self._planned(start, scan.offset())

    def _holding(self, scan: _Scan, begin: Mapping[int, int]) -> bool:
        """Options ``minOffsetsPerTrigger`` and ``maxTriggerDelay``: whether the micro-batch from ``begin`` to
        the scan is held back (fewer new offsets than the minimum, the delay since the last micro-batch not
        passed, the stream not ended)."""
        hold = self.opts.trigger_hold
        if hold is None or scan.tracker.is_ended:
            return False
        min_offsets, delay_ms = hold
        new = sum(o - max(begin.get(p, 0), 0) for p, o in scan.positions.items())
        return (new < min_offsets and self._last_trigger is not None
                and time.monotonic() - self._last_trigger < delay_ms / 1000.0)

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
        return read_range(self.opts, self.schema, partition)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Spark calls this right after :meth:`latestOffset` and shows the answer in the progress's
        ``latestOffset`` (:mod:`controlmsg.spark.reading.source_metrics`): the partitions' end offsets now, the
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
        pass  # the position lives in Spark's offset log (option groupId: _report_to_group)

    def _report_to_group(self, scan: _Scan) -> None:
        """Option ``groupId``: commit what the micro-batches so far consumed (``scan``, where the last one
        ended: Spark asks for the next one's end only once it has run) to that consumer group, for lag
        tools. Spark's own ``commit`` comes one micro-batch later, and never for a query's last. A partition
        read to its end there counts as consumed up to its end (past the transaction markers, which no
        record follows), so a caught-up stream shows no lag."""
        if self.opts.group_id is None:
            return
        if self._group is None:
            self._group = GroupProgress(dict(self.opts.config), self.opts.group_id)
        self._group.commit({(self.opts.topic, p): max(o, self._eof.get(p, o)) if p in self._at_end else o
                            for p, o in scan.positions.items()})

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._group is not None:
            self._group.close()
            self._group = None

    # ---------------------------------------------------------------- the driver's scan

    def _topic_partitions(self) -> list[int]:
        if self._partitions is None:
            count = wait_for_topic(dict(self.opts.config), self.opts.topic, self.opts.timeout)
            check_dead_letters(self.opts)
            self._partitions = list(range(count))
        return self._partitions

    def _resume(self, start: dict[str, Any]) -> _Scan:
        """The scan state at ``start``: the one in memory when the consumer stands there, else restored
        from the offset (after a restart, or a replanned batch) and the consumer moved there. A scan held
        past ``start`` (:meth:`_holding`) goes on where it stands."""
        key = {k: v for k, v in start.items() if k not in _PLANNED_KEYS}
        if self._held is not None and self._held[0] == key and self._held[1] is self._scan:
            return self._scan
        self._held = None
        if self._scan is not None and self._scan.offset() == key:
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
        idle = [p for p in at_end if p in positions and p not in tracker.ended_partitions]
        targets.update(self._ends_now(scan, idle))
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
                msgs: list[Any] = consume_ready(consumer, 1000, POLL_S)
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
                if value and (value[0] == 0 or (value[0] == 3 and whole_tagged(value))):  # a user record
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

    def _ends_now(self, scan: _Scan, ended: list[int]) -> dict[int, int]:
        """The end offsets, as the broker has them now (one ListOffsets request per broker; read committed),
        of the partitions that were at their end when the last scan stopped; those with offsets past their
        position are no longer at their end. Without it such a partition, once it got records again, was
        read on to its next end-of-partition event, which behind an upstream that keeps writing comes late
        or never: the scan chased the upstream up to ``maxScanMs`` (in Spark, 300 ms median for 3,000
        records; with it, 2-6 ms outside Spark; 2026-11-29, issue 40). A broker that does not answer within
        a second leaves them to their end events, as before (a restarting broker: the scan rides through)."""
        if not ended:
            return {}
        if self._latest is None:
            self._latest = LatestOffsets(dict(self.opts.config), self.opts.topic)
        try:
            ends = self._latest(ended, timeout=1.0)
        except TopicError:
            return {}
        for p, end in ends.items():
            if end > scan.positions[p]:
                self._at_end.discard(p)
        return ends

    def _check_deadline(self, scan: _Scan) -> None:
        timeout = self.opts.timeout
        if timeout is not None and time.monotonic() - self._started > timeout:
            raise timeout_error(self.opts, scan.tracker, sorted(scan.positions))


def _progress(scan: _Scan) -> tuple[int | None, bool]:
    """What a micro-batch that ends at ``scan`` tells downstream: the watermark, and whether the stream ended."""
    return scan.tracker.emitted_watermark, scan.tracker.is_ended


def _positions(offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset["offsets"].items()}


def _tick(start: dict[str, Any], end: dict[str, Any]) -> int | None:
    """The watermark row's ``_watermark`` for a micro-batch from bookkeeping snapshot ``start`` to ``end``:
    :data:`END_OF_TIME_MS` when the stream ended in it, the end's watermark when it moved, else ``None``
    (no row)."""
    if end.get("streamEnded"):
        return None if start.get("streamEnded") else END_OF_TIME_MS
    wm = end.get("emittedWatermark")
    return wm if wm is not None and wm != start.get("emittedWatermark") else None
