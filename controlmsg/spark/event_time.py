"""Spark's own event-time operators on the reconciled watermark: :func:`with_watermark`.

A streaming DataFrame read with ``format("controlmsg")`` (of an intermediate topic, or of a plain one with
the options ``maxOutOfOrderness`` and ``eventTimeField``, whose watermark the reader makes per partition:
:mod:`controlmsg.spark.reading.plain_watermark`) and a schema that declares
:data:`WATERMARK_COLUMNS` (``_watermark timestamp, _partition_watermark timestamp, _control boolean``;
:func:`with_watermark` called right on the read adds them by itself) carries the topic's reconciled
watermark in two ways: every record's ``_watermark`` (the watermark in force when it was read;
``_partition_watermark`` is its own partition's), and one *watermark row* (``_control`` true, every other
field null) after each micro-batch in which the watermark moved or the stream ended
(``_watermark`` then is :data:`~controlmsg.spark.query_log.END_OF_TIME_MS`).

:func:`with_watermark` turns that into Spark's own watermark on the event-time column, so that
``groupBy(window(ts, ...))`` in append mode, ``applyInPandasWithState`` with event-time timeouts and
``transformWithStateInPandas`` with event-time timers close on the reconciled watermark, not on Spark's
guess (largest event time seen minus a delay). How, in Spark's terms (checked on pyspark 4.2 and 4.3 by
``tests/spark/test_event_time.py``):

1. ``withWatermark`` is put on a copy of ``_watermark`` with no delay, so Spark's ``EventTimeWatermark``
   node tracks ``max(_watermark)``: the reconciled watermark, which never goes back. Watermark rows reach
   the node, so a micro-batch of control messages alone moves Spark's watermark, and Spark's following
   no-data micro-batch closes the windows it allows.
2. One filter above the node drops the watermark rows and the *late* rows: event time below the
   watermark of their own partition where they were read (``_partition_watermark``; every upstream task,
   their own included, had promised to be past them there), or below their ``_watermark`` if that is
   higher. The partition's watermark at a record depends only on what the partition holds before it, not
   on where Spark cut the micro-batches, so a second query over :func:`late_records` finds exactly the
   rows this one drops (a ``_watermark`` alone would differ between two queries). The
   filter is made non-deterministic (``spark_partition_id() >= 0``, always true), and Spark's optimizer
   neither pushes a non-deterministic filter below the watermark node nor combines the user's later
   filters with it: nothing can drop a watermark row before the node counts it. This relies on Spark's
   optimizer rules ``PushPredicateThroughNonJoin`` and ``CombineFilters`` (deterministic predicates only).
3. The event-time column is re-aliased with the metadata ``spark.watermarkDelayMs = 0``, the key Spark's
   analyzer and stateful operators read to find the watermarked column: window aggregations accept append
   mode, evict a window when Spark's watermark passes its end, and their late-row filter compares event
   times with Spark's watermark. This relies on Spark's metadata key (``EventTimeWatermark.delayKey``).

Why nothing is dropped by Spark: Spark's watermark in a micro-batch is the largest ``_watermark`` of the
micro-batches before it, and the reader never gives a record a ``_watermark`` below the watermark at the
start of its micro-batch (nor a ``_partition_watermark`` below the reconciled watermark, the minimum of
the partitions' watermarks); a kept row's event time is at least its ``_watermark``, so it is at least Spark's
watermark, and Spark neither drops it nor finds its window already emitted. Late rows are counted in the
query's progress (``observedMetrics[<metrics_name>]["late_rows"]``, with ``watermark_rows``) and can be
written to a side output by a second query over :func:`late_records`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType, TimestampNTZType, TimestampType

from controlmsg.errors import WatermarkNotFollowed
from controlmsg.spark.session import settle_shared_environment

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["WATERMARK_COLUMNS", "late_records", "observed_counts", "with_watermark"]

WATERMARK_COLUMNS: Final = "_watermark timestamp, _partition_watermark timestamp, _control boolean"
"""The fields :func:`with_watermark` and :func:`late_records` read. They add them by themselves when called
right on the read; a read with steps before them (a ``select``, a ``withColumn``) declares them at the end
of its schema."""

_WATERMARK: Final = "_watermark"
_CONTROL: Final = "_control"
_PARTITION_WATERMARK: Final = "_partition_watermark"
_TRACKED: Final = "_controlmsg_watermark"
_DELAY_KEY: Final = "spark.watermarkDelayMs"  # Spark's EventTimeWatermark.delayKey
_SOURCE: Final = "controlmsg"


def with_watermark(df: DataFrame, event_time: str, *, metrics_name: str = "controlmsg",
                   keep_late: bool = False) -> DataFrame:
    """``df`` with Spark's watermark on ``event_time`` set to the reconciled watermark of the topic.

    ``df`` is a streaming DataFrame of ``format("controlmsg")``; ``event_time`` one of its timestamp columns.
    Its schema declares :data:`WATERMARK_COLUMNS`, or none of them when ``df`` is the read itself
    (``spark.readStream.format("controlmsg")...schema(...).load()`` with nothing after it): then the same read
    with them added is used. The result has ``df``'s columns
    but ``_control``, and only its data rows that are not late (see the module docstring); use it as one
    would use ``df.withWatermark(event_time, ...)``: window aggregations in append mode emit each window
    once, when the reconciled watermark passes its end, and event-time timers fire on it.

    Each micro-batch's counts go to the query's progress as the observed metric ``metrics_name``
    (``late_rows``: rows dropped as late; ``watermark_rows``: watermark rows taken out). Give each
    ``with_watermark`` of one query its own name.

    ``keep_late``: late rows are counted (``late_rows``) but not dropped. For a stage without state (a parse,
    a projection, a filter) that passes its records on: its sink still forwards the reconciled watermark after
    each micro-batch, and the next topic's readers judge a late record against the watermark that came before
    it there, as they would any record. Without it such a stage would need a second query over
    :func:`late_records` to lose nothing. A stateful operator after it drops late rows by Spark's own watermark
    (counted in the query's ``numRowsDroppedByWatermark``): use the default there.

    Raises:
        ValueError: ``df`` lacks ``_watermark`` / ``_control`` or ``event_time``, or their types are not
            timestamp / boolean / timestamp; or ``df`` was made with a step that can drop rows (a filter,
            ``dropna``, a join, an aggregation, a dedup...) between the read and here, since the watermark rows
            would not reach Spark's watermark (call it right after the read; selects and ``withColumn`` are
            fine); or ``df`` declares none of :data:`WATERMARK_COLUMNS` and is not the read itself.
        ValueError: also when the session's ``spark.sql.streaming.multipleWatermarkPolicy`` is ``max``: a query
            over two inputs would run on the faster one's watermark, ahead of the other's reconciled watermark.
        WatermarkNotFollowed: the Spark in use marks a watermarked column with another metadata key than the
            one ``with_watermark`` sets (a Spark version it was not tested with; classic sessions).
    """
    from controlmsg.spark.stage_listener import follow_stages

    settle_shared_environment(df.sparkSession)
    follow_stages(df.sparkSession)
    _check_watermark_policy(df)
    df = _with_watermark_fields(df, event_time)
    _check(df, event_time)
    _check_rows_kept(df)
    _check_delay_key(df)
    tracked = df.withColumn(_TRACKED, F.col(_WATERMARK)).withWatermark(_TRACKED, "0 seconds")
    mark = F.col(_TRACKED)
    control = F.coalesce(F.col(_CONTROL), F.lit(False))
    late = ~control & _late(F.col(event_time), _behind(df, mark))
    observed = tracked.observe(
        metrics_name,
        F.count(F.when(late, True)).alias("late_rows"),
        F.count(F.when(control, True)).alias("watermark_rows"),
    )
    # Every conjunct names the tracked column, and the whole is non-deterministic: Spark pushes none of it,
    # and no later filter of the user's, below the watermark node (see the module docstring).
    dropped = F.lit(False) if keep_late else F.coalesce(late, F.lit(False))
    kept = observed.where((~control | mark.isNull()) & ~dropped & (F.spark_partition_id() >= 0))
    columns = [_as_watermarked(event_time) if name == event_time else F.col(_quoted(name))
               for name in df.columns if name != _CONTROL]
    return kept.select(*columns)


def late_records(df: DataFrame, event_time: str) -> DataFrame:
    """The rows of ``df`` that :func:`with_watermark` drops as late (event time below their partition's
    watermark, see the module docstring), with ``_watermark``: start a second query over it to keep them (a
    side output), e.g. to a Parquet directory or a dead-letter topic. Same arguments and checks as
    :func:`with_watermark`. The two queries cut the topic into different micro-batches, so a record's
    ``_watermark`` can differ between them; ``_partition_watermark`` cannot, so with it in the schema (as in
    :data:`WATERMARK_COLUMNS`) every record is in exactly one of the two outputs."""
    df = _with_watermark_fields(df, event_time)
    _check(df, event_time)
    control = F.coalesce(F.col(_CONTROL), F.lit(False))
    late = ~control & _late(F.col(event_time), _behind(df, F.col(_WATERMARK)))
    return df.where(F.coalesce(late, F.lit(False))).drop(_CONTROL)


def observed_counts(progress: Mapping[str, Any], metrics_name: str = "controlmsg") -> dict[str, int] | None:
    """The counts :func:`with_watermark` observed in one micro-batch (``late_rows``, ``watermark_rows``),
    from one entry of ``query.recentProgress`` (or ``query.lastProgress``); ``None`` when the micro-batch
    has none (no data ran through it). Works with a classic and a Spark Connect query alike: the Connect
    client of pyspark 4.2/4.3 hands the metric over as a row of two fields, ``values`` and ``schema``,
    where ``progress["observedMetrics"][metrics_name]["late_rows"]`` fails."""
    row = (progress.get("observedMetrics") or {}).get(metrics_name)
    if row is None:
        return None
    fields = row.asDict() if hasattr(row, "asDict") else dict(row)
    schema = fields.get("schema")
    if set(fields) == {"values", "schema"} and isinstance(schema, dict):  # the Connect client's shape
        fields = {f["name"]: v for f, v in zip(schema["fields"], fields["values"], strict=True)}
    return {name: int(value) for name, value in fields.items()}


def _behind(df: DataFrame, mark: Column) -> Column:
    """What a row's event time is compared with to call it late: its partition's own watermark when the
    schema has ``_partition_watermark`` (the same for every query over the topic), or ``mark``
    (``_watermark``) when that is higher (an idle upstream task that came back lowers a partition's
    watermark; ``_watermark`` never goes back)."""
    if _PARTITION_WATERMARK in df.columns:
        return F.greatest(mark, F.col(_PARTITION_WATERMARK))
    return mark


def _late(ts: Column, mark: Column) -> Column:
    """True when ``ts`` is below ``mark``; null when either is null (an undefined watermark drops nothing)."""
    return ts < mark


def _as_watermarked(event_time: str) -> Column:
    return F.col(_quoted(event_time)).alias(event_time, metadata={_DELAY_KEY: 0})


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


# What may stand between the read and with_watermark: steps that keep every row (the watermark rows among
# them). Anything else (a filter, dropna, a join, an aggregation, a dedup, a sample, a limit...) can drop the
# watermark rows, and then Spark's watermark never moves: the windows never close, with nothing said.
_KEEPS_ROWS_CLASSIC: Final = frozenset({
    "Project", "SubqueryAlias", "Repartition", "RepartitionByExpression", "RebalancePartitions", "Union",
    "ResolvedHint", "EventTimeWatermark", "CollectMetrics", "View", "StreamingRelationV2", "StreamingRelation",
    "StreamingDataSourceV2Relation", "StreamingDataSourceV2ScanRelation"})
_KEEPS_ROWS_CONNECT: Final = frozenset({
    "Project", "WithColumns", "WithColumnsRenamed", "Drop", "ToDF", "SubqueryAlias", "Repartition",
    "RepartitionByExpression", "Hint", "WithWatermark", "CollectMetrics", "SetOperation", "DataSource", "Read"})


def _row_dropping_steps(df: DataFrame) -> list[str]:
    """The steps of ``df``'s plan that can drop rows (by their Spark names), between its sources and it."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:  # a classic session: the analyzed plan, through the JVM
        found: list[str] = []
        pending = [jdf.queryExecution().analyzed()]
        while pending:
            node = pending.pop()
            name = str(node.nodeName())
            if name not in _KEEPS_ROWS_CLASSIC:
                found.append(name)
                continue
            children = node.children()
            pending.extend(children.apply(i) for i in range(children.size()))
        return found
    plan = getattr(df, "_plan", None)  # a Spark Connect DataFrame: the client's plan
    if plan is None:
        return []
    found, stack = [], [plan]
    while stack:
        node = stack.pop()
        name = type(node).__name__
        if name not in _KEEPS_ROWS_CONNECT:
            found.append(name)
            continue
        stack.extend(child for child in (getattr(node, "_child", None), getattr(node, "other", None))
                     if child is not None)
    return found


