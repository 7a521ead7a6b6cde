"""``format("controlmsg")`` the four ways, on a real broker and a real SparkSession: write and read round
trips, the end of stream of every task, the refusals a user meets."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import orjson
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from controlmsg.kafka import ControlReader
from controlmsg.spark import run_status
from tests.spark.helpers import options, read
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

UTC = dt.UTC
SCHEMA = "user string, ts timestamp, day date, amount decimal(12,3), score double, n long, tags array<string>"


def rows_with_everything(n: int) -> list[tuple[Any, ...]]:
    base = dt.datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(n):
        user = ["anna", "jürgen", "李", "o'neil \"q\"", "😀"][i % 5]
        rows.append((
            user,
            None if i % 7 == 3 else base + dt.timedelta(minutes=i, microseconds=123),
            None if i % 11 == 5 else (base + dt.timedelta(days=i % 3)).date(),
            None if i % 4 == 1 else Decimal(f"{i}.{i % 1000:03d}"),
            None if i % 6 == 2 else i / 7,
            None if i % 9 == 4 else i * 1_000_000_007,
            None if i % 8 == 6 else [f"t{i % 3}", None] if i % 2 else [],
        ))
    return rows


@pytest.mark.parametrize(("topic_partitions", "write_tasks"), [(1, 1), (5, 7)])
def test_write_then_read_round_trip(spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
                                    new_topic: Callable[..., str], topic_partitions: int, write_tasks: int) -> None:
    topic = new_topic(topic_partitions)
    rows = rows_with_everything(200)
    # 7 tasks hashed by 5 distinct users: at least two tasks write no row and must still end their stream.
    df = spark.createDataFrame(rows, SCHEMA).repartition(write_tasks, "user")
    (df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers))
     .option("KEY", "user").option("eventtime", "ts").save())  # option names are case-insensitive

    status = run_status(options(topic, bootstrap_servers))
    assert status is not None and status["ended"] and status["writeTasks"] == write_tasks
    assert status["rows"] == 200 and status["taskCount"] == 1 and status["upstream"] == "driver"
    names = [f"spark-r1-p{i}" for i in range(write_tasks)]
    wire = dump_topic(kafka_config, topic)
    # The driver is the one upstream task: one end of stream per partition, whatever the number of tasks.
    assert count_by(wire, "eos") == {(p, "spark-r1-driver"): 1 for p in range(topic_partitions)}
    assert {(r.value.task_count, r.value.generation) for r in wire if r.kind == "eos"} == {(1, 0)}
    data = [r for r in wire if r.kind == "data"]
    # Wire format 2 by default (runTag envelope): each record names its run in its value, with no header.
    assert len(data) == 200 and {(r.run, r.task, r.headers) for r in data} == {("r1", None, ())}
    headed = new_topic(topic_partitions)  # runTag headers: format 1, the run and the task in headers
    (df.write.format("controlmsg").mode("append").options(**options(headed, bootstrap_servers, runTag="headers"))
     .option("key", "user").save())
    writers = Counter(r.task for r in dump_topic(kafka_config, headed) if r.kind == "data")
    assert sum(writers.values()) == 200 and set(writers) <= set(names)
    if write_tasks > 5:
        assert set(writers) < set(names)  # 7 tasks, 5 keys: some tasks had no row, and still ended
    assert (sorted(map(tuple, read(spark, headed, bootstrap_servers, schema=SCHEMA).collect()), key=repr)
            == sorted(map(tuple, read(spark, topic, bootstrap_servers, schema=SCHEMA).collect()), key=repr))

    back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).schema(SCHEMA).load()
    naive = [(r[0], None if r[1] is None else r[1].replace(tzinfo=None), *r[2:]) for r in rows]  # collect(): UTC
    assert sorted(map(tuple, back.collect()), key=repr) == sorted(naive, key=repr)

    # Keys are the key column as text, each user in one partition; values are JSON objects with every column.
    raw = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)) \
        .schema("partition int, offset long, key string, value string").load().collect()  # the names before 30
    assert {r.key for r in raw} == {r[0] for r in rows}
    assert all(len({x.partition for x in raw if x.key == user}) == 1 for user in {r[0] for r in rows})
    sample = next(r.value for r in raw if '"n":null' in r.value)
    assert sample.startswith('{"user":') and '"tags":' in sample
    assert any('T00:01:00.000123Z"' in r.value for r in raw)  # timestamps: ISO-8601 UTC


def test_control_messages_grow_with_partitions_and_reading_tasks_with_the_data(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str]) -> None:
    """Issue 24: 40 write tasks into 48 partitions leave 48 control messages (the driver's end of stream,
    one per partition), not 40 x 48; reading back 80 records plans 8 reading tasks (the default floor), not
    one per partition, and a reader's bookkeeping holds one task per partition."""
    from controlmsg.spark.reading.planning import MIN_TASKS as _MIN_TASKS

    topic = new_topic(48)
    df = spark.range(80, numPartitions=40).selectExpr("concat('u', id % 13) AS user", "id AS n")
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, key="user")).save()
    wire = dump_topic(kafka_config, topic)
    assert Counter(r.kind for r in wire) == {"data": 80, "eos": 48}
    assert run_status(options(topic, bootstrap_servers))["writeTasks"] == 40  # type: ignore[index]

    back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).schema("n long").load()
    assert back.rdd.getNumPartitions() == _MIN_TASKS
    assert sorted(r.n for r in back.collect()) == list(range(80))
    one_each = (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers, partitionsPerTask="1"))
                .schema("n long").load())
    assert one_each.rdd.getNumPartitions() == 48  # as asked
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        list(reader.read_until_end(timeout=60))
        assert reader.tracker.is_ended and {len(s.ended_tasks) for s in reader.tracker.statuses()} == {1}


