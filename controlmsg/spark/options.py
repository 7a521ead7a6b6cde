"""The options of the ``controlmsg`` data source, parsed and checked once. Pure Python (no pyspark).

Every option name is case-insensitive, as in Spark. The same names hold for ``read``, ``readStream``,
``write`` and ``writeStream``:

==========================  ===================================================================
``topic``                   the intermediate topic (required)
``runId``                   the run written, or followed by a reader (required; not read by a
                            reader of a plain topic)
``kafka.<setting>``         any librdkafka setting, passed to every client untouched
                            (``kafka.bootstrap.servers`` is required; security settings too)
``timeout``                 seconds; readers: fail if the stream has not ended by then; writers:
                            how long to wait for the topic and the cluster
==========================  ===================================================================

Writers also take ``key`` (a column), ``eventTime`` (a column: a timestamp, a date or epoch ms),
``allowedLateness`` (``10s``, ``500ms``... or ms; default 0), ``partitions`` (of a topic created
because it is missing; default 4), ``replicationFactor`` (of such a topic; default: the cluster's
``default.replication.factor``), ``topicConfig.<name>`` (a topic config of such a topic, e.g.
``topicConfig.min.insync.replicas``),
``job`` (the first part of every task name; default ``spark``), ``transactionTimeoutMs`` (default 600000: a
write task must finish within it), ``runTag`` (how each record names its run, so that readers of a topic
holding several runs take only theirs: ``envelope``, the default, in the record's value, wire format 2, which
readers of format 1 refuse; ``headers``, in the ``controlmsg-run`` and ``controlmsg-task`` headers, wire
format 1, which earlier readers read too, at about 0.7 of the write rate; ``none``, not at all, for a topic of
one run; docs/PROTOCOL.md, "Wire format 2"), ``dataHeaders`` (the earlier spelling: ``true`` is ``runTag headers``,
``false`` is ``runTag none``), ``value`` (a string or binary column whose bytes are each record's
payload as they are, e.g. ``to_json(struct(*))`` or ``to_avro(...)`` made in the JVM, as ``format("kafka")``
takes its ``value`` column; default: the row's columns as one JSON object, made in Python), ``commitRows`` (a
batch write task commits about every this many rows, so that readers get its records as it writes; a retry
resumes after what was committed, and fails rather than write twice when its input is not the same rows in the
same order: see :mod:`controlmsg.spark.writing.chunks`; default: one transaction per task). A stream writer reads its
query's offset log under ``checkpointLocation`` (the option Spark passes to the sink) for the stage's watermark and the
end of its input (see :mod:`controlmsg.spark.writing`); it must be on the driver's local file system, or the query is
refused when it starts unless ``stageProgress`` is ``driver`` (the driver program follows the query with
``controlmsg.spark.await_stage``, which writes the stage's watermark and end of stream from the query's
progress: for a checkpoint anywhere) or ``eventTime`` (the weaker rule: the largest ``eventTime`` minus
``allowedLateness``, and an end of stream only by ``end_stream``).

Readers also take ``partitionsPerTask`` and ``maxTasks`` (how partitions are grouped into reading tasks:
given either, groups of ``partitionsPerTask`` (default 1) partitions, fewer tasks than ``maxTasks``; given
neither, groups by the records the partitions hold, see :mod:`controlmsg.spark.reading.planning`), ``batchRows``
(rows per Arrow batch, default 10000) and, streaming only, ``maxOffsetsPerTrigger`` (at most this many records per
micro-batch) and ``maxScanMs`` (how long the driver scans for one micro-batch at most, default 2000; a scan
ends earlier at what was readable when it began).

``logPhases true`` (readers and writers, streaming): one line per phase of each micro-batch to stderr (the
driver's scan and commit, each task), to see where a micro-batch's time goes (:mod:`controlmsg.spark.phases`).

``envelope none`` reads a **plain** topic, whose records any producer wrote (a JSON object, or any bytes
read as ``value``, per record: no type byte, no control messages), as ``format("kafka")`` does, with its
options (:mod:`controlmsg.spark.positions`): ``subscribe`` (several topics), ``subscribePattern``,
``assign``, ``startingOffsets`` (``earliest``, the default, ``latest`` or JSON), ``startingTimestamp``,
``startingOffsetsByTimestamp`` (``startingOffsetsByTimestampStrategy``), for a batch ``endingOffsets``,
``endingTimestamp``, ``endingOffsetsByTimestamp``, ``failOnDataLoss`` (default true), for a stream
``minOffsetsPerTrigger`` and ``maxTriggerDelay``; an ``availableNow`` query stops at the offsets there when
it starts; with ``availableNowEnds true`` that is the end of the input, which a ``controlmsg`` stream writer
passes on as the end of its stream. See :mod:`controlmsg.spark.reading.plain_readers`. An intermediate topic refuses
these (``subscribe`` of one topic is its ``topic``). ``includeHeaders true``: a read without a schema has the
column ``headers`` (:mod:`controlmsg.spark.read_schema` lists the columns a declared schema can ask for).

Bad records (a value that is not JSON or not a JSON object, a field that does not fit its type, a key or
raw value that is not UTF-8 but read as a string), as Spark's JSON and CSV sources name their modes:
``mode`` ``FAILFAST`` (the default: the task fails naming topic, partition, offset and reason),
``PERMISSIVE`` (the row is kept; the schema must declare the string or binary column
``columnNameOfCorruptRecord``, default ``_corrupt_record``, which holds the record's value) or
``DROPMALFORMED`` (the row is left out and the record written to ``deadLetterTopic``, which this mode
requires; ``deadLetterTopic`` alone means this mode). See :mod:`controlmsg.spark.reading.bad_records`.

A plain stream read for :func:`~controlmsg.spark.with_watermark` (its schema declares ``_watermark``) makes
its watermark per partition, as Flink's Kafka source does (:mod:`controlmsg.spark.reading.plain_watermark`):
``eventTimeField`` (the timestamp field of the schema that holds each record's event time, or the record's
own ``timestamp`` / ``_timestamp``; ``with_watermark`` called right on the read gives its column),
``maxOutOfOrderness`` (required: how far behind its partition's largest event time a record may come,
``0s``, ``10s``, ``5m``...; the watermark is each partition's largest event time minus it, the minimum over
the partitions), ``idleTimeout`` (a partition that gives no record for so long stops holding the
watermark back until it gives one again; default: never) and ``maxWatermarkDrift`` (watermark alignment: a
partition whose own watermark runs more than this past the read's is read no further until it catches up;
default: none). Refused on an intermediate topic and a batch read.

``kafkaConfig`` names a client properties file (Java's format, as Kafka's tools read it) read on the driver,
under the ``kafka.*`` options: secrets can stay out of the query's options. Settings may be given in the
Java client's names as ``format("kafka")`` takes them (``kafka.sasl.jaas.config``,
``kafka.ssl.truststore.location``, ...; docs/SECURITY.md has the table); the ones that would break the
guarantees (``kafka.isolation.level``, ``kafka.enable.auto.commit``, ``kafka.transactional.id``,
``kafka.enable.idempotence=false``) are refused. ``bootstrapServers`` is accepted as an
alias of ``kafka.bootstrap.servers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from controlmsg.core.durations import parse_duration
from controlmsg.spark.positions import (
    Positions,
    Subscription,
    parse_positions,
    parse_subscription,
    parse_trigger_hold,
)

__all__ = [
    "DEFAULT_CORRUPT_COLUMN",
    "DEFAULT_PARTITIONS",
    "RUN_TAG_ENVELOPE",
    "RUN_TAG_HEADERS",
    "RUN_TAG_NONE",
    "STAGE_PROGRESS_DRIVER",
    "STAGE_PROGRESS_EVENT_TIME",
    "STAGE_PROGRESS_OFFSET_LOG",
    "BadRecordMode",
    "ReadOptions",
    "WriteOptions",
    "kafka_settings",
    "lower_keys",
]

DEFAULT_PARTITIONS: Final = 4
STAGE_PROGRESS_OFFSET_LOG: Final = "offsetLog"
"""``stageProgress offsetLog`` (the default): the stage's watermark and the end of its input from the query's
offset log, under a ``checkpointLocation`` on the driver's local file system (:mod:`controlmsg.spark.query_log`)."""
STAGE_PROGRESS_DRIVER: Final = "driver"
"""``stageProgress driver``: for a checkpoint anywhere; the driver program follows the query's progress with
:func:`controlmsg.spark.await_stage`, which writes the stage's watermark and its end of stream
(:mod:`controlmsg.spark.stage`); the sink's commit writes no control message."""
STAGE_PROGRESS_EVENT_TIME: Final = "eventTime"
"""``stageProgress eventTime``: the weaker rule, for a checkpoint elsewhere: the watermark is the largest
``eventTime`` written minus ``allowedLateness``, and the stream ends only by ``end_stream``."""
DEFAULT_CORRUPT_COLUMN: Final = "_corrupt_record"
# librdkafka stops fetching a partition for fetch.queue.backoff.ms (default 1 s) whenever its local queue
# is past queued.min.messages; a reader that drains fast then waits most of the time (docs/PERFORMANCE.md,
# "The reader's start and fetch").
_CONSUMER_DEFAULTS: Final = {"fetch.queue.backoff.ms": "10"}
_KAFKA: Final = "kafka."
_TOPIC_CONFIG: Final = "topicconfig."


