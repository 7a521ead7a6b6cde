"""A plain topic's watermark per partition, on the driver: what makes :func:`~controlmsg.spark.with_watermark`
work on a chain's first topic (``envelope none``), whose producers send no control messages.

**The rule** is :mod:`controlmsg.core.partition_watermarks` (Flink's ``forBoundedOutOfOrderness`` with
``withIdleness``): each partition's largest event time minus ``maxOutOfOrderness``, the minimum over the
partitions that are not idle (``idleTimeout``: no record for so long by the driver's clock), never going
back, and the end of time once an ``availableNowEnds`` input has ended.

**Where the event times come from.** At every trigger the driver's :class:`DriverScan` reads the records of
the micro-batch it plans (the offset ranges the executors will read) and takes each one's event time: the
field ``eventTimeField`` of the declared schema, a timestamp parsed from the JSON value as the executors
parse it (:mod:`controlmsg.spark.batches`), or the record's own timestamp (``timestamp`` of a raw schema,
``_timestamp`` of a JSON one). A record whose event time cannot be read (a bad record: the executors set it
aside by ``mode``) moves nothing, but counts as activity of its partition. The scan reads every record a
second time, on the driver, as the intermediate topic's scan does (:mod:`controlmsg.spark.reading.stream_reader`).

**Where the state lives.** In the micro-batch's offset, in Spark's offset log (``"eventTime"``: the
watermark and each partition's largest event time and last activity, epoch ms; :func:`state_of`), so a
query restarted from its checkpoint resumes with it: the watermark never goes back. A replayed micro-batch
is planned from its logged offsets, so its rows carry the same values.

**Watermark alignment** (option ``maxWatermarkDrift``, Flink's ``withWatermarkAlignment``): a partition
whose own watermark runs more than the drift past the read's watermark (the one at the micro-batch's start)
is read no further in this micro-batch: the scan stops it after the record that took it there, and the
micro-batch's end offset of it is that record's next; one already ahead when the micro-batch is planned
moves not at all, and the driver's consumer stops fetching it; unless every partition that has records to
read runs ahead (those behind have none now): then they are read, since holding them would only stop the
read. It starts once the watermark is defined. So a skewed backfill keeps windows of a bounded span of event
time in Spark's state, whatever the partitions hold.

**What the rows carry** (:mod:`controlmsg.spark.reading.plain_records`): every record of a micro-batch the
watermark in force when the micro-batch began (``_watermark``: the one at the end of the micro-batch before;
a record below it is late, as a record below Flink's current watermark is), ``_partition_watermark`` null
(lateness on a plain topic is against the read's watermark only), and, with ``_control`` in the schema, one
watermark row after a micro-batch in which the watermark moved (:func:`tick`), as an intermediate topic's.
Why not the watermark at the micro-batch's end on every row: a micro-batch that reads partition 0 from hour
0 to hour 5 and a lagging partition 3 at hour 0 ends at hour 0 or so, and partition 0's own records before
it would be late in the very micro-batch that brings them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.types import StructType, TimestampNTZType, TimestampType

from controlmsg.core.partition_watermarks import PartitionWatermarks, WatermarkRule, WatermarkStatus
from controlmsg.errors import CheckpointError, ReadError
from controlmsg.kafka.fetching import consume_ready
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.positions import PartitionRef
from controlmsg.spark.query_log import END_OF_TIME_MS
from controlmsg.spark.read_schema import META_WATERMARK, RECORD_COLUMNS, WATERMARK_FIELDS, is_raw_schema
from controlmsg.spark.reading.consuming import POLL_S, consumer_conf

__all__ = ["STATE_KEY", "DriverScan", "epoch_ms", "event_time_reader", "finished", "rule_of", "state_of", "tick",
           "watermark_at", "watermark_metrics"]

STATE_KEY: Final = "eventTime"
"""The key of a plain stream's offset that holds the watermark's state (:meth:`PartitionWatermarks.snapshot`)."""
_BATCH: Final = 5000

EventTimes = Callable[[list[Any]], list["int | None"]]
"""Each message's event time in epoch ms (``None``: none that can be read)."""


