"""Where a read of a plain topic starts and stops, looked up on the cluster: the partitions its subscription
reads now, their log start and end offsets, and the offsets its starting and ending options
(:mod:`controlmsg.spark.positions`) name there, by number or by timestamp; offsets to be read that are gone
are :class:`DataLoss` unless ``failOnDataLoss`` is false. The readers of
:mod:`controlmsg.spark.reading.plain_readers` call these on the driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from confluent_kafka import Consumer, KafkaException, TopicPartition

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.admin import wait_for_topic, watermark_offsets
from controlmsg.spark.options import ReadOptions
from controlmsg.spark.positions import EARLIEST, LATEST, Bound, PartitionRef, Positions
from controlmsg.spark.reading.bad_records import check_dead_letters

__all__ = [
    "DataLoss",
    "describe_parts",
    "discover_partitions",
    "ending_offsets",
    "lost_offset",
    "partition_spans",
    "plain_positions",
    "starting_offsets",
]


class DataLoss(ControlMsgError):
    """Offsets that a read of a plain topic was to read are gone (retention, a deleted topic or partition)
    and ``failOnDataLoss`` is true (the default)."""


def plain_positions(opts: ReadOptions) -> Positions:
    """A plain read's starting and ending options (:mod:`controlmsg.spark.positions`)."""
    assert opts.positions is not None  # a plain read's options always have them
    return opts.positions


# ------------------------------------------------------------------------------------ the cluster's answers


def _timeout(opts: ReadOptions) -> float:
    return opts.timeout or 30.0


def discover_partitions(opts: ReadOptions, consumer: Consumer, *, wait: bool) -> list[PartitionRef]:
    """The partitions the subscription reads now. ``wait``: each named topic (``topic``,
    ``subscribe``, ``assign``) is waited for up to ``timeout`` (a read planned before its producer
    started); otherwise the cluster's metadata is asked once, and a named topic that is not there is left
    out (the caller decides what a topic gone means)."""
    sub = opts.subscription
    if wait and sub.pattern is None:
        named = sub.topics or tuple(sorted({t for t, _ in sub.assigned}))
        counts = {t: wait_for_topic(dict(opts.config), t, opts.timeout) for t in named}
        check_dead_letters(opts)
        if sub.assigned:
            for t, p in sub.assigned:
                if p >= counts[t]:
                    raise ValueError(f"option 'assign': topic {t!r} has no partition {p} (it has {counts[t]})")
            return list(sub.assigned)
        return [(t, p) for t in named for p in range(counts[t])]
    try:
        metadata = consumer.list_topics(timeout=_timeout(opts))
    except KafkaException as exc:
        raise ControlMsgError(f"cannot list the topics of the cluster for {opts.topic!r}: {exc.args[0]}") from exc
    found = {name: sorted(t.partitions) for name, t in metadata.topics.items() if t.error is None and t.partitions}
    if wait:
        check_dead_letters(opts)
    if sub.pattern is not None:
        return [(t, p) for t in sorted(found) if sub.matches(t) for p in found[t]]
    if sub.assigned:
        return [(t, p) for t, p in sub.assigned if p in found.get(t, ())]
    return [(t, p) for t in sub.topics for p in found.get(t, ())]


def partition_spans(opts: ReadOptions, consumer: Consumer,
                    parts: Sequence[PartitionRef]) -> dict[PartitionRef, tuple[int, int]]:
    """Each partition's (log start, end) offsets now; the end is the last stable offset under
    ``read_committed`` (the reader's isolation level)."""
    return {(t, p): watermark_offsets(consumer, t, p, _timeout(opts)) for t, p in parts}


def _at_times(opts: ReadOptions, consumer: Consumer,
              stamps: Mapping[PartitionRef, int]) -> dict[PartitionRef, int | None]:
    """Each partition's first offset whose record timestamp is at or after the given one (epoch ms);
    ``None`` when it has none."""
    if not stamps:
        return {}
    try:
        found = consumer.offsets_for_times([TopicPartition(t, p, ts) for (t, p), ts in stamps.items()],
                                           timeout=_timeout(opts))
    except KafkaException as exc:
        raise ControlMsgError(f"cannot look offsets up by timestamp on {opts.topic!r}: {exc.args[0]}") from exc
    out: dict[PartitionRef, int | None] = {}
    for tp in found:
        if tp.error is not None:
            raise ControlMsgError(f"cannot look offsets up by timestamp on topic {tp.topic!r} partition "
                                  f"{tp.partition}: {tp.error.str()}")
        out[(tp.topic, tp.partition)] = None if tp.offset < 0 else int(tp.offset)
    return out


# ------------------------------------------------------------------------------------ where a read starts, stops


