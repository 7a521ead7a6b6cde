"""What a reader of ``format("controlmsg")`` subscribes to, and where a read of a **plain** topic
(``envelope none``) starts and stops: the options of Spark's Kafka connector (``format("kafka")``), in its
names and meanings, parsed and checked here once. Pure Python (no Kafka, no pyspark).

==========================================  ============================================================
``subscribe``                               topics, comma-separated (``topic``: one topic, as before)
``subscribePattern``                        a regular expression: every topic whose whole name matches
                                            (Python's ``re``, close to Java's for the usual patterns),
                                            internal topics (``__...``) left out; looked up again before
                                            each micro-batch
``assign``                                  ``{"topicA": [0, 1], "topicB": [2]}``: those partitions only
``startingOffsets``                         ``earliest`` (default), ``latest`` (streams only) or
                                            ``{"topicA": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest;
                                            every partition named)
``startingOffsetsByTimestamp``              ``{"topicA": {"0": 1767225600000}}``: each partition's first
                                            offset whose record timestamp is at or after it
``startingTimestamp``                       one timestamp (epoch ms) for every partition
``startingOffsetsByTimestampStrategy``      ``error`` (default): a partition with no record at or after
                                            the timestamp fails the read; ``latest``: it starts at its end
``endingOffsets``                           batch only: ``latest`` (default) or JSON (-1 latest)
``endingOffsetsByTimestamp``                batch only: each partition's first offset at or after the
                                            timestamp (none: its end) is where it stops (not read)
``endingTimestamp``                         batch only: the same for every partition
``failOnDataLoss``                          ``true`` (default, as Spark's): offsets to be read that are gone
                                            (retention, a deleted topic or partition) fail the read;
                                            ``false``: skip them and read on
``minOffsetsPerTrigger``                    streams only: a micro-batch waits for at least this many new
                                            offsets, or ``maxTriggerDelay`` since the last one
``maxTriggerDelay``                         ``15m`` by default (``10s``, ``500ms``... or ms)
==========================================  ============================================================

As in Spark, ``startingTimestamp`` wins over ``startingOffsetsByTimestamp``, which wins over
``startingOffsets`` (and so for the ending options); the starting options apply when a stream starts
without a checkpoint, a stream restarted from its checkpoint goes on where it stopped, and a partition or
topic that appears while a stream runs is read from its start.

An **intermediate topic** (the controlmsg envelope, the default) is always read from its run's start to
its end of stream: these options are refused there, each with the reason in one line (``subscribe`` of one
topic is taken as ``topic``; ``failOnDataLoss true`` is what such a read does anyway), except
``minOffsetsPerTrigger`` and ``maxTriggerDelay`` (:func:`parse_trigger_hold`): a stream of one may hold its
micro-batches back too, and its watermark and end of stream with them (never past ``maxTriggerDelay``;
the end of stream holds nothing back). That suits a side query whose output may come late, so that it
does not take the cores a query on the critical path needs (the example window stage's late records).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from controlmsg.core.durations import parse_duration

__all__ = [
    "EARLIEST",
    "LATEST",
    "Bound",
    "PartitionRef",
    "Positions",
    "Subscription",
    "parse_positions",
    "parse_subscription",
]

EARLIEST: Final = -2
"""In a JSON of offsets: the partition's log start (Spark's -2)."""
LATEST: Final = -1
"""In a JSON of offsets: the partition's end (Spark's -1)."""
DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000

PartitionRef = tuple[str, int]
"""A topic and one of its partitions, ``(topic, partition)``: a key, not confluent-kafka's ``TopicPartition``
(which carries an offset and more)."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """What a reader reads: ``topics`` (option ``topic`` or ``subscribe``), a ``pattern``
    (``subscribePattern``) or ``assigned`` partitions (``assign``). Exactly one is set."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[PartitionRef, ...] = ()

    @property
    def label(self) -> str:
        """The subscription in a few words, for messages (and :attr:`ReadOptions.topic`)."""
        if self.pattern is not None:
            return self.pattern
        if self.assigned:
            return ",".join(sorted({t for t, _ in self.assigned}))
        return ",".join(self.topics)

    def matches(self, topic: str) -> bool:
        """Whether ``subscribePattern`` takes ``topic`` (its whole name; internal topics never)."""
        return self.pattern is not None and not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None