def test_a_value_column_is_the_payload_as_it_is(spark: SparkSession, bootstrap_servers: str,
                                                kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    """Option ``value``: Spark serializes (``to_json`` here, in the JVM); the record's payload is that
    column's bytes, keyed and timed by the other columns, which are not written. A string column and a
    binary one alike; the headers and the end of stream as for any write."""
    from pyspark.sql import functions as F

    rows = rows_with_everything(120)
    df = spark.createDataFrame(rows, SCHEMA).repartition(3)
    for column_type in ("string", "binary"):
        topic = new_topic(4)
        payload = F.to_json(F.struct(*[F.col(c) for c in df.columns])).cast(column_type)
        (df.select("user", "ts", payload.alias("v")).write.format("controlmsg").mode("append")
         .options(**options(topic, bootstrap_servers, key="user", eventTime="ts", value="v")).save())

        status = run_status(options(topic, bootstrap_servers))
        assert status is not None and status["ended"] and status["rows"] == 120 and status["writeTasks"] == 3
        latest = max(r[1] for r in rows if r[1] is not None)
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        assert status["maxEventTime"] == (latest - epoch) // dt.timedelta(milliseconds=1)  # from its own column
        made = [r[0] for r in df.select(F.to_json(F.struct(*df.columns))).collect()]
        raw = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)) \
            .schema("key string, value string, partition int").load().collect()
        assert sorted(r.value for r in raw) == sorted(made)  # Spark's bytes, untouched
        assert all(orjson.loads(r.value).get("user") == r.key for r in raw)  # keyed by the key column
        assert all(len({x.partition for x in raw if x.key == r.key}) == 1 for r in raw if r.key is not None)
        wire = dump_topic(kafka_config, topic)
        assert {r.run for r in wire if r.kind == "data"} == {"r1"}  # the run in the envelope, as without 'value'
        back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).schema(SCHEMA).load()
        assert back.count() == 120 and back.where("user IS NULL").count() == sum(r[0] is None for r in rows)


