"""The windowed-count pipeline against its oracle: the input file read, rejected and windowed in plain Python
(:func:`tests.oracles.windowed_counts`, which shares no code with ``spark_jobs``) must equal the pipeline's
output file row for row.

Here the three jobs run one after another in the test's Spark session (their ``run`` functions), which
exercises everything but the process boundaries; ``test_pipeline_apps.py`` runs them as separate Spark
applications, concurrently, through the pipeline CLI.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.kafka.admin import end_offsets
from spark_jobs.batch import ingest, sink, window_aggregate
from spark_jobs.events import parse_duration, windowed_oracle
from tests.oracles import duration_ms, read_output, windowed_counts
from tests.spark.topic_dump import dump_topic

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clicks.csv"


def run_pipeline_in_session(spark: SparkSession, servers: str, *, input_path: str, key: str, event_time: str,
                            window: str, sums: list[str], output: str, partitions: int, tasks: int,
                            null_value: str | None = None,
                            declared: dict[str, str] | None = None,
                            commit_rows: int | None = None) -> dict[str, dict[str, Any]]:
    """``declared``: the sums given a type (``--sum COL:TYPE`` and ``--carry COL:TYPE``), as the pipeline
    declares a Parquet input's number columns; ``commit_rows``: the window job's ``--commit-rows``."""
    run_id = uuid.uuid4().hex[:10]
    events, windows = f"t-{run_id}-events", f"t-{run_id}-windows"
    common = ["--run-id", run_id, "--bootstrap-servers", servers, "--timeout", "120"]
    types = declared or {}
    typed = [f"{c}:{types[c]}" if c in types else c for c in sums]
    sum_args = [x for c in typed for x in ("--sum", c)]
    ingest_args = ["--input", input_path, "--key", key, "--event-time", event_time, "--topic", events,
                   "--partitions", str(partitions), "--tasks", str(tasks), "--rejects", f"{output}.rejects.jsonl",
                   *[x for c in typed for x in ("--carry", c)], *common]
    if null_value is not None:
        ingest_args += ["--null-value", null_value]
    config = {"bootstrap.servers": servers}
    out = {"ingest": ingest.run(spark, ingest.build_parser().parse_args(ingest_args), config)}
    out["window"] = window_aggregate.run(spark, window_aggregate.build_parser().parse_args(
        ["--input-topic", events, "--output-topic", windows, "--window", window, "--partitions", str(partitions),
         "--tasks", str(tasks), *sum_args, *common,
         *([] if commit_rows is None else ["--commit-rows", str(commit_rows)])]), config)
    out["sink"] = sink.run(spark, sink.build_parser().parse_args(
        ["--input-topic", windows, "--output", output, *sum_args, *common]), config)
    out["topics"] = {"events": events, "windows": windows}
    return out


def normalized(rows: list[Any], sums: list[str]) -> list[tuple[Any, ...]]:
    def num(v: Any) -> Any:
        if v is None:
            return None
        return round(float(v), 6)

    result = [
        (str(r["key"]), r["window_start"], r["window_end"], int(r["count"]), *[num(r[f"sum_{c}"]) for c in sums])
        for r in rows
    ]
    return sorted(result)


def assert_matches_oracle(spark: SparkSession, output: str, *, input_path: str, key: str, event_time: str,
                          window: str, sums: list[str], null_value: str | None = None) -> int:
    """The pipeline's output file equals :func:`tests.oracles.windowed_counts` over its input, row for row
    (:func:`normalized`); returns how many rows. Both sides are read without Spark and without ``spark_jobs``
    (``spark`` is unused, kept for the callers)."""
    got = normalized(read_output(output, sums), sums)
    want = normalized(windowed_counts(input_path, key=key, event_time=event_time, window_ms=duration_ms(window),
                                      sums=sums, null_value=null_value).rows, sums)
    extra, missing = Counter(got) - Counter(want), Counter(want) - Counter(got)
    assert got == want, (f"{len(got)} rows written, {len(want)} expected; only in the output: {list(extra)[:5]}; "
                         f"only in the oracle: {list(missing)[:5]}")
    return len(got)


def test_sample_one_partition_one_task(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    output = str(tmp_path / "out.csv")
    opts: dict[str, Any] = dict(input_path=str(SAMPLE), key="user", event_time="event_time", window="1h",
                                sums=["amount", "items"], null_value="NA")
    summary = run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=1, tasks=1, **opts)
    rows = assert_matches_oracle(spark, output, **opts)
    assert rows > 100
    assert summary["ingest"]["rejects"] == 11  # 6 null keys + 5 unparseable times in the sample
    rejects = [json.loads(line) for line in Path(f"{output}.rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == 11
    assert {r["__reject_reason"].split(":")[0] for r in rejects} == {"null key", "unparseable event time"}
    assert summary["ingest"]["rows_in"] == 2400 and summary["sink"]["rows_out"] == rows


def test_sample_many_partitions_k_not_n(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    output = str(tmp_path / "out.parquet")
    opts: dict[str, Any] = dict(input_path=str(SAMPLE), key="user", event_time="event_time", window="15m",
                                sums=["amount"], null_value="NA")
    # The window job commits every 100 results, its tasks' input in Arrow batches of 50: each task commits
    # several transactions (a partial marker each), which the sink reads as they come.
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key) or "1000"
    spark.conf.set(key, "50")
    try:
        summary = run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=5, tasks=3,
                                          commit_rows=100, **opts)
    finally:
        spark.conf.set(key, before)
    assert assert_matches_oracle(spark, output, **opts) > 1000
    # Every transaction leaves a marker on each partition it wrote to: one per task and partition, plus the
    # driver's end of stream on each, had each task written one transaction.
    config = {"bootstrap.servers": bootstrap_servers}
    windows = summary["topics"]["windows"]
    records = len(dump_topic(config, windows, "read_committed"))
    markers = sum(end_offsets(config, windows).values()) - records
    assert markers > 3 * 5 + 5


def test_empty_upstream_tasks(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """Three rows, six write tasks: most tasks have no rows and must still end their stream."""
    src = tmp_path / "tiny.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"k": "a", "t": "2026-01-01T00:00:01Z", "v": 1},
        {"k": "a", "t": "2026-01-01T00:00:59Z", "v": None},
        {"k": "b", "t": 1767225600000, "v": 5},
    ]) + "\n")
    output = str(tmp_path / "out.jsonl")
    opts: dict[str, Any] = dict(input_path=str(src), key="k", event_time="t", window="1m", sums=["v"])
    summary = run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=2, tasks=6, **opts)
    assert summary["ingest"]["tasks"] == 6
    assert assert_matches_oracle(spark, output, **opts) == 2


@pytest.mark.parametrize("declared", [None, {"price.usd": "long", "n`x": "double"}], ids=["inferred", "declared"])
def test_column_names_with_dots_and_backticks(spark: SparkSession, bootstrap_servers: str, tmp_path: Path,
                                              declared: dict[str, str] | None) -> None:
    """Columns are named as the input names them: a dot is part of the name, not a struct field, and a
    backtick is a character like any other, in every job and in the oracle, whether the sums' types come
    from the data or are declared (then the names go into the data source's schema)."""
    src = tmp_path / "dotted.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"user.id": "a", "at.time": "2026-01-01T00:00:01Z", "price.usd": 2, "n`x": 0.5},
        {"user.id": "a", "at.time": "2026-01-01T00:00:30Z", "price.usd": 3, "n`x": 1},
        {"user.id": "b", "at.time": "2026-01-01T00:01:00Z", "price.usd": None, "n`x": 2},
    ]) + "\n")
    output = str(tmp_path / "out.jsonl")
    opts: dict[str, Any] = dict(input_path=str(src), key="user.id", event_time="at.time", window="1m",
                                sums=["price.usd", "n`x"])
    run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=2, tasks=2, declared=declared,
                            **opts)
    assert assert_matches_oracle(spark, output, **opts) == 2
    rows = [json.loads(line) for line in Path(output).read_text().splitlines()]
    assert [(r["key"], r["count"], r.get("sum_price.usd"), r["sum_n`x"]) for r in rows] == [
        ("a", 2, 5, 1.5), ("b", 1, None, 2.0)]