@dataclass(frozen=True, slots=True)
class Bound:
    """Where a read starts or stops: ``kind`` ``earliest``, ``latest``, ``offsets`` (``offsets``: per
    partition, -2 earliest, -1 latest), ``timestamp`` (one ``timestamp`` for every partition) or
    ``timestamps`` (``offsets`` holds a timestamp per partition); ``option`` names the option it came
    from, for messages."""

    kind: str
    option: str
    offsets: tuple[tuple[str, int, int], ...] = ()
    timestamp: int | None = None

    def per_partition(self) -> dict[PartitionRef, int]:
        return {(t, p): o for t, p, o in self.offsets}


@dataclass(frozen=True, slots=True)
class Positions:
    """The positioning options of a plain read (see the module docstring)."""

    starting: Bound = field(default_factory=lambda: Bound("earliest", "startingOffsets"))
    ending: Bound = field(default_factory=lambda: Bound("latest", "endingOffsets"))
    ending_given: bool = False
    """Whether an ending option was given (a stream refuses them)."""
    timestamp_strategy: str = "error"
    """``startingOffsetsByTimestampStrategy``: ``error`` or ``latest``."""
    fail_on_data_loss: bool = True
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS


_PLAIN_ONLY: Final = {
    "startingoffsets": ("startingOffsets", "starts where its run starts"),
    "startingoffsetsbytimestamp": ("startingOffsetsByTimestamp", "starts where its run starts"),
    "startingtimestamp": ("startingTimestamp", "starts where its run starts"),
    "startingoffsetsbytimestampstrategy": ("startingOffsetsByTimestampStrategy", "starts where its run starts"),
    "endingoffsets": ("endingOffsets", "ends at its run's end of stream"),
    "endingoffsetsbytimestamp": ("endingOffsetsByTimestamp", "ends at its run's end of stream"),
    "endingtimestamp": ("endingTimestamp", "ends at its run's end of stream"),
    "subscribepattern": ("subscribePattern", "is read one topic at a time, its run's bookkeeping per topic: "
                                             "give it as 'topic'"),
    "assign": ("assign", "is read whole, every partition to its end of stream: give it as 'topic'"),
}
_WHOLE_PARTITIONS: Final = ("a reading task here reads whole partitions; use 'maxTasks' or 'partitionsPerTask' to "
                             "choose how many tasks read them")
_REFUSED: Final = {
    "minpartitions": ("minPartitions", _WHOLE_PARTITIONS),
    "maxrecordsperpartition": ("maxRecordsPerPartition", _WHOLE_PARTITIONS),
}
"""Options of ``format("kafka")`` that no read here takes, with the reason and what to do instead."""


def _refuse(name: str, reason: str) -> ValueError:
    return ValueError(f"option {name!r} is not taken by format(\"controlmsg\"): {reason}")