def test_flat_rows_are_the_same_json_made_in_arrow(spark: SparkSession, bootstrap_servers: str,
                                                  new_topic: Callable[..., str]) -> None:
    """Rows of strings, numbers and booleans only are made JSON column by column in Arrow
    (controlmsg.spark.writing.arrow_json): each record's value is the row's JSON as orjson makes it (NaN and
    infinities null, doubles stay doubles), and a batch with a control character in a string goes the orjson
    way, escaped; both read back as written."""
    flat = "user string, n long, i int, score double, f float, ok boolean"
    users = ["anna", 'o\'neil "q"', "back\\slash", "line\nbreak", "😀", None]
    scores = [0.5, float("nan"), float("inf"), -0.0, 100.0, 1e20, None]
    rows = [(users[k % 6], k * 1_000_000_007 if k % 5 else None, k, scores[k % 7], k / 4, k % 3 == 0 if k % 4 else None)
            for k in range(84)]
    topic = new_topic(3)
    df = spark.createDataFrame(rows, flat).repartition(4, "user")  # one task has the line break, the others not
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, key="user")).save()

    raw = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).load().collect()
    expected = [orjson.dumps(dict(zip(("user", "n", "i", "score", "f", "ok"), r, strict=True))) for r in rows]

    def as_read(values: Any) -> list[str]:  # repr: 100.0 and 100, -0.0 and 0 differ
        return sorted(repr(orjson.loads(v)) for v in values)

    assert as_read(r.value for r in raw) == as_read(expected)
    back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).schema(flat).load()
    assert back.count() == 84 and back.where("user = 'line\nbreak'").count() == sum(r[0] == "line\nbreak" for r in rows)


def test_a_null_value_fails_the_write_naming_the_row_and_commits_nothing(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    df = spark.createDataFrame([("a", "1"), ("b", None), ("c", "3")], "user string, v string").coalesce(1)
    with pytest.raises(PySparkException, match=r"column 'v' \(option 'value'\) is null in row 1 of the task"):
        df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, value="v")).save()
    assert run_status(options(topic, bootstrap_servers)) is None
    assert [r for r in dump_topic(kafka_config, topic) if r.kind == "data"] == []  # aborted: nothing readable
    number = spark.createDataFrame([("a", 1)], "user string, v int")
    with pytest.raises(PySparkException, match="'v' must be a string or binary column"):
        number.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, value="v")).save()
    with pytest.raises(PySparkException, match="option 'value': no column 'nope'"):
        number.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers,
                                                                            value="nope")).save()


def test_read_metadata_fields_and_binary_key(spark: SparkSession, bootstrap_servers: str,
                                             new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    df = spark.createDataFrame([("a", 1), ("b", 2), ("a", 3)], "user string, n int").repartition(2)
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, key="user")).save()
    back = (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers))
            .schema("n int, _key binary, _partition int, _offset long").load().collect())
    assert sorted((r.n, bytes(r._key)) for r in back) == [(1, b"a"), (2, b"b"), (3, b"a")]
    assert len({(r._partition, r._offset) for r in back}) == 3


def test_an_empty_dataframe_still_ends_the_stream(spark: SparkSession, bootstrap_servers: str,
                                                  new_topic: Callable[..., str]) -> None:
    topic = new_topic(3)
    df = spark.createDataFrame([], "user string, n int").repartition(2)
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers)).save()
    status = run_status(options(topic, bootstrap_servers))
    assert status is not None and status["ended"] and status["rows"] == 0
    back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).load()
    assert back.count() == 0  # ends: every task's end of stream is there


def test_the_topic_is_created_when_missing(spark: SparkSession, bootstrap_servers: str,
                                           kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    from controlmsg.kafka import partition_count

    topic = new_topic(1) + "-created"
    df = spark.createDataFrame([("a", 1)], "user string, n int")
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, partitions="6")).save()
    assert partition_count(kafka_config, topic) == 6
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        list(reader.read_until_end(timeout=30))
        assert reader.tracker.is_ended