def write_events(path: Path, n: int, *, days: int, keys: int, seed: int) -> None:
    """Synthetic events over ``days`` days with zipf-like skewed keys, as JSON lines."""
    rng = random.Random(seed)
    start = datetime(2025, 12, 1, tzinfo=UTC)
    with path.open("w") as f:
        for i in range(n):
            k = min(int(rng.paretovariate(1.2)), keys)
            t = start + timedelta(seconds=rng.randint(0, days * 86400))
            f.write(json.dumps({"id": i, "key": k, "ts": t.isoformat(), "x": rng.randint(-5, 50),
                                "y": None if i % 13 == 0 else rng.random()}) + "\n")


def test_skewed_keys_windows_over_many_days(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    src = tmp_path / "events.jsonl"
    write_events(src, 20_000, days=45, keys=40, seed=3)
    output = str(tmp_path / "out.csv")
    opts: dict[str, Any] = dict(input_path=str(src), key="key", event_time="ts", window="1d", sums=["x", "y"])
    run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=4, tasks=3, **opts)
    rows = assert_matches_oracle(spark, output, **opts)
    assert rows > 45 * 5


def test_declared_sums_match_the_oracle_with_their_declared_types(
        spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """``x`` (integers) declared long and ``y`` (fractions and nulls) double: the jobs downstream parse by
    the declaration, the result equals the oracle's, and the sums have the declared types. An integer
    column declared double is written and summed as double."""
    src = tmp_path / "events.jsonl"
    write_events(src, 5_000, days=3, keys=20, seed=5)
    output = str(tmp_path / "out.parquet")
    opts: dict[str, Any] = dict(input_path=str(src), key="key", event_time="ts", window="1h", sums=["x", "y", "id"])
    summary = run_pipeline_in_session(spark, bootstrap_servers, output=output, partitions=3, tasks=2,
                                      declared={"x": "long", "y": "double", "id": "double"}, **opts)
    assert summary["window"]["rows_in"] == 5_000
    assert assert_matches_oracle(spark, output, **opts) > 3 * 24
    types = {f.name: f.dataType.simpleString() for f in spark.read.parquet(output).schema.fields}
    assert (types["sum_x"], types["sum_y"], types["sum_id"]) == ("bigint", "double", "double")


def test_a_declared_type_the_data_does_not_fit_fails_naming_the_record(
        spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """Ingest refuses to write a fractional column as long, before writing anything. A record of another
    writer whose value does not fit the window job's declared type fails the read, naming topic,
    partition and offset: never a null in its place."""
    src = tmp_path / "in.csv"
    src.write_text("user,ts,amount\nu,2026-01-01T00:00:00Z,1.5\n")
    with pytest.raises(ValueError, match=r"--carry amount:long: column 'amount' is double in the input; a long "
                                         r"column must be integral \(declare double for a fractional one\)"):
        run_pipeline_in_session(spark, bootstrap_servers, input_path=str(src), key="user", event_time="ts",
                                window="1h", sums=["amount"], output=str(tmp_path / "out.csv"), partitions=1,
                                tasks=1, declared={"amount": "long"})
    assert not (tmp_path / "out.csv.rejects.jsonl").exists()
    run_id = uuid.uuid4().hex[:10]
    topic = f"t-{run_id}-events"
    values = ['{"key": "u", "event_ms": 1, "amount": 2}', '{"key": "u", "event_ms": 2, "amount": 2.5}']
    (spark.createDataFrame([("u", i, v) for i, v in enumerate(values)], "key string, t long, value string")
     .coalesce(1).write.format("controlmsg").mode("append")
     .options(topic=topic, runId=run_id, job="other", key="key", eventTime="t", value="value", partitions="1",
              **{"kafka.bootstrap.servers": bootstrap_servers}).save())
    args = window_aggregate.build_parser().parse_args(
        ["--input-topic", topic, "--output-topic", f"t-{run_id}-windows", "--window", "1h", "--sum", "amount:long",
         "--run-id", run_id, "--bootstrap-servers", bootstrap_servers, "--timeout", "60"])
    with pytest.raises(Exception, match=rf"topic '{topic}' partition 0 offset 1: field 'amount' does not fit type "
                                        "int64: a value is a number with a fraction or an exponent, not an integer"):
        window_aggregate.run(spark, args, {"bootstrap.servers": bootstrap_servers})


def test_no_valid_rows_still_ends(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    """Every row rejected: the chain still ends by itself and writes an output with just the header."""
    src = tmp_path / "bad.csv"
    src.write_text("user,ts,amount\n,2026-01-01T00:00:00Z,1\nu,never,2\n")
    output = tmp_path / "out.csv"
    summary = run_pipeline_in_session(spark, bootstrap_servers, input_path=str(src), key="user", event_time="ts",
                                      window="1h", sums=["amount"], output=str(output), partitions=2, tasks=2)
    assert summary["ingest"]["rejects"] == 2 and summary["sink"]["rows_out"] == 0
    assert output.read_text().splitlines() == ["key,window_start,window_end,count,sum_amount"]
    assert summary["window"]["rows_in"] == 0



SMALL_CSV = """user,event_time,amount
u1,2026-01-01T00:00:05Z,1.5
u1,2026-01-01T00:00:59Z,2
u2,2026-01-01T00:00:30Z,NA
,2026-01-01T00:00:10Z,9
u1,2026-01-01T00:01:00Z,4.25
u3,whenever,1
u2,2026-01-01T00:02:10Z,3
NA,2026-01-01T00:00:11Z,1
u2,2026-01-01T00:02:59.500Z,0.25
u3,2026-01-01T00:03:00Z,0.5
"""


# SMALL_CSV's windows of 1m worked out by hand: three rejects (an empty and an NA user, "whenever").
SMALL_WINDOWS = [
    ("u1", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", 2, 3.5),
    ("u1", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", 1, 4.25),
    ("u2", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", 1, None),  # its one amount is NA
    ("u2", "2026-01-01T00:02:00Z", "2026-01-01T00:03:00Z", 2, 3.25),
    ("u3", "2026-01-01T00:03:00Z", "2026-01-01T00:04:00Z", 1, 0.5),
]


def test_the_pipeline_and_its_oracle_against_windows_worked_out_by_hand(spark: SparkSession, bootstrap_servers: str,
                                                                        tmp_path: Path) -> None:
    """The oracle itself, on a small CSV, equals the windows and rejects worked out by hand
    (:data:`SMALL_WINDOWS`); the pipeline's output equals both."""
    src = tmp_path / "small.csv"
    src.write_text(SMALL_CSV)
    output = tmp_path / "out.csv"
    opts: dict[str, Any] = dict(input_path=str(src), key="user", event_time="event_time", window="1m",
                                sums=["amount"], null_value="NA")
    summary = run_pipeline_in_session(spark, bootstrap_servers, output=str(output), partitions=2, tasks=2, **opts)
    oracle = windowed_counts(str(src), key="user", event_time="event_time", window_ms=60_000, sums=["amount"],
                             null_value="NA")
    assert normalized(oracle.rows, ["amount"]) == SMALL_WINDOWS and (oracle.rows_in, oracle.rejects) == (10, 3)
    assert assert_matches_oracle(spark, str(output), **opts) == len(SMALL_WINDOWS)
    assert summary["ingest"]["rejects"] == 3 and summary["ingest"]["rows_in"] == 10


ODD_JSON_ROWS = [  # every event-time form of the docs, and the rejects, in one JSON lines file
    '{"k": "a", "t": "2026-01-01T10:00:00+02:00", "v": 1}',
    '{"k": "a", "t": "2026-01-01 08:00:30", "v": 2.5}',
    '{"k": 7, "t": "1767225600000", "v": 3}',  # a number key among strings: its text
    '{"k": true, "t": 1767225600000, "v": null}',  # a number time among strings: its text, digits
    '{"k": "b", "t": " 2026-01-01T00:00:07.5Z ", "v": 4}',
    '{"k": "b", "t": "-1000", "v": 5}',
    '{"k": null, "t": "2026-01-01T00:00:00Z", "v": 1}',
    '{"t": "2026-01-01T00:00:00Z", "v": 1}',
    '{"k": "b", "t": "yesterday", "v": 1}',
    '{"k": "b", "t": 1767225600000.5, "v": 1}',
    '{"k": "b", "t": "2026-13-01T00:00:00Z", "v": 1}',
    '{"k": "b", "t": "2026-01-01", "v": 1}',
    '{oops',
]


def test_the_benchmarks_oracle_equals_the_tests_oracle(spark: SparkSession, tmp_path: Path) -> None:
    """``spark_jobs.events.windowed_oracle`` (the benchmarks' reference: Spark's readers, the jobs' reject
    rules, Spark's ``window()``) equals :func:`tests.oracles.windowed_counts` on CSV (mixed time forms,
    integer and ISO columns that Spark types itself), JSON lines (odd forms and rejects) and Parquet
    (timestamps with and without a zone, epoch ms): two readers and two rule sets that share no code."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "small.csv").write_text(SMALL_CSV)
    (tmp_path / "typed.csv").write_text("id,ms,iso,amount\n007,1767225600000,2026-01-01T00:00:00Z,1\n"
                                        "8,1767225659999,2026-01-01T00:01:00.250Z,2.5\n007,,2026-01-01T00:00:30Z,\n")
    write_events(tmp_path / "events.jsonl", 2000, days=2, keys=30, seed=7)
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write("\n".join(ODD_JSON_ROWS) + "\n")
    us = [1_767_225_600_000_999, -1_500, None, 1_767_229_200_123_456]
    pq.write_table(pa.table({
        "user": ["a", "b", "a", None], "amount": [1.5, None, 2.0, 4.0], "n": [1, 2, 3, 4],
        "ts": pa.array(us, pa.timestamp("us", tz="UTC")), "local": pa.array(us, pa.timestamp("us")),
        "ms": pa.array([None if u is None else u // 1000 for u in us], pa.int64())}), tmp_path / "in.parquet")
    cases: list[tuple[str, str, str, str, list[str], str | None]] = [
        (str(SAMPLE), "user", "event_time", "1h", ["amount", "items"], "NA"),
        (str(tmp_path / "small.csv"), "user", "event_time", "1m", ["amount"], "NA"),
        (str(tmp_path / "typed.csv"), "id", "ms", "1m", ["amount"], None),
        (str(tmp_path / "typed.csv"), "id", "iso", "1m", ["amount"], None),
        (str(tmp_path / "events.jsonl"), "key", "ts", "1h", ["x", "y"], None),
        (str(tmp_path / "events.jsonl"), "k", "t", "1m", ["v"], None),
        *[(str(tmp_path / "in.parquet"), "user", t, "1h", ["amount", "n"], None) for t in ("ts", "local", "ms")],
    ]
    for path, key, event_time, window, sums, null_value in cases:
        benchmarks = windowed_oracle(spark, path, key=key, event_time=event_time, window_ms=parse_duration(window),
                                     sums=sums, null_value=null_value).collect()
        ours = windowed_counts(path, key=key, event_time=event_time, window_ms=duration_ms(window), sums=sums,
                               null_value=null_value)
        assert ours.rows, (path, event_time)
        assert normalized(benchmarks, sums) == normalized(ours.rows, sums), (path, event_time)
