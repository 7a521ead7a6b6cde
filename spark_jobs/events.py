"""Files in and out, event-time parsing, durations, and the windowed aggregation's plain-Spark oracle.

Formats go by file extension: ``.csv`` (header row, inferred types, ``null_value`` read as null),
``.json``/``.jsonl``/``.ndjson`` (JSON lines), ``.parquet``.

Event time may be an ISO-8601 string with a zone (``2026-01-01T10:00:00+02:00``, ``...Z``), a
``YYYY-MM-DD HH:MM:SS`` string taken as UTC, or an integer of epoch milliseconds (a number column, or a
string of digits). Anything else is unparseable: such rows, and rows with a null key, are *rejected*:
counted and written to a rejects file with the reason, never dropped silently.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from controlmsg.core.durations import parse_duration

__all__ = [
    "EVENT_MS",
    "ddl",
    "is_fractional",
    "iso_utc",
    "json_columns",
    "numeric_value",
    "parse_duration",
    "read_parsed",
    "read_table",
    "split_rejects",
    "split_rejects_observed",
    "top_column",
    "typed_columns",
    "windowed_oracle",
    "write_table",
    "write_tasks",
]

EVENT_MS = "__event_ms"
"""The column holding the parsed event time, epoch milliseconds (long)."""

REJECT_REASON = "__reject_reason"



def _format(path: str) -> str:
    lower = path.lower().rstrip("/")
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".json", ".jsonl", ".ndjson")):
        return "json"
    if lower.endswith(".parquet"):
        return "parquet"
    raise ValueError(f"{path}: unknown file type; use .csv, .json, .jsonl, .ndjson or .parquet")


def read_table(spark: SparkSession, path: str, null_value: str | None = None) -> DataFrame:
    """Read a CSV, JSON lines or Parquet file (or directory of them) by extension."""
    fmt = _format(path)
    if fmt == "csv":
        reader = spark.read.option("header", "true").option("inferSchema", "true").option("mode", "PERMISSIVE")
        if null_value is not None:
            reader = reader.option("nullValue", null_value)
        return reader.csv(path)
    if fmt == "json":
        return spark.read.json(path)
    return spark.read.parquet(path)


def write_table(df: DataFrame, path: str) -> None:
    """Write ``df`` as ONE file at ``path`` (format by extension), replacing it.

    Spark writes a directory of part files; this writes through one task into a temporary directory
    beside ``path`` and moves the single part file into place, so users get the file they named.
    """
    fmt = _format(path)
    target = Path(path)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    one = df.coalesce(1)
    writer = one.write.mode("overwrite")
    if fmt == "csv":
        writer.option("header", "true").csv(str(tmp))
    elif fmt == "json":
        writer.json(str(tmp))
    else:
        writer.parquet(str(tmp))
    suffix = {"csv": ".csv", "json": ".json", "parquet": ".parquet"}[fmt]
    parts = sorted(p for p in tmp.iterdir() if p.name.startswith("part-") and p.name.endswith(suffix))
    if len(parts) != 1:
        raise RuntimeError(f"expected one part file in {tmp}, found {[p.name for p in parts]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        shutil.rmtree(target)
    parts[0].replace(target)
    shutil.rmtree(tmp, ignore_errors=True)


def event_time_ms(df: DataFrame, column: str) -> Column:
    """The event time of ``column`` in epoch ms (long), or null when it cannot be parsed."""
    dtype = df.schema[column].dataType
    col = top_column(column)
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return F.unix_millis(col.cast("timestamp"))
    if isinstance(dtype, T.IntegralType):
        return col.cast("long")
    if isinstance(dtype, T.DecimalType | T.DoubleType | T.FloatType):
        # Only whole numbers are epoch milliseconds.
        return F.when(col == F.floor(col), col.cast("long"))
    text = F.trim(col.cast("string"))
    quoted = column.replace("`", "``")
    iso = F.expr(f"try_cast(trim(`{quoted}`) AS TIMESTAMP)")
    return (
        F.when(text.rlike(r"^-?[0-9]+$"), F.expr(f"try_cast(trim(`{quoted}`) AS BIGINT)"))
        .when(text.rlike(r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}"), F.unix_millis(iso))
    )


def split_rejects(df: DataFrame, key: str, event_time: str) -> tuple[DataFrame, DataFrame]:
    """Split rows into (good, rejects). Good rows gain :data:`EVENT_MS`; rejects gain
    ``__reject_reason`` ("null key" or "unparseable event time: <value>")."""
    marked = _marked(df, key, event_time)
    return _good(marked), _rejects(marked)


def write_tasks(df: DataFrame, tasks: int, input_partitions: int) -> DataFrame:
    """``df``'s rows in exactly ``tasks`` partitions, the write's upstream tasks. ``input_partitions``: how
    many partitions the file read gives (``df`` is that read with narrow steps only).

    When the read gives at least ``tasks``, they are merged without a shuffle (``coalesce``): each task reads
    whole input splits, the same ones again when it is retried. Otherwise the rows are spread round-robin
    (``repartition``). At 10M events the merge wrote 0.75x the time of the round-robin shuffle
    (docs/PERFORMANCE.md, "The hops' Spark plans"). The read then runs in the write's tasks: on a cluster
    with many more cores than ``tasks`` the file is no longer read wider than the write, whose work per row
    (JSON and the Kafka produce, in Python) sets the pace either way."""
    return df.coalesce(tasks) if input_partitions >= tasks else df.repartition(tasks)


def split_rejects_observed(df: DataFrame, key: str, event_time: str) -> tuple[DataFrame, DataFrame, Observation]:
    """:func:`split_rejects`, and whether there are any rejects learnt from the pass that reads ``good``:
    the :class:`~pyspark.sql.Observation` holds ``{"rejects": n}`` once the first action on ``good`` (or a
    DataFrame made from it) has run. ``n`` 0 means the input has no reject; above 0 it has some, but ``n``
    itself may count a retried task's rows twice: count ``rejects`` for the exact number. So a job that
    writes ``good`` reads the input once when nothing is rejected, where counting the rejects first costs a
    whole pass more. The action must run ``good``'s query as part of its own plan (a ``format("controlmsg")``
    or file write, a collect): a write that runs it inside a command, as ``format("kafka")``'s default V1
    path does, never reports the metric, and ``seen.get`` then waits for ever."""
    marked = _marked(df, key, event_time)
    seen = Observation()
    good = _good(marked.observe(seen, F.count(F.col(REJECT_REASON)).alias("rejects")))
    return good, _rejects(marked), seen


def _good(marked: DataFrame) -> DataFrame:
    return marked.where(F.col(REJECT_REASON).isNull()).drop(REJECT_REASON)


def _rejects(marked: DataFrame) -> DataFrame:
    return marked.where(F.col(REJECT_REASON).isNotNull()).drop(EVENT_MS)


def _marked(df: DataFrame, key: str, event_time: str) -> DataFrame:
    """``df`` with :data:`EVENT_MS` and the reject reason (null for a good row)."""
    for name in (key, event_time):
        if name not in df.columns:
            raise ValueError(f"column {name!r} is not in the input (columns: {', '.join(df.columns)})")
    with_ms = df.withColumn(EVENT_MS, event_time_ms(df, event_time))
    reason = (
        F.when(top_column(key).isNull(), F.lit("null key"))
        .when(F.col(EVENT_MS).isNull(), F.concat(F.lit("unparseable event time: "),
                                                 F.coalesce(top_column(event_time).cast("string"), F.lit("null"))))
    )
    return with_ms.withColumn(REJECT_REASON, reason)


def iso_utc(ms: Column) -> Column:
    """Epoch ms -> ``YYYY-MM-DDTHH:MM:SSZ`` (``.SSS`` added only when there are milliseconds)."""
    ts = F.timestamp_millis(ms)
    return F.when(
        F.pmod(ms, F.lit(1000)) == 0, F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss'Z'")
    ).otherwise(F.date_format(ts, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"))


def windowed_oracle(
    spark: SparkSession, path: str, *, key: str, event_time: str, window_ms: int, sums: list[str],
    null_value: str | None = None,
) -> DataFrame:
    """The reference answer: the same tumbling-window aggregation as ONE plain Spark batch query over the
    input file, with Spark's own ``window()``. Columns: key (string), window_start, window_end (ISO-8601
    UTC), count, sum_<col>..."""
    df = read_table(spark, path, null_value)
    good, _ = split_rejects(df, key, event_time)
    seconds = window_ms // 1000
    win = F.window(F.timestamp_millis(F.col(EVENT_MS)), f"{seconds} seconds") if window_ms % 1000 == 0 else \
        F.window(F.timestamp_millis(F.col(EVENT_MS)), f"{window_ms} milliseconds")
    aggs = [F.count(F.lit(1)).alias("count")] + [F.sum(top_column(c)).alias(f"sum_{c}") for c in sums]
    grouped = good.groupBy(top_column(key).cast("string").alias("key"), win.alias("w")).agg(*aggs)
    return grouped.select(
        "key",
        iso_utc(F.unix_millis(F.col("w.start"))).alias("window_start"),
        iso_utc(F.unix_millis(F.col("w.end"))).alias("window_end"),
        "count",
        *[top_column(f"sum_{c}") for c in sums],
    )


def json_columns(raw: DataFrame, known: dict[str, str], numeric: Sequence[str]) -> DataFrame:
    """Parse the ``value`` JSON texts of a raw intermediate read into columns, in the JVM, in one pass.

    ``known``: columns of a fixed type (name -> Spark SQL type). ``numeric``: columns whose type comes
    from the data (see :func:`is_fractional` and :func:`numeric_value`); they come out as their JSON text
    (a number's digits as written), so that the type can be chosen after the pass that reads them.
    """
    return _from_json(raw, {**known, **{c: "string" for c in numeric}})


def typed_columns(parsed: DataFrame, numeric: Sequence[str],
                  declared: Mapping[str, str | None] | None = None) -> tuple[DataFrame, int]:
    """The rows of ``parsed`` (from :func:`json_columns`; best cached, it is read twice) with each
    ``numeric`` column typed, and how many rows there are. One pass over ``parsed`` counts the rows and
    chooses the type of each column not in ``declared`` (name -> ``long``/``double``) by the rule of
    :func:`is_fractional`; the DataFrame returned casts the texts (:func:`numeric_value`), the other
    columns unchanged, in their order."""
    given = {c: t for c, t in (declared or {}).items() if t is not None}
    probed = [c for c in numeric if c not in given]
    totals = parsed.agg(F.count(F.lit(1)).alias("rows"),
                        *[F.max(is_fractional(top_column(c))).alias(f"c{i}") for i, c in enumerate(probed)]).first()
    assert totals is not None
    fractional = {**{c: t == "double" for c, t in given.items()},
                  **{c: totals[f"c{i}"] == 1 for i, c in enumerate(probed)}}
    typed = {c: numeric_value(top_column(c), fractional[c]).alias(c) for c in numeric}
    return parsed.select(*[typed.get(c, top_column(c)) for c in parsed.columns]), int(totals["rows"])


def read_parsed(spark: SparkSession, options: Mapping[str, str], known: dict[str, str],
                numeric: Mapping[str, str | None]) -> tuple[DataFrame, DataFrame, int]:
    """The followed run of an intermediate topic (``format("controlmsg")`` ``options``) read to end of
    stream into a cache of parsed rows, and counted. ``known``: columns of a fixed type (name -> Spark SQL
    type); ``numeric``: the numeric columns, each with its declared type (``long``/``double``) or ``None``
    (the type comes from the data, :func:`typed_columns`). Returns the cache (the caller unpersists it),
    its rows with every numeric column typed, and how many there are.

    When every numeric column is declared, the data source parses the JSON itself (``.schema()``, in
    the reading tasks, with orjson) and there is no typing pass; a value that does not fit its declared
    type then fails the read naming its topic, partition and offset (the source's ``FAILFAST``). Otherwise
    the JSON texts are parsed in the JVM (:func:`json_columns`) and one pass over the cache counts and
    types them; the first is the faster (docs/PERFORMANCE.md, "window_aggregate's read").
    """
    reader = spark.read.format("controlmsg").options(**options)
    if all(t is not None for t in numeric.values()):
        parsed = reader.schema(ddl({**known, **{c: t for c, t in numeric.items() if t is not None}})).load().cache()
        return parsed, parsed, parsed.count()
    parsed = json_columns(reader.load(), known, list(numeric)).cache()
    typed, rows = typed_columns(parsed, list(numeric), numeric)
    return parsed, typed, rows


def top_column(name: str) -> Column:
    """A top-level column by its name, whatever characters it has (a dot would otherwise mean a field)."""
    return F.col("`" + name.replace("`", "``") + "`")


def _from_json(raw: DataFrame, fields: dict[str, str]) -> DataFrame:
    """The ``value`` column (binary, as ``format("kafka")`` has it) parsed into ``fields`` (name -> Spark SQL
    type), one column each."""
    return raw.select(F.from_json(F.col("value").cast("string"), ddl(fields)).alias("r")).select("r.*")


def ddl(fields: dict[str, str]) -> str:
    """A DDL schema string of ``fields`` (name -> Spark SQL type), every name quoted."""
    return ", ".join(f"`{name.replace('`', '``')}` {typ}" for name, typ in fields.items())


def is_fractional(text: Column) -> Column:
    """1 when a numeric column's JSON text has a fraction or an exponent, else 0 (null stays null).

    The type rule of the jobs, as SQL SUM's input type would be: a numeric column is ``double`` if any of
    its values has a fraction or an exponent, else ``long``; ``max`` of this flag over the data decides.
    """
    # Three substring tests: a regular expression ([.eE]) costs several times more per value.
    return (text.contains(".") | text.contains("e") | text.contains("E")).cast("int")


def numeric_value(text: Column, fractional: bool) -> Column:
    """A numeric column's JSON text as ``double`` or ``long`` (what does not parse is null)."""
    return text.try_cast("double" if fractional else "long")