def _with_watermark_fields(df: DataFrame, event_time: str) -> DataFrame:
    """``df`` itself when it has a field of :data:`WATERMARK_COLUMNS`; else, when ``df`` is a controlmsg read
    and nothing more (a classic plan's ``StreamingRelationV2``, a Connect client's ``DataSource``), the same
    read with them added to its schema, and for a plain topic (``envelope none``) without the option
    ``eventTimeField`` that option set to ``event_time`` (its watermark per partition is made from that field;
    ``ValueError`` when the read has no ``maxOutOfOrderness``); else ``df`` (:func:`_check` then says what is
    missing)."""
    if any(name in df.columns for name in (_WATERMARK, _PARTITION_WATERMARK, _CONTROL)):
        return df
    found = _bare_read(df)
    if found is None:
        return df
    source, options = found
    keys = {k.lower(): k for k in options}
    if options.get(keys.get("envelope", ""), "").strip().lower() == "none":
        if "maxoutoforderness" not in keys:
            raise ValueError("with_watermark on a plain topic (envelope none) makes its watermark per partition, from "
                             "each partition's largest event time minus a bound the read must give: "
                             ".option('maxOutOfOrderness', '10s') ('0s' when each partition is in time order), and "
                             "idleTimeout for partitions that go quiet")
        if "eventtimefield" not in keys and event_time in df.columns:
            options["eventTimeField"] = event_time
    schema = StructType([*df.schema.fields, StructField(_WATERMARK, TimestampType()),
                         StructField(_PARTITION_WATERMARK, TimestampType()), StructField(_CONTROL, BooleanType())])
    return df.sparkSession.readStream.format(source).options(**options).schema(schema).load()