OPTION_NAMES: Final = (
    # both directions
    "topic", "runId", "timeout", "kafkaConfig", "bootstrapServers", "logPhases",
    # readers
    "partitionsPerTask", "maxTasks", "batchRows", "maxOffsetsPerTrigger", "maxScanMs", "mode",
    "columnNameOfCorruptRecord", "deadLetterTopic", "envelope", "includeHeaders", "availableNowEnds",
    "subscribe", "subscribePattern", "assign", "startingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingOffsets", "endingTimestamp",
    "endingOffsetsByTimestamp", "failOnDataLoss", "minOffsetsPerTrigger", "maxTriggerDelay",
    "eventTimeField", "maxOutOfOrderness", "idleTimeout", "maxWatermarkDrift",  # a plain stream's watermark
    "groupId",  # a stream's consumed offsets committed to a consumer group, for lag tools
    "minPartitions", "maxRecordsPerPartition",  # format("kafka")'s, refused with their reason
    # format("kafka")'s that have nothing to do here (docs/SPARK.md): accepted, so its options carry over
    "groupIdPrefix", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "kafkaConsumer.pollTimeoutMs",
    # writers
    "key", "value", "eventTime", "allowedLateness", "partitions", "replicationFactor", "job",
    "transactionTimeoutMs", "runTag", "dataHeaders", "commitRows", "stageProgress", "checkpointLocation",
)
"""Every option name the data source knows (besides the prefixes ``kafka.`` and ``topicConfig.``), as the
docs spell them. A read takes a writer's options and the reverse (one map may serve both); any other name
is refused by :func:`check_names`, since a misspelt option would otherwise silently mean its default."""
_KNOWN: Final = {name.lower(): name for name in OPTION_NAMES}