def test_refusals_are_clear(spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    df = spark.createDataFrame([("a", 1)], "user string, n int")
    def writer() -> Any:  # a DataFrameWriter keeps the options set on it: a fresh one each time
        return df.write.format("controlmsg").options(**options(topic, bootstrap_servers))

    with pytest.raises(PySparkException, match="only appends"):
        writer().mode("overwrite").save()
    for refused_by_spark in ("errorifexists", "ignore"):  # before the source is even called
        with pytest.raises(PySparkException, match=r"(?i)mode"):
            writer().mode(refused_by_spark).save()
    with pytest.raises(PySparkException, match="no column 'nope'"):
        writer().mode("append").option("key", "nope").save()
    with pytest.raises(PySparkException, match="must be a timestamp, a date or epoch"):
        writer().mode("append").option("eventTime", "user").save()
    with pytest.raises(PySparkException, match=r"kafka\.bootstrap\.servers"):
        df.write.format("controlmsg").mode("append").option("topic", topic).option("runId", "x").save()
    writer().mode("append").save()
    with pytest.raises(PySparkException, match="has already ended"):
        writer().mode("append").save()  # the same run again: its records are there, and it has ended
    with pytest.raises(PySparkException, match="readStream only"):
        (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers))
         .schema("n int, _watermark timestamp").load().collect())
    with pytest.raises(PySparkException, match=r"(?i)option 'evenTime' is not an option .*did you mean 'eventTime'"):
        writer().mode("append").option("evenTime", "n").save()
    with pytest.raises(PySparkException, match=r"(?i)option 'startingOffset' is not an option .*'startingOffsets'"):
        spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers)).option(
            "startingOffset", "latest").load().writeStream.format("console").start().awaitTermination(60)
    with pytest.raises(PySparkException, match=r"takes no path \(load\(\) and save\(\) were given 'events'"):
        spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).load("events").collect()


@pytest.mark.parametrize("run_tag", ["envelope", "headers"])
def test_reader_takes_only_its_run(spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str],
                                   run_tag: str) -> None:
    """Runs share a topic whether they name themselves in the envelope (the default) or in headers; a run
    whose id begins like the one read ("new" and "new2") is another run."""
    topic = new_topic(2)
    for run, values in (("old", [1, 2, 3]), ("new", [10, 20]), ("new2", [30]), ("ne", [40])):
        df = spark.createDataFrame([(v,) for v in values], "n int").repartition(2)
        df.write.format("controlmsg").mode("append").options(
            **options(topic, bootstrap_servers, run, runTag=run_tag)).save()
    back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers, "new")).schema("n int").load()
    assert sorted(r.n for r in back.collect()) == [10, 20]
    stream = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, "new"))
              .schema("n int").load())
    query = stream.writeStream.format("memory").queryName(f"runs_{run_tag}").trigger(availableNow=True).start()
    assert query.awaitTermination(120) and query.exception() is None
    assert sorted(r.n for r in spark.table(f"runs_{run_tag}").collect()) == [10, 20]


def test_a_dataframe_without_partitions_still_ends_the_stream(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    # An empty RDD, and a filter the optimizer turns into an empty relation: Spark runs no write task.
    for run, empty in (
        ("r1", spark.createDataFrame(spark.sparkContext.emptyRDD(), "user string, n int")),
        ("r2", spark.createDataFrame([("a", 1)], "user string, n int").filter("1 = 0")),
    ):
        topic = new_topic(2)
        empty.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, run)).save()
        name = f"spark-{run}-driver"
        assert count_by(dump_topic(kafka_config, topic), "eos") == {(0, name): 1, (1, name): 1}
        back = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers, run)).load()
        assert back.collect() == []