def rule_of(opts: ReadOptions, schema: StructType) -> WatermarkRule | None:
    """The watermark rule of a plain stream read with ``schema``, or ``None`` when the read makes no watermark.
    Raises ``ValueError`` in one line for what cannot be honoured: a schema with ``_watermark`` without the
    option ``maxOutOfOrderness`` or ``eventTimeField``, those options without ``_watermark`` in the schema
    (they would do nothing), or an ``eventTimeField`` that is not a timestamp field of the schema."""
    names = schema.fieldNames()
    asked = any(name in names for name in WATERMARK_FIELDS)
    bound = opts.max_out_of_orderness_ms
    if not asked:
        if bound is not None or opts.event_time_field is not None:
            raise ValueError("options maxOutOfOrderness, eventTimeField and idleTimeout make a plain topic's "
                             "watermark per partition for controlmsg.spark.with_watermark: call with_watermark on "
                             "the read, or declare controlmsg.spark.WATERMARK_COLUMNS at the end of the schema")
        return None
    if META_WATERMARK not in names:
        raise ValueError(f"a plain topic's watermark fields need '{META_WATERMARK} timestamp' in the schema "
                         "(controlmsg.spark.WATERMARK_COLUMNS)")
    if bound is None or opts.event_time_field is None:
        missing = [name for name, value in (("eventTimeField", opts.event_time_field), ("maxOutOfOrderness", bound))
                   if value is None]
        raise ValueError(f"a plain topic (envelope none) carries no watermark: with {META_WATERMARK} in the schema the "
                         f"read makes one per partition, and needs the option{'s' if len(missing) > 1 else ''} "
                         f"{' and '.join(repr(m) for m in missing)} (the field of each record's event time, and how "
                         "far behind its partition's largest event time a record may come, e.g. '0s' or '10s'); "
                         "or use Spark's withWatermark without the watermark fields")
    event_time_reader(opts, schema)  # refuse a field that is not there now, not at the first trigger
    return WatermarkRule(bound, opts.idle_timeout_ms, opts.max_watermark_drift_ms)


def event_time_reader(opts: ReadOptions, schema: StructType) -> EventTimes:
    """How the driver reads each message's event time for the option ``eventTimeField`` of ``schema``: the
    record's timestamp for ``timestamp`` (a raw schema) or ``_timestamp`` (a JSON one); else the JSON value's
    member of that name, a timestamp field of the schema, parsed as the executors parse it. Raises
    ``ValueError`` naming the field otherwise."""
    name = opts.event_time_field
    assert name is not None
    names = schema.fieldNames()
    if name not in names:
        raise ValueError(f"option 'eventTimeField' is {name!r}, which is not a field of the schema "
                         f"({', '.join(names)})")
    dtype = schema[name].dataType
    if not isinstance(dtype, TimestampType | TimestampNTZType):
        raise ValueError(f"option 'eventTimeField': the field {name!r} is {dtype.simpleString()}; the event time "
                         "is a timestamp field (a JSON string in ISO-8601, or the record's timestamp)")
    raw = is_raw_schema(names, binary_value=False) or is_raw_schema(names, binary_value=True)
    if RECORD_COLUMNS.get(name) == "timestamp" and (raw or name.startswith("_")):
        return _record_timestamps
    arrow_type = pa.timestamp("us", tz="UTC") if isinstance(dtype, TimestampType) else pa.timestamp("us")
    return _json_times(name, arrow_type)


def _record_timestamps(messages: list[Any]) -> list[int | None]:
    out: list[int | None] = []
    for msg in messages:
        kind, ms = msg.timestamp()
        out.append(ms if kind in (1, 2) else None)
    return out


