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
    from controlmsg.spark.plain import PlainBatchReader, PlainStreamReader

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