def test_spark_finds_the_source_by_itself() -> None:
    """Spark registers the ``DefaultSource`` of every module named ``pyspark_*`` on its path
    (``pyspark.sql.worker.lookup_data_sources``): the installed ``pyspark_controlmsg`` is one."""
    import pkgutil

    import pyspark_controlmsg
    from controlmsg.spark import ControlMsgDataSource

    assert "pyspark_controlmsg" in {m.name for m in pkgutil.iter_modules()}
    assert pyspark_controlmsg.DefaultSource is ControlMsgDataSource
    assert ControlMsgDataSource.name() == "controlmsg"


def test_the_session_helper_keeps_sparks_own_registration() -> None:
    """``spark_session()`` in a new application: Spark has found the source by itself, so the helper
    leaves that registration as it is (no "replaced a statically registered data source" warning) and
    the source is there; a second ``register`` changes nothing either."""
    import subprocess
    import sys

    script = ("from controlmsg.spark import register, spark_session\n"
              "spark = spark_session('local[1]', 'registration', class_archive=False)\n"
              "register(spark)\n"
              "print('known', spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists('controlmsg'))\n"
              "spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["known", "True"]
    assert "replaced a statically registered data source" not in done.stderr


def test_secret_options_stay_out_of_the_query_plan(spark: SparkSession, bootstrap_servers: str,
                                                   new_topic: Callable[..., str]) -> None:
    """What the Spark UI and the event log show of a query is its plan: it must not carry the passwords a
    user gives as ``kafka.*`` options."""
    topic = new_topic(1)
    df = (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers))
          .option("kafka.sasl.password", "S3CRET-xyz").option("kafka.ssl.key.password", "K3Y-xyz").load())
    plans = df._jdf.queryExecution().toString()
    assert "controlmsg" in plans
    assert "S3CRET-xyz" not in plans and "K3Y-xyz" not in plans


CONNECTOR_COLUMNS = ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
                     "timestampType:int")
HEADERS = "array<struct<key:string,value:binary>>"


def test_a_headers_column_is_written_as_record_headers_beside_ours(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str]) -> None:
    """``format("kafka")``'s ``headers`` column: each row's headers go on its record (after controlmsg's own
    with ``runTag headers``, the run first, which readers look at), not into the JSON value; a read gives
    them back in ``headers`` (``includeHeaders``) or ``_headers`` without controlmsg's. A header named like
    ours fails the task."""
    from pyspark.sql import functions as F

    topic = new_topic(2)
    df = spark.createDataFrame([("a", 1, [("trace", b"t-1"), ("empty", None)]), ("b", 2, None), ("c", 3, [])],
                               f"user string, n int, headers {HEADERS}").coalesce(1)
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, key="user")).save()
    wire = {r.value["user"]: r for r in dump_topic(kafka_config, topic) if r.kind == "data"}
    assert wire["a"].value == {"user": "a", "n": 1}  # not in the value
    assert wire["a"].headers == (("trace", b"t-1"), ("empty", None)) and wire["a"].run == "r1"  # the run: envelope
    assert wire["b"].headers == ()
    headed = new_topic(1)
    df.write.format("controlmsg").mode("append").options(**options(headed, bootstrap_servers, runTag="headers")).save()
    on_wire = {r.value["user"]: r for r in dump_topic(kafka_config, headed) if r.kind == "data"}
    assert [k for k, _ in on_wire["a"].headers] == ["controlmsg-run", "controlmsg-task", "trace", "empty"]
    assert on_wire["a"].headers[2:] == (("trace", b"t-1"), ("empty", None))
    assert [k for k, _ in on_wire["b"].headers] == ["controlmsg-run", "controlmsg-task"]

    raw = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers, includeHeaders="true")).load()
    assert raw.schema.simpleString() == f"{CONNECTOR_COLUMNS},headers:{HEADERS}>"
    got = {bytes(r.key).decode(): r.headers for r in raw.collect()}
    assert [(h.key, h.value) for h in got["a"]] == [("trace", b"t-1"), ("empty", None)]  # ours left out
    assert got["b"] is None and got["c"] is None
    parsed = (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers))
              .schema(f"user string, _headers {HEADERS}, _topic string").load())
    assert parsed.where(F.size("_headers") == 2).select("user", "_topic").collect() == [("a", topic)]

    clash = spark.createDataFrame([("x", [("controlmsg-run", b"other")])], f"user string, headers {HEADERS}")
    with pytest.raises(PySparkException, match=r"row 0 of the task has a header named 'controlmsg-run', and names "
                                               r"starting 'controlmsg-' are controlmsg's own"):
        clash.write.format("controlmsg").mode("append").options(**options(new_topic(1), bootstrap_servers)).save()
    wrong = spark.createDataFrame([("x", [(1, b"v")])], "user string, headers array<struct<key:int,value:binary>>")
    with pytest.raises(PySparkException, match="column 'headers' \\(record headers\\) must be"):
        wrong.write.format("controlmsg").mode("append").options(**options(new_topic(1), bootstrap_servers)).save()


