"""The batch window job's one-pass aggregation (``aggregate_json_windows``) and the sink's file: each sum's
type comes from the data, chosen after the single pass over the input; a long sum that overflows fails
with the column, key and window named, never a silent null or wrap-around; the sink's file is in order.

Real SparkSession; the aggregation is given raw values as the data source reads them (a ``value`` column
of JSON texts), so these need no broker; the pipeline tests run the same code against Kafka.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from spark_jobs import sink
from spark_jobs.window_aggregate import aggregate_json_windows

HOUR = 3_600_000


def raw(spark: SparkSession, records: list[dict[str, Any]]) -> DataFrame:
    return spark.createDataFrame([(json.dumps(r),) for r in records], "value string")


def windows_of(spark: SparkSession, records: list[dict[str, Any]], sums: list[str]) -> tuple[DataFrame, int]:
    windows, rows, _cached = aggregate_json_windows(raw(spark, records), HOUR, sums)
    return windows, rows


def test_integer_sums_stay_long_and_one_fraction_makes_a_double(spark: SparkSession) -> None:
    records = [
        {"key": "a", "event_ms": 10, "n": 1, "x": 2, "z": None},
        {"key": "a", "event_ms": 20, "n": 4, "x": 2.5, "z": None},
        {"key": "b", "event_ms": HOUR + 1, "n": -3, "x": 1e3, "z": None},
        {"key": "b", "event_ms": HOUR + 2, "n": None, "x": 7, "z": None},
    ]
    windows, rows = windows_of(spark, records, ["n", "x", "z"])
    assert rows == 4
    types = {f.name: f.dataType for f in windows.schema.fields}
    assert types["sum_n"] == T.LongType() and types["sum_x"] == T.DoubleType() and types["sum_z"] == T.LongType()
    got = sorted(tuple(r) for r in windows.collect())
    assert got == [("a", 0, HOUR, 2, 5, 4.5, None), ("b", HOUR, 2 * HOUR, 2, -3, 1007.0, None)]


def test_a_long_sum_that_overflows_fails_naming_column_key_and_window(spark: SparkSession) -> None:
    big = 2**62
    records = [{"key": "k1", "event_ms": 5, "n": big}, {"key": "k1", "event_ms": 6, "n": big},
               {"key": "k2", "event_ms": 5, "n": 1}]
    windows, _ = windows_of(spark, records, ["n"])
    with pytest.raises(Exception, match=r"sum of 'n' overflows a long for key k1 in the window at 0"):
        windows.collect()
    # Below the limit, the same shape sums exactly.
    windows, _ = windows_of(spark, records[:1] + records[2:], ["n"])
    assert sorted(tuple(r) for r in windows.collect()) == [("k1", 0, HOUR, 1, big), ("k2", 0, HOUR, 1, 1)]


def test_no_input_gives_no_windows(spark: SparkSession) -> None:
    windows, rows = windows_of(spark, [], ["n"])
    assert rows == 0 and windows.count() == 0


def test_the_sink_file_is_sorted_by_key_then_window_with_the_sums_types(
        spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """Window results written in no order (two write tasks, shuffled keys) come out of the sink as one
    Parquet file in (key, window start) order, milliseconds windows included, the sums typed."""
    run_id = uuid.uuid4().hex[:10]
    topic = f"t-{run_id}-windows"
    common = ["--run-id", run_id, "--bootstrap-servers", bootstrap_servers, "--timeout", "120"]
    window = 1500  # ms: ISO strings with and without milliseconds, which would not sort as text
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
    assert written.collect()[1]["window_start"] == "1970-01-01T00:00:01.500Z"

