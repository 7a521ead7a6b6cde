"""Reading a plain topic (option ``envelope none``: records any producer wrote) with ``format("controlmsg")``,
on a real broker and SparkSession: batch, and a stateless streaming stage that parses it, keys it and
writes an intermediate topic, whose run ends by itself at the end of a bounded input; a restart repeats
nothing; bad records go to the dead-letter topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from controlmsg.kafka import create_topic
from controlmsg.spark import run_status
from tests.spark.helpers import options, read

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = "id long, user string, event_time timestamp, amount double"


def produce(config: dict[str, Any], topic: str, ids: range, *, partitions: int) -> list[dict[str, Any]]:
    """Plain JSON records, as an application writes them (no envelope), spread over the partitions."""
    producer = Producer(config)
    sent: list[dict[str, Any]] = []
    for i in ids:
        value: dict[str, Any] = {"id": i, "user": f"u{i % 7}", "amount": i / 4,
                                 "event_time": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z"}
        producer.produce(topic, orjson.dumps(value), key=value["user"].encode(), partition=i % partitions)
        sent.append(value)
    producer.flush(30)
    return sent


def plain(topic: str, servers: str, **more: str) -> dict[str, str]:
    opts = {"topic": topic, "envelope": "none", "kafka.bootstrap.servers": servers, "timeout": "60", **more}
    return opts


def test_batch_read_of_a_plain_topic_with_a_schema_and_dead_letters(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    topic, dead = new_topic(3), new_topic(1)
    sent = produce(kafka_config, topic, range(500), partitions=3)
    producer = Producer(kafka_config)
    producer.produce(topic, b"not json", partition=1)
    producer.produce(topic, b'{"id": 9999, "amount": 1}', partition=1)  # no user, declared NOT NULL
    producer.flush(30)
    df = spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers, deadLetterTopic=dead)) \
        .schema("id long, user string not null, event_time timestamp, amount double, _partition int, "
                "_offset long, _key string").load()
    rows = df.collect()
    assert sorted(r["id"] for r in rows) == [v["id"] for v in sent]
    assert all(r["_key"] == r["user"] and r["_partition"] == r["id"] % 3 for r in rows)
    raw = spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers)).load()
    assert raw.count() == 502  # partition, offset, key, value: every record, the bad one too
    consumer = Consumer({**kafka_config, "group.id": "dl", "auto.offset.reset": "earliest"})
    consumer.subscribe([dead])
    letters: list[Any] = []
    deadline = time.monotonic() + 30
    while len(letters) < 2 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            letters.append(msg)
    consumer.close()
    assert [m.value() for m in letters] == [b"not json", b'{"id": 9999, "amount": 1}']
    headers = dict(letters[0].headers() or [])
    assert any(topic.encode() in v for v in headers.values() if isinstance(v, bytes))


def test_a_plain_topic_refuses_watermark_columns(spark: SparkSession, bootstrap_servers: str,
                                                 new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    # The reader Spark makes on the driver, made here: a query's start would add only a Python worker's start.
    from pyspark.sql.types import StructType

    from controlmsg.spark.options import ReadOptions
    from controlmsg.spark.reading.plain_readers import PlainBatchReader, PlainStreamReader

    schema = StructType.fromDDL(f"{SCHEMA}, _watermark timestamp")
    assert isinstance(schema, StructType)
    for reader in (PlainStreamReader, PlainBatchReader):
        with pytest.raises(ValueError, match="plain topic"):
            reader(ReadOptions.parse(plain(topic, bootstrap_servers)), schema)


def test_a_stateless_stage_over_a_plain_topic_ends_its_run_with_a_bounded_input(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """An ingest stage: plain source -> parsed, keyed, Spark's withWatermark -> intermediate topic. Stopped
    after a first micro-batch under a processing-time trigger, more records arrive, then run again with
    availableNow and availableNowEnds: every record exactly once, the run ended by itself, and its
    watermark is Spark's (largest event time minus the delay) rather than none."""
    source, out = new_topic(4), f"plain-out-{time.monotonic_ns()}"
    create_topic(kafka_config, out, 3)
    sent = produce(kafka_config, source, range(0, 300), partitions=4)
    checkpoint = str(tmp_path / "ckpt")
    # allowedLateness as the delay: Spark has no watermark in a query's first micro-batch, where the writer
    # takes eventTime minus allowedLateness instead.
    write_opts = options(out, bootstrap_servers, "ingest-1", key="user", eventTime="event_time",
                         allowedLateness="10s")

    def stage(**trigger: Any) -> Any:
        events = (spark.readStream.format("controlmsg")
                  .options(**plain(source, bootstrap_servers, availableNowEnds="true", maxTasks="3"))
                  .schema(SCHEMA).load()
                  .withWatermark("event_time", "10 seconds")
                  .select("id", "user", "event_time", "amount"))
        return (events.writeStream.format("controlmsg").options(**write_opts)
                .option("checkpointLocation", checkpoint).trigger(**trigger).start())

    first = stage(processingTime="1 second")
    deadline = time.monotonic() + 120
    while (first.lastProgress is None or not first.lastProgress["numInputRows"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    first.stop()
    status = run_status(write_opts)
    assert status is not None and not status.get("ended")
    sent += produce(kafka_config, source, range(300, 700), partitions=4)
    second = stage(availableNow=True)
    assert second.awaitTermination(180)
    assert second.exception() is None
    status = run_status(write_opts)
    assert status is not None and status["ended"], status
    last = max(v["id"] for v in sent)
    assert 0 < status["watermark"] - 1_767_225_600_000 <= (last // 60 * 60 + last % 60) * 1000 - 10_000
    got = read(spark, out, bootstrap_servers, "ingest-1", schema="id long, user string, amount double")
    ids = [r["id"] for r in got.collect()]
    assert sorted(ids) == list(range(700)), "every source record once"
    assert got.where(F.col("amount") * 4 != F.col("id")).count() == 0


# ------------------------------------------------------------------------------------ format("kafka")'s ways
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HEADERS = "array<struct<key:string,value:binary>>"


def produce_timed(config: dict[str, Any], topic: str, partitions: int, count: int) -> None:
    """``count`` records on each partition, record ``i`` stamped ``T0 + i`` seconds, value
    ``{"id": i, "p": partition}``."""
    producer = Producer(config)
    for p in range(partitions):
        for i in range(count):
            producer.produce(topic, orjson.dumps({"id": i, "p": p}), partition=p, timestamp=T0 + i * 1000)
    producer.flush(30)


def test_a_read_has_the_connectors_columns_and_headers(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    """Without a schema: ``format("kafka")``'s columns in its order and types, ``headers`` with
    ``includeHeaders``; a JSON schema asks for them with ``_``; the raw names of before still work."""
    topic = new_topic(2)
    producer = Producer(kafka_config)
    producer.produce(topic, b'{"id": 1}', key=b"k1", partition=0, timestamp=T0, headers=[("h", b"v"), ("n", None)])
    producer.produce(topic, b'{"id": 2}', partition=1, timestamp=T0 + 1000)
    producer.flush(30)
    df = spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers, includeHeaders="true")).load()
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        f"timestampType:int,headers:{HEADERS}>")
    rows = sorted(df.select("*", F.unix_millis("timestamp").alias("ms")).collect(), key=lambda r: r.partition)
    assert [(r.key, bytes(r.value), r.topic, r.partition, r.offset, r.ms, r.timestampType) for r in rows] == [
        (b"k1", b'{"id": 1}', topic, 0, 0, T0, 0), (None, b'{"id": 2}', topic, 1, 0, T0 + 1000, 0)]
    assert [(h.key, h.value) for h in rows[0].headers] == [("h", b"v"), ("n", None)] and rows[1].headers is None
    no_headers = spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers)).load()
    assert "headers" not in no_headers.columns
    parsed = (spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers))
              .schema(f"id long, _topic string, _timestamp timestamp, _timestampType int, _headers {HEADERS}, "
                      "_key string, _partition int, _offset long").load()
              .select("id", "_topic", F.unix_millis("_timestamp"), "_timestampType", F.size("_headers"), "_key",
                      "_partition", "_offset"))
    assert sorted(map(tuple, parsed.collect())) == [(1, topic, T0, 0, 2, "k1", 0, 0),
                                                    (2, topic, T0 + 1000, 0, None, None, 1, 0)]
    before = (spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers))
              .schema("partition int, offset long, key string, value string").load())
    assert sorted(map(tuple, before.collect())) == [(0, 0, "k1", '{"id": 1}'), (1, 0, None, '{"id": 2}')]
    with pytest.raises(PySparkException, match="the field '_timestamp' is the record's timestamp: declare it "
                                               "timestamp, not string"):
        (spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers))
         .schema("id long, _timestamp string").load().collect())