def _named(bound: Bound, parts: Sequence[PartitionRef]) -> dict[PartitionRef, int]:
    """A JSON bound's numbers, checked to name every partition read and no other (as ``format("kafka")``
    asks)."""
    given = bound.per_partition()
    missing = sorted(set(parts) - set(given))
    unknown = sorted(set(given) - set(parts))
    if missing or unknown:
        raise ValueError(f"option {bound.option!r} must name every partition read, and only those (-2 earliest, "
                         f"-1 latest): " + "; ".join(
                             ([f"missing {describe_parts(missing)}"] if missing else []) +
                             ([f"not read {describe_parts(unknown)}"] if unknown else [])))
    return given


def describe_parts(tps: Sequence[PartitionRef]) -> str:
    """``topic:partition`` of the first eight, for messages."""
    return ", ".join(f"{t}:{p}" for t, p in tps[:8]) + (f" and {len(tps) - 8} more" if len(tps) > 8 else "")


def starting_offsets(opts: ReadOptions, consumer: Consumer, spans: Mapping[PartitionRef, tuple[int, int]], *,
                     batch: bool) -> dict[PartitionRef, int]:
    """Where each partition is read from, by the starting options (``startingTimestamp``, else
    ``startingOffsetsByTimestamp``, else ``startingOffsets``), checked against what the partitions hold."""
    pos = plain_positions(opts)
    bound = pos.starting
    parts = sorted(spans)
    if bound.kind == "earliest":
        return {tp: lo for tp, (lo, _) in spans.items()}
    if bound.kind == "latest":
        if batch:
            raise ValueError("option 'startingOffsets' latest is for streams: a batch read from the end reads "
                             "nothing (format(\"kafka\") refuses it too)")
        return {tp: hi for tp, (_, hi) in spans.items()}
    if bound.kind in ("timestamp", "timestamps"):
        stamps = ({tp: bound.timestamp for tp in parts if bound.timestamp is not None} if bound.kind == "timestamp"
                  else _named(bound, parts))
        found = _at_times(opts, consumer, stamps)
        out = {}
        for tp in parts:
            offset = found.get(tp)
            if offset is None:
                if pos.timestamp_strategy == "error":
                    raise ValueError(f"option {bound.option!r}: topic {tp[0]!r} partition {tp[1]} has no record at "
                                     f"or after {stamps[tp]}; startingOffsetsByTimestampStrategy latest starts "
                                     "such a partition at its end")
                offset = spans[tp][1]
            out[tp] = offset
        return out
    out = {}
    for tp, offset in _named(bound, parts).items():
        lo, hi = spans[tp]
        if offset == LATEST:
            if batch:
                raise ValueError(f"option {bound.option!r}: -1 (latest) is for streams: a batch read from the end "
                                 "reads nothing")
            offset = hi
        elif offset == EARLIEST:
            offset = lo
        elif offset < lo or offset > hi:
            offset = lost_offset(opts, tp, offset, lo, hi, bound.option)
        out[tp] = offset
    return out


def ending_offsets(opts: ReadOptions, consumer: Consumer,
                   spans: Mapping[PartitionRef, tuple[int, int]]) -> dict[PartitionRef, int]:
    """Where a batch read stops on each partition (not read), by ``endingTimestamp``, else
    ``endingOffsetsByTimestamp``, else ``endingOffsets``; a partition with no record at or after the
    timestamp stops at its end, as in ``format("kafka")``."""
    bound = plain_positions(opts).ending
    parts = sorted(spans)
    if bound.kind == "latest":
        return {tp: hi for tp, (_, hi) in spans.items()}
    if bound.kind in ("timestamp", "timestamps"):
        stamps = ({tp: bound.timestamp for tp in parts if bound.timestamp is not None} if bound.kind == "timestamp"
                  else _named(bound, parts))
        found = _at_times(opts, consumer, stamps)
        return {tp: spans[tp][1] if found.get(tp) is None else min(cast(int, found[tp]), spans[tp][1])
                for tp in parts}
    out = {}
    for tp, offset in _named(bound, parts).items():
        hi = spans[tp][1]
        if offset == LATEST:
            offset = hi
        elif offset > hi:
            raise ValueError(f"option {bound.option!r}: topic {tp[0]!r} partition {tp[1]} ends at {hi} now, before "
                             f"{offset}: a batch read reads what is there")
        out[tp] = offset
    return out


def lost_offset(opts: ReadOptions, tp: PartitionRef, offset: int, lo: int, hi: int, what: str) -> int:
    """An offset to read from that the partition no longer holds (``[lo, hi]`` it holds): a
    :class:`DataLoss` unless ``failOnDataLoss`` is false, which reads on from the log start."""
    if plain_positions(opts).fail_on_data_loss:
        raise DataLoss(f"topic {tp[0]!r} partition {tp[1]}: {what} is offset {offset}, but the partition holds "
                       f"{lo} to {hi} now: records were lost (retention, or the topic made anew); the option "
                       "failOnDataLoss false skips them and reads on")
    return lo