def test_an_intermediate_topic_has_the_connectors_columns_and_refuses_plain_options(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    """A read without a schema gives ``format("kafka")``'s columns and types; the options that position or
    bound a read of a plain topic are refused on an intermediate topic, which is read from its run's start
    to its end of stream, each in one line that says why."""
    from pyspark.sql import functions as F

    from controlmsg.spark.options import ReadOptions

    topic = new_topic(2)
    df = spark.createDataFrame([("a", 1), ("b", 2)], "user string, n int")
    df.write.format("controlmsg").mode("append").options(**options(topic, bootstrap_servers, key="user")).save()
    raw = spark.read.format("controlmsg").options(**options(topic, bootstrap_servers)).load()
    assert raw.schema.simpleString() == CONNECTOR_COLUMNS + ">"
    rows = raw.select(F.col("key").cast("string").alias("k"), F.col("value").cast("string").alias("v"), "topic",
                      "timestampType", (F.unix_millis("timestamp") > 1_700_000_000_000).alias("recent")).collect()
    assert sorted(rows) == [("a", '{"user":"a","n":1}', topic, 0, True), ("b", '{"user":"b","n":2}', topic, 0, True)]
    same = (spark.read.format("controlmsg").options(**options("", bootstrap_servers)).option("subscribe", topic)
            .schema("n int").load())  # subscribe of one topic: the topic
    assert sorted(r.n for r in same.collect()) == [1, 2]

    refused = {
        "startingOffsets": ("earliest", "starts where its run starts"),
        "startingTimestamp": ("1000", "starts where its run starts"),
        "endingOffsets": ("latest", "ends at its run's end of stream"),
        "endingOffsetsByTimestamp": ('{"t": {"0": 1}}', "ends at its run's end of stream"),
        "subscribePattern": ("t.*", "give it as 'topic'"),
        "failOnDataLoss": ("false", "a gap breaks its run's bookkeeping"),
        "minPartitions": ("8", "use 'maxTasks' or 'partitionsPerTask'"),
    }
    for name, (value, why) in refused.items():
        opts = {**options(topic, bootstrap_servers), name: value}
        if name == "subscribePattern":
            del opts["topic"]
        with pytest.raises(ValueError, match=f"option '{name}'.*{why}"):
            ReadOptions.parse(opts)
    with pytest.raises(ValueError, match="several topics are for a plain topic"):
        ReadOptions.parse({**options("", bootstrap_servers), "subscribe": f"{topic},other"})
    with pytest.raises(PySparkException, match="option 'startingOffsets' is for a plain topic"):
        (spark.read.format("controlmsg").options(**options(topic, bootstrap_servers, startingOffsets="earliest"))
         .load().collect())