def test_batch_reads_positioned_and_bounded_as_format_kafka(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    """``subscribe`` of two topics, ``subscribePattern``, ``assign``; ``startingOffsets``/``endingOffsets``
    as JSON, the timestamp forms and their strategy; the refusals, each in one line."""
    prefix = f"pos-{time.monotonic_ns()}"
    a, b = new_topic(2, prefix=f"{prefix}-a"), new_topic(1, prefix=f"{prefix}-b")
    produce_timed(kafka_config, a, 2, 10)
    produce_timed(kafka_config, b, 1, 10)

    def ids(**more: str) -> list[tuple[str, int, int]]:
        opts = {"envelope": "none", "kafka.bootstrap.servers": bootstrap_servers, "timeout": "30", **more}
        df = spark.read.format("controlmsg").options(**opts).schema("id long, _topic string, _partition int").load()
        return sorted(({a: "a", b: "b"}[r._topic], r._partition, r.id) for r in df.collect())

    def count(**more: str) -> dict[tuple[str, int], list[int]]:
        out: dict[tuple[str, int], list[int]] = {}
        for t, p, i in ids(**more):
            out.setdefault((t, p), []).append(i)
        return out

    assert {k: len(v) for k, v in count(subscribe=f"{a},{b}").items()} == {("a", 0): 10, ("a", 1): 10, ("b", 0): 10}
    assert count(subscribe=f"{a},{b}", startingOffsets=f'{{"{a}": {{"0": 3, "1": -2}}, "{b}": {{"0": 5}}}}',
                 endingOffsets=f'{{"{a}": {{"0": 7, "1": -1}}, "{b}": {{"0": 6}}}}') == {
        ("a", 0): [3, 4, 5, 6], ("a", 1): list(range(10)), ("b", 0): [5]}
    assert count(subscribe=f"{a},{b}", startingTimestamp=str(T0 + 4000), endingTimestamp=str(T0 + 6000)) == {
        ("a", 0): [4, 5], ("a", 1): [4, 5], ("b", 0): [4, 5]}
    by_time = f'{{"{a}": {{"0": {T0 + 8000}, "1": {T0}}}, "{b}": {{"0": {T0 + 99_000}}}}}'
    assert count(subscribe=f"{a},{b}", startingOffsetsByTimestamp=by_time,
                 startingOffsetsByTimestampStrategy="latest") == {("a", 0): [8, 9], ("a", 1): list(range(10))}
    assert {k: len(v) for k, v in count(subscribePattern=f"{prefix}-.*",
                                        endingOffsetsByTimestamp=f'{{"{a}": {{"0": {T0 + 2000}, "1": 0}}, '
                                                                 f'"{b}": {{"0": {T0 + 99_000}}}}}').items()} == {
        ("a", 0): 2, ("b", 0): 10}
    assert count(assign=f'{{"{a}": [1]}}', startingOffsets=f'{{"{a}": {{"1": 8}}}}') == {("a", 1): [8, 9]}

    refusals = {
        "has no record at or after": {"subscribe": b, "startingTimestamp": str(T0 + 99_000)},
        "'startingOffsets' latest is for streams": {"subscribe": b, "startingOffsets": "latest"},
        f"must name every partition read, and only those .*missing {a}:1": {
            "subscribe": a, "startingOffsets": f'{{"{a}": {{"0": 1}}}}'},
        "ends at 10 now, before 20": {"subscribe": b, "endingOffsets": f'{{"{b}": {{"0": 20}}}}'},
        "would start at 5 \\(startingOffsets\\) after it ends at 2": {
            "subscribe": b, "startingOffsets": f'{{"{b}": {{"0": 5}}}}', "endingOffsets": f'{{"{b}": {{"0": 2}}}}'},
        "give one of the options 'subscribe', 'subscribePattern'": {"subscribe": b, "subscribePattern": "x"},
    }
    for message, more in refusals.items():
        with pytest.raises(PySparkException, match=message):
            ids(**more)


def test_failOnDataLoss_fails_on_deleted_offsets_or_reads_on(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    """Offsets to be read that retention deleted: the read fails naming them (the default, as Spark's), or
    with ``failOnDataLoss false`` reads on from the log start; a stream the same, from its logged offsets."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    from controlmsg.spark.options import ReadOptions
    from controlmsg.spark.reading.plain_offsets import DataLoss
    from controlmsg.spark.reading.plain_readers import PlainStreamReader

    topic = new_topic(1)
    produce_timed(kafka_config, topic, 1, 10)
    admin = AdminClient(kafka_config)
    for future in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        future.result(30)
    from_two = f'{{"{topic}": {{"0": 2}}}}'
    with pytest.raises(PySparkException, match=r"offset 2, but the partition holds 4 to 10 now: records were lost"):
        spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers, startingOffsets=from_two)).load() \
            .collect()
    kept = spark.read.format("controlmsg").options(**plain(topic, bootstrap_servers, startingOffsets=from_two,
                                                           failOnDataLoss="false")).schema("id long").load()
    assert sorted(r.id for r in kept.collect()) == [4, 5, 6, 7, 8, 9]

    schema = StructType.fromDDL("id long")
    assert isinstance(schema, StructType)
    logged = {"format": 2, "envelope": "none", "offsets": {topic: {"0": 1}}, "ended": False}
    strict = PlainStreamReader(ReadOptions.parse(plain(topic, bootstrap_servers)), schema)
    with pytest.raises(DataLoss, match="the query's next offset is offset 1"):
        strict.latestOffset(logged, ReadAllAvailable())
    strict.stop()
    lenient = PlainStreamReader(ReadOptions.parse(plain(topic, bootstrap_servers, failOnDataLoss="false")), schema)
    end = lenient.latestOffset(logged, ReadAllAvailable())
    assert end["offsets"] == {topic: {"0": 10}} and end["from"] == {topic: {"0": 4}}
    [task] = lenient.partitions(logged, end)
    assert (task.topic, task.ranges) == (topic, ((0, 4, 10),))  # type: ignore[attr-defined]
    before = {"format": 1, "envelope": "none", "offsets": {"0": 1}, "ended": False}  # a query started before
    assert lenient.latestOffset(before, ReadAllAvailable())["from"] == {topic: {"0": 4}}
    lenient.stop()


def test_a_stream_waits_for_minOffsetsPerTrigger_at_most_maxTriggerDelay(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    """The driver's side of a micro-batch (what Spark asks the reader before each one), as in Spark's
    connector: the first fires, then a micro-batch waits for ``minOffsetsPerTrigger`` new offsets, or
    ``maxTriggerDelay`` since the last one."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import LongType, StructField, StructType

    from controlmsg.spark.options import ReadOptions
    from controlmsg.spark.reading.plain_readers import PlainStreamReader

    topic = new_topic(2)
    schema = StructType([StructField("id", LongType())])  # no SparkSession needed for the driver's side
    every = ReadAllAvailable()
    patient, hasty = (PlainStreamReader(ReadOptions.parse(plain(topic, bootstrap_servers, minOffsetsPerTrigger="5",
                                                                maxTriggerDelay=delay)), schema)
                      for delay in ("1h", "1s"))
    try:
        start = patient.initialOffset()
        assert hasty.initialOffset() == start
        assert patient.latestOffset(start, every) == start  # nothing there
        produce_timed(kafka_config, topic, 1, 3)
        first = patient.latestOffset(start, every)
        assert first["offsets"] == {topic: {"0": 3, "1": 0}}  # the first fires (no trigger before it)
        assert hasty.latestOffset(start, every)["offsets"] == first["offsets"]
        produce_timed(kafka_config, topic, 2, 2)  # 4 more: fewer than 5
        assert patient.latestOffset(first, every) == first
        time.sleep(1.1)  # maxTriggerDelay since hasty's last micro-batch: it fires with what there is
        assert hasty.latestOffset(first, every)["offsets"] == {topic: {"0": 5, "1": 2}}
        produce_timed(kafka_config, topic, 1, 1)  # 5 now
        assert patient.latestOffset(first, every)["offsets"] == {topic: {"0": 6, "1": 2}}
    finally:
        patient.stop()
        hasty.stop()


def test_a_stream_of_several_topics_from_a_timestamp_to_the_end_of_a_bounded_input(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """``subscribe`` of two topics from ``startingTimestamp``, read under ``availableNow``: what the topics
    held at the start from that time on, once; ``endingOffsets`` is refused on a stream."""
    a, b = new_topic(2), new_topic(1)
    produce_timed(kafka_config, a, 2, 6)
    produce_timed(kafka_config, b, 1, 6)
    opts = plain("", bootstrap_servers, subscribe=f"{a},{b}", startingTimestamp=str(T0 + 3000))
    query = (spark.readStream.format("controlmsg").options(**opts).schema("id long, p int, _topic string").load()
             .writeStream.format("memory").queryName("several_topics")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    got = sorted(tuple(r) for r in spark.sql("SELECT _topic, p, id FROM several_topics").collect())
    assert got == sorted((t, p, i) for t, n in ((a, 2), (b, 1)) for p in range(n) for i in (3, 4, 5))
    with pytest.raises(PySparkException, match="option 'endingOffsets' is for batch reads; a stream reads on"):
        (spark.readStream.format("controlmsg").options(**plain(a, bootstrap_servers, endingOffsets="latest"))
         .load().writeStream.format("memory").queryName("refused").start().awaitTermination(30))