def check_names(options: Mapping[str, str]) -> None:
    """Raises ``ValueError`` for the first option whose name the data source does not know, with the
    names close to it: ``startingOffset`` would otherwise read from the earliest offsets without a word.
    ``path`` (what ``load(path)`` and ``save(path)`` pass) is refused with what to write instead."""
    import difflib

    for name in options:
        key = name.lower()
        if key in _KNOWN or (key.startswith(_KAFKA) and len(key) > len(_KAFKA)) or (
                key.startswith(_TOPIC_CONFIG) and len(key) > len(_TOPIC_CONFIG)):
            continue
        if key == "path":
            raise ValueError(f"format(\"controlmsg\") takes no path (load() and save() were given "
                             f"{options[name]!r}): name the topic with the option 'topic'")
        close = difflib.get_close_matches(key, list(_KNOWN), n=3, cutoff=0.75)
        hint = (f"; did you mean {' or '.join(repr(_KNOWN[c]) for c in close)}?" if close
                else "; docs/SPARK.md lists the options")
        raise ValueError(f"option {name!r} is not an option of format(\"controlmsg\"){hint} (a Kafka client "
                         "setting is given as 'kafka.<setting>')")


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Option names lower-cased (Spark's options are case-insensitive)."""
    return {k.lower(): v for k, v in options.items()}


def kafka_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The client settings in ``options``: those of the properties file ``kafkaConfig`` (read here, on the
    driver, by Java's rules), overridden by every ``kafka.<setting>`` with the prefix removed (nothing is
    filtered out), plus the alias ``bootstrapServers``. They are checked here by
    :func:`controlmsg.kafka.settings.normalise` (the settings that would break the guarantees refused, the
    Java client's names translated, its stores converted) and returned as given: each client translates
    them again where it runs (:func:`~controlmsg.kafka.settings.for_client`), so that a truststore is read
    on each executor from its own ``ssl.truststore.location``, as ``format("kafka")`` reads it. Raises
    ``ValueError`` without bootstrap servers, :class:`~controlmsg.errors.ConfigError` for an unreadable
    file or a refused setting (named, with the option it came from)."""
    from controlmsg.kafka.settings import normalise, read_properties_lines

    opts = lower_keys(options)
    config: dict[str, str] = {}
    origin: dict[str, str] = {}
    if opts.get("kafkaconfig"):
        config, lines = read_properties_lines(opts["kafkaconfig"])
        origin = {key: f"kafkaConfig {opts['kafkaconfig']}:{line}" for key, line in lines.items()}
    for key, value in opts.items():
        if key.startswith(_KAFKA):
            config[key[len(_KAFKA):]] = value
            origin[key[len(_KAFKA):]] = f"option {key}"
    if "bootstrapservers" in opts:
        config.setdefault("bootstrap.servers", opts["bootstrapservers"])
    if not config.get("bootstrap.servers"):
        raise ValueError("the controlmsg data source needs the option 'kafka.bootstrap.servers'")
    normalise(config, origin)
    return config


def _run_followed(opts: Mapping[str, str]) -> str:
    """A reader of an intermediate topic follows one run: ``runId``. Missing, it is most often a read
    written for ``format("kafka")``, whose topics any producer writes: the error says so."""
    run = opts.get("runid")
    if not run:
        raise ValueError("the controlmsg data source needs the option 'runId' to read an intermediate topic (the run "
                         "it follows to its end of stream); a topic that any producer writes, as format('kafka') "
                         "reads, is read with the option envelope none")
    return run


def _need(opts: Mapping[str, str], name: str) -> str:
    value = opts.get(name.lower())
    if not value:
        raise ValueError(f"the controlmsg data source needs the option {name!r}")
    return value


def _positive_int(opts: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = opts.get(name.lower())
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"option {name!r} must be at least 1, got {value}")
    return value


def _timeout(opts: Mapping[str, str]) -> float | None:
    text = opts.get("timeout")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"option 'timeout' must be a number of seconds, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"option 'timeout' must be above 0, got {text!r}")
    return value


def _envelope(opts: Mapping[str, str]) -> bool:
    """Whether option ``envelope`` says the topic holds plain records (``none``) rather than envelopes."""
    return _choice(opts, "envelope", ("controlmsg", "none"), "controlmsg") == "none"


def _choice(opts: Mapping[str, str], name: str, values: tuple[str, ...], default: str) -> str:
    text = (opts.get(name.lower()) or default).strip().lower()
    if text not in values:
        raise ValueError(f"option {name!r} must be one of {', '.join(values)}, got {opts.get(name.lower())!r}")
    return text


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    text = opts.get(name.lower())
    if text is None or text == "":
        return default
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r} must be true or false, got {text!r}")


RUN_TAG_ENVELOPE: Final = "envelope"
RUN_TAG_HEADERS: Final = "headers"
RUN_TAG_NONE: Final = "none"


def _run_tag(opts: Mapping[str, str]) -> str:
    """Option ``runTag``, or its earlier spelling ``dataHeaders`` (``true``: headers, ``false``: none); both
    given is refused, since one would silently override the other."""
    if opts.get("dataheaders", "") != "":
        if opts.get("runtag"):
            raise ValueError("options 'runTag' and 'dataHeaders' both given: 'dataHeaders' is the earlier spelling "
                             "of 'runTag' (true: headers, false: none); keep one")
        return RUN_TAG_HEADERS if _bool(opts, "dataHeaders", True) else RUN_TAG_NONE
    return _choice(opts, "runTag", (RUN_TAG_ENVELOPE, RUN_TAG_HEADERS, RUN_TAG_NONE), RUN_TAG_ENVELOPE)


_EVENT_TIME_OPTIONS: Final = ("eventTimeField", "maxOutOfOrderness", "idleTimeout", "maxWatermarkDrift")


def _duration_ms(opts: Mapping[str, str], name: str, *, allow_zero: bool) -> int | None:
    text = opts.get(name.lower())
    if text is None or text == "":
        return None
    try:
        return parse_duration(text, allow_zero=allow_zero)
    except ValueError as exc:
        raise ValueError(f"option {name!r}: {exc}") from None


def _event_time(opts: Mapping[str, str], plain: bool) -> tuple[str | None, int | None, int | None, int | None]:
    """A plain stream's watermark options: ``eventTimeField``, ``maxOutOfOrderness`` (ms), ``idleTimeout`` (ms)
    and ``maxWatermarkDrift`` (ms), checked together: an intermediate topic's watermark comes from its upstream
    tasks, and a field, an idle timeout or a drift without the bound defines no watermark."""
    given = [name for name in _EVENT_TIME_OPTIONS if opts.get(name.lower())]
    if not given:
        return None, None, None, None
    if not plain:
        raise ValueError(f"option {given[0]!r} makes the watermark of a plain topic (envelope none) from its records' "
                         "event times; an intermediate topic's watermark comes from its upstream tasks")
    bound = _duration_ms(opts, "maxOutOfOrderness", allow_zero=True)
    if bound is None:
        raise ValueError(f"option {given[0]!r} needs the option 'maxOutOfOrderness': how far behind its partition's "
                         "largest event time a record may come ('0s', '10s', '5m'...), the bound of the watermark")
    return (opts.get("eventtimefield") or None, bound, _duration_ms(opts, "idleTimeout", allow_zero=False),
            _duration_ms(opts, "maxWatermarkDrift", allow_zero=True))


def _stage_progress(opts: Mapping[str, str]) -> str:
    """Option ``stageProgress``: ``offsetLog`` (default), ``driver`` or ``eventTime``, any case; ``eventTime`` needs the
    option ``eventTime`` (a rule on event times without a column to take them from would write no watermark)."""
    text = opts.get("stageprogress") or STAGE_PROGRESS_OFFSET_LOG
    for rule in (STAGE_PROGRESS_OFFSET_LOG, STAGE_PROGRESS_DRIVER, STAGE_PROGRESS_EVENT_TIME):
        if text.lower() == rule.lower():
            if rule == STAGE_PROGRESS_EVENT_TIME and not opts.get("eventtime"):
                raise ValueError("option 'stageProgress' eventTime takes the watermark from the largest value of the "
                                 "option 'eventTime' column: name that column")
            return rule
    raise ValueError(f"option 'stageProgress' must be {STAGE_PROGRESS_OFFSET_LOG}, {STAGE_PROGRESS_DRIVER} or "
                     f"{STAGE_PROGRESS_EVENT_TIME}, got {text!r}")


class BadRecordMode(Enum):
    """What a reader does with a record that does not fit the DataFrame (option ``mode``)."""

    FAILFAST = "FAILFAST"
    """Fail the task with an error naming topic, partition, offset and reason."""
    PERMISSIVE = "PERMISSIVE"
    """Keep the row: fields that cannot be read are null, the corrupt-record column holds the value."""
    DROPMALFORMED = "DROPMALFORMED"
    """Leave the row out and write the record to the dead-letter topic."""


def _bad_record_mode(opts: Mapping[str, str]) -> tuple[BadRecordMode, str | None]:
    """``mode`` and ``deadLetterTopic``, checked together: a dropped record must land somewhere."""
    dead_letters = opts.get("deadlettertopic") or None
    text = opts.get("mode")
    if not text:
        mode = BadRecordMode.DROPMALFORMED if dead_letters else BadRecordMode.FAILFAST
    else:
        try:
            mode = BadRecordMode(text.strip().upper())
        except ValueError:
            valid = ", ".join(m.value for m in BadRecordMode)
            raise ValueError(f"option 'mode' must be one of {valid} (any case), got {text!r}") from None
    if mode is BadRecordMode.DROPMALFORMED and dead_letters is None:
        raise ValueError("mode DROPMALFORMED leaves bad records out of the DataFrame: give the option "
                         "'deadLetterTopic' (an existing topic) to keep them there, or use mode PERMISSIVE")
    if dead_letters is not None and mode is not BadRecordMode.DROPMALFORMED:
        raise ValueError(f"the option 'deadLetterTopic' leaves bad records out of the DataFrame (mode "
                         f"DROPMALFORMED); it cannot be combined with mode {mode.value}")
    return mode, dead_letters


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """A reader's options. ``config`` holds the consumer settings (defaults first, then ``kafka.*``)."""

    topic: str
    run_id: str
    config: tuple[tuple[str, str], ...]
    timeout: float | None
    partitions_per_task: int | None
    """``None``: not given; then, and without ``maxTasks``, partitions are grouped by the records they hold
    (:func:`controlmsg.spark.reading.planning.task_groups`)."""
    max_tasks: int | None
    batch_rows: int
    max_offsets_per_trigger: int | None
    max_scan_ms: int
    mode: BadRecordMode = BadRecordMode.FAILFAST
    corrupt_column: str = DEFAULT_CORRUPT_COLUMN
    dead_letter_topic: str | None = None
    plain: bool = False
    """Option ``envelope none``: the topic holds plain records, not controlmsg envelopes
    (:mod:`controlmsg.spark.reading.plain_readers`)."""
    subscription: Subscription = field(default_factory=Subscription)
    """What is read: ``topic``, or for a plain topic ``subscribe`` (several), ``subscribePattern`` or
    ``assign`` (:mod:`controlmsg.spark.positions`); ``topic`` above is its :attr:`~Subscription.label`."""
    positions: Positions | None = None
    """A plain read's starting and ending options, ``failOnDataLoss``, ``minOffsetsPerTrigger`` and
    ``maxTriggerDelay`` (:mod:`controlmsg.spark.positions`); ``None`` for an intermediate topic."""
    include_headers: bool = False
    """Option ``includeHeaders``: a read without a schema has the column ``headers`` too."""
    available_now_ends: bool = False
    """Option ``availableNowEnds``: a plain stream's input ends where an ``availableNow`` query stops."""
    log_phases: bool = False
    """Option ``logPhases``: a line per phase of each micro-batch (:mod:`controlmsg.spark.phases`)."""
    event_time_field: str | None = None
    """Option ``eventTimeField``: the field whose value is a plain record's event time (a plain stream's
    watermark, :mod:`controlmsg.spark.reading.plain_watermark`)."""
    max_out_of_orderness_ms: int | None = None
    """Option ``maxOutOfOrderness`` (ms): given, a plain stream makes its watermark per partition."""
    idle_timeout_ms: int | None = None
    """Option ``idleTimeout`` (ms): a partition without records for so long stops holding the watermark back."""
    max_watermark_drift_ms: int | None = None
    """Option ``maxWatermarkDrift`` (ms): watermark alignment, a partition whose own watermark runs more than
    this past the read's is read no further until the read's catches up."""
    trigger_hold: tuple[int, int] | None = None
    """An intermediate stream's ``minOffsetsPerTrigger`` and ``maxTriggerDelay`` (ms), when the first is given:
    a micro-batch waits for that many new offsets, or that long since the last one, or the end of stream
    (:func:`controlmsg.spark.positions.parse_trigger_hold`). A plain read's are in :attr:`positions`."""
    group_id: str | None = None
    """Option ``groupId``: a stream read commits the offsets of each micro-batch it has consumed to this
    consumer group, for lag tools (:mod:`controlmsg.kafka.group_offsets`); nothing reads from it."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Raises ``ValueError`` naming the option that is missing, wrong (and the values it takes) or
        unknown (:func:`check_names`)."""
        check_names(options)
        opts = lower_keys(options)
        config = {**_CONSUMER_DEFAULTS, **kafka_settings(opts)}
        mode, dead_letters = _bad_record_mode(opts)
        plain = _envelope(opts)
        subscription = parse_subscription(opts, plain)
        field_name, bound_ms, idle_ms, drift_ms = _event_time(opts, plain)
        return cls(
            topic=subscription.label,
            run_id=(opts.get("runid") or "") if plain else _run_followed(opts),
            config=tuple(sorted(config.items())),
            timeout=_timeout(opts),
            partitions_per_task=_positive_int(opts, "partitionsPerTask", None),
            max_tasks=_positive_int(opts, "maxTasks", None),
            batch_rows=_positive_int(opts, "batchRows", 10_000) or 10_000,
            max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger", None),
            max_scan_ms=_positive_int(opts, "maxScanMs", 2000) or 2000,
            mode=mode,
            corrupt_column=opts.get("columnnameofcorruptrecord") or DEFAULT_CORRUPT_COLUMN,
            dead_letter_topic=dead_letters,
            plain=plain,
            subscription=subscription,
            positions=parse_positions(opts, plain),
            include_headers=_bool(opts, "includeHeaders", False),
            available_now_ends=_bool(opts, "availableNowEnds", False),
            log_phases=_bool(opts, "logPhases", False),
            event_time_field=field_name,
            max_out_of_orderness_ms=bound_ms,
            idle_timeout_ms=idle_ms,
            max_watermark_drift_ms=drift_ms,
            trigger_hold=None if plain else _trigger_hold(opts),
            group_id=opts.get("groupid") or None,
        )


def _trigger_hold(opts: Mapping[str, str]) -> tuple[int, int] | None:
    min_offsets, delay_ms = parse_trigger_hold(opts)
    return None if min_offsets is None else (min_offsets, delay_ms)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """A writer's options. ``config`` holds the producer settings (``kafka.*``)."""

    topic: str
    run_id: str
    config: tuple[tuple[str, str], ...]
    timeout: float
    key: str | None
    event_time: str | None
    allowed_lateness_ms: int
    partitions: int
    replication_factor: int
    topic_config: tuple[tuple[str, str], ...]
    job: str
    transaction_timeout_ms: int
    run_tag: str
    """Option ``runTag``: :data:`RUN_TAG_ENVELOPE`, :data:`RUN_TAG_HEADERS` or :data:`RUN_TAG_NONE`."""
    value: str | None = None
    checkpoint: str | None = None
    commit_rows: int | None = None
    """Option ``commitRows``: a batch write task commits about every this many rows
    (:mod:`controlmsg.spark.writing.chunks`); ``None``: one transaction per task."""
    stage_progress: str = STAGE_PROGRESS_OFFSET_LOG
    """Where a stream writer learns the stage's watermark and the end of its input:
    :data:`STAGE_PROGRESS_OFFSET_LOG`, :data:`STAGE_PROGRESS_DRIVER` or :data:`STAGE_PROGRESS_EVENT_TIME`
    (option ``stageProgress``)."""
    log_phases: bool = False
    """Option ``logPhases``: a line per write task and per driver commit (:mod:`controlmsg.spark.phases`)."""

    @property
    def data_headers(self) -> bool:
        """Whether each record names its run and task in headers (``runTag headers``)."""
        return self.run_tag == RUN_TAG_HEADERS

    @property
    def run_in_envelope(self) -> bool:
        """Whether each record names its run in its value (``runTag envelope``, wire format 2)."""
        return self.run_tag == RUN_TAG_ENVELOPE

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Raises ``ValueError`` naming the option that is missing, wrong or unknown (:func:`check_names`)."""
        check_names(options)
        opts = lower_keys(options)
        lateness = opts.get("allowedlateness")
        try:
            lateness_ms = parse_duration(lateness, allow_zero=True) if lateness else 0
        except ValueError as exc:
            raise ValueError(f"option 'allowedLateness': {exc}") from None
        return cls(
            topic=_need(opts, "topic"),
            run_id=_need(opts, "runId"),
            config=tuple(sorted(kafka_settings(opts).items())),
            timeout=_timeout(opts) or 60.0,
            key=opts.get("key") or None,
            event_time=opts.get("eventtime") or None,
            allowed_lateness_ms=lateness_ms,
            partitions=_positive_int(opts, "partitions", DEFAULT_PARTITIONS) or DEFAULT_PARTITIONS,
            replication_factor=_positive_int(opts, "replicationFactor", None) or -1,
            topic_config=tuple(sorted((k[len(_TOPIC_CONFIG):], v) for k, v in opts.items()
                                      if k.startswith(_TOPIC_CONFIG) and len(k) > len(_TOPIC_CONFIG))),
            job=opts.get("job") or "spark",
            transaction_timeout_ms=_positive_int(opts, "transactionTimeoutMs", 600_000) or 600_000,
            run_tag=_run_tag(opts),
            value=opts.get("value") or None,
            checkpoint=opts.get("checkpointlocation") or None,
            commit_rows=_positive_int(opts, "commitRows", None),
            stage_progress=_stage_progress(opts),
            log_phases=_bool(opts, "logPhases", False),
        )
