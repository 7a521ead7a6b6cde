"""The batch jobs' numeric columns: each sum's type comes from the data (``long`` unless a value has a
fraction or an exponent), in the window job (``json_columns``, ``typed_columns``, ``aggregate_windows``)
and in the sink, whose one file is in (key, window start) order.

Real SparkSession; the window job's parsing is given raw values as the data source reads them (a binary ``value``
column of JSON), so those need no broker; the sink test reads a real topic.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_jobs.batch import sink
from spark_jobs.batch.window_aggregate import aggregate_windows
from spark_jobs.events import json_columns, typed_columns

HOUR = 3_600_000


def windows_of(spark: SparkSession, records: list[dict[str, Any]], sums: list[str]) -> DataFrame:
    raw = spark.createDataFrame([(orjson.dumps(r),) for r in records], "value binary")  # as a read without .schema
    typed, rows = typed_columns(json_columns(raw, {"key": "string", "event_ms": "long"}, sums), sums)
    assert rows == len(records)
    return aggregate_windows(typed, HOUR, sums)


def test_integer_sums_stay_long_and_one_fraction_or_exponent_makes_a_double(spark: SparkSession) -> None:
    records = [
        {"key": "a", "event_ms": 10, "n": 1, "x": 2, "e": 1, "z": None},
        {"key": "a", "event_ms": 20, "n": 4, "x": 2.5, "e": 2, "z": None},
        {"key": "b", "event_ms": HOUR + 1, "n": -3, "x": 7, "e": 1e20, "z": None},
        {"key": "b", "event_ms": HOUR + 2, "n": None, "x": 7, "e": 3, "z": None},
    ]
    windows = windows_of(spark, records, ["n", "x", "e", "z"])
    types = {f.name: f.dataType for f in windows.schema.fields}
    assert types["sum_n"] == T.LongType() and types["sum_x"] == T.DoubleType()
    assert types["sum_e"] == T.DoubleType() and types["sum_z"] == T.LongType()
    got = sorted(tuple(r) for r in windows.collect())
    assert got == [("a", 0, HOUR, 2, 5, 4.5, 3.0, None), ("b", HOUR, 2 * HOUR, 2, -3, 14.0, 1e20 + 3, None)]


def test_a_declared_type_wins_over_the_data_and_the_others_still_come_from_it(spark: SparkSession) -> None:
    """Some sums declared, some not (the parse in the JVM then): a declared double stays double over
    integers, a declared long takes what parses as long, the undeclared one is typed by its data."""
    records = [{"key": "a", "event_ms": 10, "n": 1, "x": 2, "m": 5},
               {"key": "a", "event_ms": 20, "n": 4, "x": 2.5, "m": 6}]
    raw = spark.createDataFrame([(orjson.dumps(r),) for r in records], "value binary")  # as a read without .schema
    typed, rows = typed_columns(json_columns(raw, {"key": "string", "event_ms": "long"}, ["n", "x", "m"]),
                                ["n", "x", "m"], {"n": "double", "x": None, "m": "long"})
    assert rows == 2
    windows = aggregate_windows(typed, HOUR, ["n", "x", "m"])
    types = {f.name: f.dataType for f in windows.schema.fields}
    assert (types["sum_n"], types["sum_x"], types["sum_m"]) == (T.DoubleType(), T.DoubleType(), T.LongType())
    assert [tuple(r) for r in windows.collect()] == [("a", 0, HOUR, 2, 5.0, 4.5, 11)]


def test_no_input_gives_no_windows(spark: SparkSession) -> None:
    assert windows_of(spark, [], ["n"]).count() == 0


def test_the_sink_file_is_sorted_by_key_then_window_with_the_sums_types(
        spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """Window results written in no order (two write tasks, shuffled keys) come out of the sink as one
    Parquet file in (key, window start) order, milliseconds windows included, the sums typed."""
    run_id = uuid.uuid4().hex[:10]
    topic = f"t-{run_id}-windows"
    common = ["--run-id", run_id, "--bootstrap-servers", bootstrap_servers, "--timeout", "120"]
    window = 500  # ms: 00:00Z, 00:00.500Z, 00:01Z...: as text, "00:00.500Z" would sort before "00:00Z"
    rows = [{"key": f"k{k}", "window_start": w * window, "window_end": (w + 1) * window, "count": 1 + w % 3,
             "sum_n": k * w, "sum_x": w / 4} for k in (3, 1, 2) for w in (5, 0, 3, 1, 4, 2)]
    df = spark.createDataFrame(rows).repartition(2)
    options = {"topic": topic, "runId": run_id, "job": "window", "key": "key", "eventTime": "window_start",
               "partitions": "2", "kafka.bootstrap.servers": bootstrap_servers}
    df.write.format("controlmsg").mode("append").options(**options).save()
    output = tmp_path / "out.parquet"
    summary = sink.run(spark, sink.build_parser().parse_args(
        ["--input-topic", topic, "--output", str(output), "--sum", "n", "--sum", "x", *common]),
        {"bootstrap.servers": bootstrap_servers})
    assert summary["rows_out"] == len(rows)
    written = spark.read.parquet(str(output))
    types = {f.name: f.dataType for f in written.schema.fields}
    assert types["sum_n"] == T.LongType() and types["sum_x"] == T.DoubleType()
    got = [(r["key"], r["sum_x"]) for r in written.collect()]  # one file, one split: the file's order
    assert got == [(f"k{k}", w / 4) for k in (1, 2, 3) for w in range(6)]
    assert [r["window_start"] for r in written.collect()][:3] == [
        "1970-01-01T00:00:00Z", "1970-01-01T00:00:00.500Z", "1970-01-01T00:00:01Z"]