def parse_subscription(opts: Mapping[str, str], plain: bool) -> Subscription:
    """The subscription of a reader from its options (names lower-cased): exactly one of ``topic``,
    ``subscribe``, ``subscribePattern``, ``assign``. Raises ``ValueError`` naming the options."""
    for key, (name, reason) in _REFUSED.items():
        if opts.get(key):
            raise _refuse(name, reason)
    given = [name for name, key in (("topic", "topic"), ("subscribe", "subscribe"),
                                    ("subscribePattern", "subscribepattern"), ("assign", "assign"))
             if opts.get(key)]
    if not given:
        raise ValueError("the controlmsg data source needs the option 'topic'" +
                         (" (or 'subscribe', 'subscribePattern' or 'assign')" if plain else ""))
    if len(given) > 1:
        raise ValueError(f"give one of the options {', '.join(repr(g) for g in given)}: each says what to read")
    if not plain:
        for key, (name, reason) in _PLAIN_ONLY.items():
            if key in ("subscribepattern", "assign") and opts.get(key):
                raise ValueError(f"option {name!r} is for a plain topic (envelope none); an intermediate topic "
                                 f"{reason}")
    if opts.get("subscribepattern"):
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"option 'subscribePattern': {pattern!r} is not a regular expression: {exc}") from None
        return Subscription(pattern=pattern)
    if opts.get("assign"):
        assigned = _json(opts["assign"], "assign")
        if not isinstance(assigned, dict) or not assigned or not all(
                isinstance(t, str) and isinstance(ps, list) and all(type(p) is int and p >= 0 for p in ps)
                for t, ps in assigned.items()):
            raise ValueError(f"option 'assign' must be a JSON object of topics to partition lists, as "
                             f"{{\"topicA\": [0, 1]}}, got {opts['assign']!r}")
        return Subscription(assigned=tuple(sorted({(t, p) for t, ps in assigned.items() for p in ps})))
    text = opts.get("topic") or opts.get("subscribe") or ""
    topics = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not topics:
        raise ValueError(f"option 'subscribe' names no topic: {text!r}")
    if len(topics) > 1 and not plain:
        raise ValueError("several topics are for a plain topic (envelope none); an intermediate topic is read one "
                         "run of one topic at a time: read each with its own 'topic'")
    return Subscription(topics=topics)


def parse_positions(opts: Mapping[str, str], plain: bool) -> Positions | None:
    """The positioning options (names lower-cased) of a plain read; ``None`` for an intermediate topic,
    which refuses them. Raises ``ValueError`` naming the option and what it takes."""
    if not plain:
        for key, (name, reason) in _PLAIN_ONLY.items():
            if opts.get(key):
                raise ValueError(f"option {name!r} is for a plain topic (envelope none); an intermediate topic "
                                 f"{reason}")
        if (opts.get("failondataloss") or "true").strip().lower() != "true":
            raise ValueError("option 'failOnDataLoss' false is for a plain topic (envelope none); an intermediate "
                             "topic cannot skip lost records: a gap breaks its run's bookkeeping, so a loss always "
                             "fails the read")
        return None
    starting = (_timestamp_bound(opts, "startingTimestamp") or _timestamps_bound(opts, "startingOffsetsByTimestamp")
                or _offsets_bound(opts, "startingOffsets", "earliest", ending=False))
    ending = (_timestamp_bound(opts, "endingTimestamp") or _timestamps_bound(opts, "endingOffsetsByTimestamp")
              or _offsets_bound(opts, "endingOffsets", "latest", ending=True))
    strategy = (opts.get("startingoffsetsbytimestampstrategy") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}")
    fail = (opts.get("failondataloss") or "true").strip().lower()
    if fail not in ("true", "false"):
        raise ValueError(f"option 'failOnDataLoss' must be true or false, got {opts.get('failondataloss')!r}")
    min_offsets, delay_ms = parse_trigger_hold(opts)
    return Positions(starting, ending, any(opts.get(k) for k in ("endingtimestamp", "endingoffsetsbytimestamp",
                                                                "endingoffsets")),
                     strategy, fail == "true", min_offsets, delay_ms)