def _bare_read(df: DataFrame) -> tuple[str, dict[str, str]] | None:
    """The source name and options of ``df`` when it is a ``format("controlmsg")`` stream read and nothing
    more; else ``None``."""
    jdf = getattr(df, "_jdf", None)
    if jdf is not None:
        node = jdf.queryExecution().analyzed()
        if str(node.nodeName()) != "StreamingRelationV2" or str(node.sourceName()) != _SOURCE:
            return None
        return _SOURCE, {str(k): str(v) for k, v in dict(node.extraOptions().asCaseSensitiveMap()).items()}
    plan = getattr(df, "_plan", None)
    if (type(plan).__name__ != "DataSource" or getattr(plan, "_format", None) != _SOURCE
            or not getattr(plan, "_is_streaming", False)):
        return None
    return _SOURCE, dict(getattr(plan, "_options", None) or {})


_POLICY_KEY: Final = "spark.sql.streaming.multipleWatermarkPolicy"


def _check_watermark_policy(df: DataFrame) -> None:
    """Refuse Spark's ``max`` policy: with two watermarked inputs Spark would take the larger watermark, so
    windows would close on the faster input's and drop the slower one's records as late. Spark reads the
    setting when the query starts; the check is here, where the stage is built."""
    policy = df.sparkSession.conf.get(_POLICY_KEY, "min") or "min"
    if policy.strip().lower() != "min":
        raise ValueError(f"{_POLICY_KEY} is {policy!r}: with_watermark needs 'min' (Spark's default), since a "
                         "query over two inputs would run on the faster input's watermark, ahead of the slower "
                         "one's reconciled watermark, and drop its records as late; unset it")