def _json_times(name: str, arrow_type: pa.DataType) -> EventTimes:
    loads = orjson.loads

    def member(value: bytes | None) -> str | None:
        try:
            obj = loads(value or b"")
        except orjson.JSONDecodeError:
            return None
        found = obj.get(name) if type(obj) is dict else None
        return found if isinstance(found, str) else None

    def parse(texts: list[str | None]) -> list[int | None]:
        try:
            micros = pa.array(texts, pa.string()).cast(arrow_type).cast(pa.int64()).to_pylist()
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError):
            if len(texts) == 1:
                return [None]
            return [one for text in texts for one in parse([text])]
        return [None if us is None else us // 1000 for us in micros]

    def read(messages: list[Any]) -> list[int | None]:
        return parse([member(msg.value()) for msg in messages])

    return read


def state_of(offset: Mapping[str, Any], rule: WatermarkRule, topic: str) -> PartitionWatermarks[Any] | None:
    """The watermark's state a plain stream's offset holds (``None``: none, e.g. the initial offset of a
    query, or one logged before the read made a watermark). Raises :class:`CheckpointError` naming the read's
    ``topic`` for a state that is not one."""
    snapshot = offset.get(STATE_KEY)
    if not isinstance(snapshot, dict):
        return None
    try:
        return PartitionWatermarks.restore(rule, snapshot)
    except ValueError as exc:
        raise CheckpointError(f"topic {topic!r}: the streaming checkpoint's offset holds no watermark state this "
                              f"reader can read ({exc}); a query's checkpoint belongs to its source: start the "
                              "query with a new checkpointLocation") from exc


def watermark_at(offset: Mapping[str, Any]) -> int | None:
    """The read's watermark an offset stands at (epoch ms; :data:`END_OF_TIME_MS` once the input ended)."""
    snapshot = offset.get(STATE_KEY)
    mark = snapshot.get("watermark") if isinstance(snapshot, dict) else None
    return mark if isinstance(mark, int) else None


def tick(start: Mapping[str, Any], end: Mapping[str, Any]) -> int | None:
    """The watermark row's ``_watermark`` for a micro-batch from offset ``start`` to ``end``: the end's
    watermark when it moved, else ``None`` (no row)."""
    before, after = watermark_at(start), watermark_at(end)
    return after if after is not None and after != before else None


def finished(state: PartitionWatermarks[Any]) -> None:
    """The input has ended (``availableNowEnds``): every window can close."""
    state.finish(END_OF_TIME_MS)


def watermark_metrics(status: WatermarkStatus[Any] | None) -> dict[str, str]:
    """What the progress's ``latestOffset.metrics`` says of the watermark
    (:mod:`~controlmsg.spark.reading.source_metrics`): ``watermark`` (epoch ms, absent while undefined), the
    partition holding it back (``watermarkHeldBackOnTopic``, ``watermarkHeldBackOnPartition``) and that
    partition's own watermark (``watermarkHeldBackAt``; absent while it has no event time), and
    ``idlePartitions``."""
    if status is None:
        return {}
    out = {"idlePartitions": str(status.idle)}
    if status.watermark is not None:
        out["watermark"] = str(status.watermark)
    if status.holder is not None:
        topic, partition = status.holder
        out["watermarkHeldBackOnTopic"] = str(topic)
        out["watermarkHeldBackOnPartition"] = str(partition)
        if status.holder_watermark is not None:
            out["watermarkHeldBackAt"] = str(status.holder_watermark)
    return out


class DriverScan:
    """The driver's reading of a micro-batch's records for their event times (see the module docstring). One
    consumer, kept between triggers: a partition read up to where the last scan stopped goes on from there,
    with what the consumer fetched past it kept (offset and event time only); any other start (a restart, a
    replanned micro-batch, offsets lost) assigns the partition anew."""

    def __init__(self, opts: ReadOptions, event_times: EventTimes) -> None:
        self._opts = opts
        self._event_times = event_times
        self._consumer: Consumer | None = None
        self._assigned: dict[PartitionRef, int] = {}  # partition -> the offset the consumer was assigned at
        self._used: dict[PartitionRef, int] = {}  # partition -> where the last scan of it stopped
        self._ahead: dict[PartitionRef, list[tuple[int, int | None]]] = {}  # fetched past that, not yet used
        self._fetched: dict[PartitionRef, int] = {}  # partition -> next offset after what the consumer gave
        self._eof: dict[PartitionRef, int] = {}  # partition -> where the consumer last found its end

    def scan(self, ranges: Mapping[PartitionRef, tuple[int, int]], state: PartitionWatermarks[Any],
             now: Callable[[], int]) -> tuple[int, dict[PartitionRef, int]]:
        """Read each partition's ``[start, end)`` offsets (``ranges``: every partition the read reads) and
        feed their event times to ``state`` (at the clock ``now()`` after the read). With the rule's
        ``drift_ms`` (watermark alignment), a partition whose own watermark runs more than that past the read's
        watermark is read no further: its end is where it stopped (and it counts as active, records waiting).
        Returns how many records were read and each partition's end. Raises :class:`ReadError` when the
        consumer fails, or when a partition gives nothing for ``timeout`` (else 120) s before its end."""
        gone = [tp for tp in self._assigned if tp not in ranges]
        for tp in gone:
            for kept in (self._assigned, self._used, self._ahead, self._fetched, self._eof):
                kept.pop(tp, None)
        ends = {tp: b for tp, (_, b) in ranges.items()}
        wanted = {tp: (a, b) for tp, (a, b) in ranges.items() if b > a}
        if not wanted:
            return 0, ends
        rule, mark = state.rule, state.watermark
        largest = {tp: state.largest(tp) for tp in wanted}
        paused = {tp for tp in wanted if rule.runs_ahead(largest[tp], mark)}
        if paused and len(paused) == len(wanted):
            # Every partition with records to read runs ahead: those behind have none now (a lagging producer,
            # the end of an availableNow input). Holding these back would only stop the read; read them.
            paused, mark = set(), None
        for tp in paused:  # read no further, and fetch nothing of it: assigned anew at its start when it goes on
            ends[tp] = wanted[tp][0]
            for held in (self._assigned, self._ahead, self._fetched, self._eof):
                held.pop(tp, None)
        self._place({tp: span for tp, span in wanted.items() if tp not in paused}, bool(gone or paused))
        found: dict[PartitionRef, list[int | None]] = {tp: [] for tp in wanted}

        def take(tp: PartitionRef, off: int, ms: int | None) -> bool:
            """One record of a wanted partition, in offset order: counted when in its range (then the
            partition may pause after it), else whether it is past the range (kept for the next scan)."""
            if off < wanted[tp][0]:
                return True  # before the range: read already
            if tp in paused or off >= ends[tp]:
                return False
            found[tp].append(ms)
            if ms is not None and (largest[tp] is None or ms > (largest[tp] or 0)):
                largest[tp] = ms
            if rule.runs_ahead(largest[tp], mark):
                ends[tp] = off + 1
                paused.add(tp)
            return True

        open_parts = set()
        for tp in wanted:
            if tp in paused:
                continue
            self._ahead[tp] = [(off, ms) for off, ms in self._ahead.get(tp, []) if not take(tp, off, ms)]
            if tp not in paused and not self._done(tp, ends[tp]):
                open_parts.add(tp)
        wait_s = self._opts.timeout if self._opts.timeout is not None else 120.0
        last = time.monotonic()
        consumer = self._open()
        while open_parts:
            try:
                msgs: list[Any] = consume_ready(consumer, _BATCH, POLL_S)
            except KafkaException as exc:
                raise ReadError(f"the driver's scan of {self._opts.topic!r} for event times failed: "
                                f"{exc.args[0]}") from exc
            if not msgs:
                if time.monotonic() - last > wait_s:
                    raise ReadError(f"the driver's scan of {self._opts.topic!r} for event times: partitions "
                                    f"{sorted(open_parts)} gave no record for {wait_s:g} s before the planned offsets "
                                    f"{ {tp: ends[tp] for tp in sorted(open_parts)} }")
                continue
            last = time.monotonic()
            records = []
            for msg in msgs:
                tp = (msg.topic(), msg.partition())
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self._eof[tp] = msg.offset()
                        continue
                    raise ReadError(f"the driver's scan of topic {tp[0]!r} partition {tp[1]} for event times "
                                    f"failed: {err.str()}")
                records.append(msg)
            times = self._event_times(records) if records else []
            for msg, ms in zip(records, times, strict=True):
                tp = (msg.topic(), msg.partition())
                off = msg.offset()
                self._fetched[tp] = off + 1
                if tp not in wanted or not take(tp, off, ms):
                    self._ahead.setdefault(tp, []).append((off, ms))
            open_parts = {tp for tp in open_parts if tp not in paused and not self._done(tp, ends[tp])}
        at = now()
        count = 0
        for tp, times_of in found.items():
            for ms in times_of:
                state.observe(tp, ms, at)
            if tp in paused:
                state.observe(tp, None, at)  # records wait there: active, never idle
            count += len(times_of)
            self._used[tp] = ends[tp]
        return count, ends

    def _done(self, tp: PartitionRef, end: int) -> bool:
        return self._fetched.get(tp, -1) >= end or self._eof.get(tp, -1) >= end

    def _place(self, wanted: Mapping[PartitionRef, tuple[int, int]], moved: bool) -> None:
        """Assign the consumer so that each wanted partition is read from its start: one whose last scan
        stopped there goes on where the consumer stands; any other is assigned at its start, and what was
        kept of it dropped. ``moved``: assign anew in any case (partitions were dropped)."""
        for tp, (a, _) in wanted.items():
            if tp in self._assigned and self._used.get(tp) == a:
                continue
            self._assigned[tp] = a
            self._ahead.pop(tp, None)
            self._fetched[tp] = a
            self._eof.pop(tp, None)
            moved = True
        if moved:
            # Partitions that keep their place are assigned where the consumer stands (past what it kept).
            self._open().assign([TopicPartition(t, p, self._fetched.get((t, p), a))
                                 for (t, p), a in sorted(self._assigned.items())])

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_conf(self._opts, eof=True))
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def epoch_ms() -> int:
    """The driver's clock for idleness: wall-clock epoch ms (it is kept in the checkpoint, and read again by a
    restarted driver)."""
    return int(time.time() * 1000)