def parse_trigger_hold(opts: Mapping[str, str]) -> tuple[int | None, int]:
    """Options ``minOffsetsPerTrigger`` (``None`` when not given: no micro-batch is held back) and
    ``maxTriggerDelay`` (ms, 15 minutes by default), of a plain or an intermediate stream (names
    lower-cased). Raises ``ValueError`` naming the option and what it takes, and for ``maxTriggerDelay``
    without ``minOffsetsPerTrigger`` (it would do nothing)."""
    minimum = opts.get("minoffsetspertrigger")
    min_offsets = None
    if minimum:
        try:
            min_offsets = int(minimum)
        except ValueError:
            min_offsets = 0
        if min_offsets < 1:
            raise ValueError(f"option 'minOffsetsPerTrigger' must be a whole number of at least 1, got {minimum!r}")
    maximum = opts.get("maxoffsetspertrigger")
    if min_offsets is not None and maximum and maximum.isdigit() and int(maximum) < min_offsets:
        raise ValueError(f"option 'minOffsetsPerTrigger' ({min_offsets}) is above 'maxOffsetsPerTrigger' ({maximum})")
    delay = opts.get("maxtriggerdelay")
    try:
        delay_ms = parse_duration(delay) if delay else DEFAULT_MAX_TRIGGER_DELAY_MS
    except ValueError as exc:
        raise ValueError(f"option 'maxTriggerDelay': {exc}") from None
    if delay and min_offsets is None:  # Spark's connector ignores it then; a setting that does nothing is refused
        raise ValueError("option 'maxTriggerDelay' bounds how long 'minOffsetsPerTrigger' holds a micro-batch back, "
                         "and is given without it: give 'minOffsetsPerTrigger' too, or leave 'maxTriggerDelay' out")
    return min_offsets, delay_ms


def _json(text: str, name: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError(f"option {name!r} must be JSON here, got {text!r}") from None


def _per_partition(text: str, name: str, what: str) -> tuple[tuple[str, int, int], ...]:
    """``{"topicA": {"0": 23}}`` as ``((topic, partition, number), ...)``."""
    given = _json(text, name)
    out = []
    if isinstance(given, dict) and given:
        for topic, parts in given.items():
            if not isinstance(parts, dict) or not parts:
                break
            for p, number in parts.items():
                if not (isinstance(p, str) and p.isdigit()) or type(number) is not int:
                    break
                out.append((topic, int(p), number))
            else:
                continue
            break
        else:
            return tuple(sorted(out))
    raise ValueError(f"option {name!r} must be 'earliest', 'latest' or JSON of {what} per partition, as "
                     f"{{\"topicA\": {{\"0\": 23, \"1\": -1}}}}, got {text!r}")


def _offsets_bound(opts: Mapping[str, str], name: str, default: str, *, ending: bool) -> Bound:
    text = (opts.get(name.lower()) or default).strip()
    if text.lower() in ("earliest", "latest"):
        if ending and text.lower() == "earliest":
            raise ValueError(f"option {name!r} cannot be earliest: a read would end before it starts")
        return Bound(text.lower(), name)
    offsets = _per_partition(text, name, "offsets")
    if ending and any(o == EARLIEST for _, _, o in offsets):
        raise ValueError(f"option {name!r}: -2 (earliest) cannot be an ending offset")
    if any(o < EARLIEST for _, _, o in offsets):
        raise ValueError(f"option {name!r}: an offset is a number from 0, or -2 (earliest) or -1 (latest)")
    return Bound("offsets", name, offsets)


def _timestamp_bound(opts: Mapping[str, str], name: str) -> Bound | None:
    text = (opts.get(name.lower()) or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"option {name!r} must be a timestamp in epoch milliseconds, got {text!r}")
    return Bound("timestamp", name, timestamp=int(text))


def _timestamps_bound(opts: Mapping[str, str], name: str) -> Bound | None:
    text = (opts.get(name.lower()) or "").strip()
    if not text:
        return None
    stamps = _per_partition(text, name, "timestamps (epoch ms)")
    if any(ts < 0 for _, _, ts in stamps):
        raise ValueError(f"option {name!r}: a timestamp is epoch milliseconds, from 0")
    return Bound("timestamps", name, stamps)