def _check_delay_key(df: DataFrame) -> None:
    """Refuse a Spark whose watermark metadata key is not :data:`_DELAY_KEY` (read from its JVM: a classic
    session only; a Connect client has no JVM, and the run-time check in the sink covers it)."""
    jvm = getattr(df.sparkSession, "_jvm", None)
    if getattr(df, "_jdf", None) is None or jvm is None:
        return
    key = str(jvm.org.apache.spark.sql.catalyst.plans.logical.EventTimeWatermark.delayKey())
    if key != _DELAY_KEY:
        version = df.sparkSession.version
        raise WatermarkNotFollowed(
            f"with_watermark marks the event-time column with the metadata key {_DELAY_KEY!r}, Spark {version} "
            f"reads {key!r} (EventTimeWatermark.delayKey): its window aggregations would not see the reconciled "
            "watermark; run on a Spark version controlmsg is tested with (pyspark 4.2, 4.3) and report this one",
            version)


def _check_rows_kept(df: DataFrame) -> None:
    steps = _row_dropping_steps(df)
    if steps:
        raise ValueError(f"with_watermark must be called right on the readStream.format('controlmsg') DataFrame: "
                         f"this one was made with {', '.join(sorted(set(steps)))}, which can drop the watermark rows "
                         "(every field but _watermark is null), and then Spark's watermark never moves and no window "
                         "closes; call with_watermark(df, ...) right after .load() (selects and withColumn are "
                         "fine) and filter, join or dropna its result")


def _check(df: DataFrame, event_time: str) -> None:
    fields = {f.name: f.dataType for f in df.schema.fields}
    missing = [name for name in (_WATERMARK, _CONTROL) if name not in fields]
    if missing:
        raise ValueError(f"with_watermark needs the fields {missing} of a controlmsg stream: call it right on "
                         "spark.readStream.format('controlmsg')...load(), which adds them, or read with a schema "
                         f"that ends with '{WATERMARK_COLUMNS}' (controlmsg.spark.WATERMARK_COLUMNS)")
    if not isinstance(fields[_WATERMARK], TimestampType) or not isinstance(fields[_CONTROL], BooleanType):
        raise ValueError(f"with_watermark needs '{WATERMARK_COLUMNS}', the schema has '_watermark "
                         f"{fields[_WATERMARK].simpleString()}, _control {fields[_CONTROL].simpleString()}'")
    if event_time not in fields:
        raise ValueError(f"with_watermark: no column {event_time!r} in {sorted(fields)}")
    if not isinstance(fields[event_time], TimestampType | TimestampNTZType):
        raise ValueError(f"with_watermark: the event-time column {event_time!r} is "
                         f"{fields[event_time].simpleString()}; Spark's event-time operators need a timestamp")
