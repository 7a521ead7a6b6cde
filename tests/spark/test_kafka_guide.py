"""The examples of Spark's "Structured Streaming + Kafka Integration Guide" (Spark 4.x, its Python tab), each
run with ``format("controlmsg")`` in place of ``format("kafka")`` against a real broker and SparkSession,
changing nothing else but what docs/SPARK.md says must change (each change is marked ``# changed:`` and
named in :data:`EXAMPLES`).

Every example ends one of three ways, and the README counts them from :data:`EXAMPLES`:

- ``unchanged``: it runs as the guide writes it (the format's name aside) and gives the guide's rows;
- ``changed``: as the guide writes it, it is refused in one line that names the change; with the change
  docs/SPARK.md documents, it runs and gives the guide's rows;
- ``refused``: the source refuses it when the query is defined or started, with the one line named here.

None runs with a result other than the guide's: each is checked as the guide writes it first.

What the guide leaves out and both sources need is added to both without counting as a change: the broker's
address in place of ``host1:port1,host2:port2``, the topics' names, a checkpoint location for a streaming
write (the guide's Python examples leave it to ``spark.sql.streaming.checkpointLocation``), and a
``trigger(availableNow=True)`` with a memory sink where the guide's stream is left unconsumed.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, Row, SparkSession

from controlmsg.kafka import create_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

FORMAT = "controlmsg"
RECORDS = 40  # per plain topic: topic1 has 2 partitions, topic2 1
PLAIN = {"envelope": "none"}  # the documented change of a read: a topic any producer writes


@dataclass(frozen=True)
class Topics:
    """A test's own topics: two plain topics whose names share a prefix (for ``subscribePattern``), the
    intermediate topic the write examples write, and where a streaming write keeps its checkpoint."""

    servers: str
    topic1: str
    topic2: str
    pattern: str
    out: str
    run: str
    checkpoint: str


@dataclass(frozen=True)
class Example:
    """One of the guide's examples: ``outcome`` is ``unchanged``, ``changed`` or ``refused``; ``changes`` says
    what changed (docs/SPARK.md's words); ``refusal`` is a pattern of the one line that refuses the example as
    the guide writes it (``run(spark, topics, False)``), which names the change; ``run(spark, topics, True)``
    runs it with the change."""

    name: str
    outcome: str
    changes: str
    refusal: str
    run: Callable[[SparkSession, Topics, bool], Any]


def drain(df: DataFrame, name: str) -> list[Row]:
    """Runs a streaming DataFrame to what its source holds (``availableNow``) into a memory table."""
    table = f"guide_{name}_{uuid.uuid4().hex[:6]}"
    query = df.writeStream.format("memory").queryName(table).trigger(availableNow=True).start()
    query.awaitTermination(180)
    assert not query.isActive, f"{name}: the query did not end"
    rows = df.sparkSession.sql(f"SELECT * FROM {table}").collect()
    df.sparkSession.catalog.dropTempView(table)
    return rows


# ------------------------------------------------------------------------------------- reading a stream

def stream_one_topic(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to 1 topic
    df = spark \
        .readStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribe", t.topic1) \
        .load()  # changed: envelope none, a plain topic
    return drain(df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)"), "one")


def stream_one_topic_with_headers(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to 1 topic, with headers
    df = spark \
        .readStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribe", t.topic1) \
        .option("includeHeaders", "true") \
        .load()  # changed: envelope none
    return drain(df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "headers"), "headers")


def stream_several_topics(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to multiple topics
    df = spark \
        .readStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribe", f"{t.topic1},{t.topic2}") \
        .load()  # changed: envelope none
    return drain(df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)"), "several")


def stream_pattern(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to a pattern
    df = spark \
        .readStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribePattern", t.pattern) \
        .load()  # changed: envelope none
    return drain(df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)"), "pattern")


# ------------------------------------------------------------------------------------- reading a batch

def batch_one_topic(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to 1 topic defaults to the earliest and latest offsets
    df = spark \
        .read \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribe", t.topic1) \
        .load()  # changed: envelope none
    return df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()


def batch_explicit_offsets(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to multiple topics, specifying explicit Kafka offsets
    df = spark \
        .read \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribe", f"{t.topic1},{t.topic2}") \
        .option("startingOffsets", f"""{{"{t.topic1}":{{"0":3,"1":-2}},"{t.topic2}":{{"0":-2}}}}""") \
        .option("endingOffsets", f"""{{"{t.topic1}":{{"0":10,"1":-1}},"{t.topic2}":{{"0":-1}}}}""") \
        .load()  # changed: envelope none
    return df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()


def batch_pattern(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    # Subscribe to a pattern, at the earliest and latest offsets
    df = spark \
        .read \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .options(**(PLAIN if changed else {})) \
        .option("subscribePattern", t.pattern) \
        .option("startingOffsets", "earliest") \
        .option("endingOffsets", "latest") \
        .load()  # changed: envelope none
    return df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()


# ------------------------------------------------------------------------------------- writing

def _plain_stream(spark: SparkSession, t: Topics) -> DataFrame:
    """The guide's ``df`` of the write examples: a stream of a plain topic, here ending at what it holds."""
    return spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", t.servers) \
        .option("envelope", "none").option("subscribe", t.topic1).option("availableNowEnds", "true").load()


def _written(spark: SparkSession, t: Topics) -> list[Row]:
    """What the write examples wrote: the intermediate topic's run, read to its end of stream."""
    return spark.read.format(FORMAT).option("kafka.bootstrap.servers", t.servers).option("topic", t.out) \
        .option("runId", t.run).option("timeout", "60").load() \
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()


def _kafka_write(t: Topics) -> dict[str, str]:
    """The documented change of a write: the run, and the columns that are the record's key and value."""
    return {"runId": t.run, "key": "key", "value": "value"}


def stream_write_topic_option(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    df = _plain_stream(spark, t)
    # Write key-value data from a DataFrame to a specific Kafka topic specified in an option
    ds = df \
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .writeStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .option("topic", t.out) \
        .options(**(_kafka_write(t) if changed else {})) \
        .option("checkpointLocation", t.checkpoint) \
        .trigger(availableNow=True) \
        .start()  # changed: runId, key and value name their columns
    ds.awaitTermination(180)
    return _written(spark, t)


def stream_write_topic_column(spark: SparkSession, t: Topics, changed: bool) -> Any:
    df = _plain_stream(spark, t).selectExpr(f"'{t.out}' AS topic", "key", "value")
    # Write key-value data from a DataFrame to Kafka using a topic specified in the data
    ds = df \
        .selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \
        .writeStream \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .option("checkpointLocation", t.checkpoint) \
        .start()
    ds.awaitTermination(180)


def _plain_batch(spark: SparkSession, t: Topics) -> DataFrame:
    return spark.read.format(FORMAT).option("kafka.bootstrap.servers", t.servers) \
        .option("envelope", "none").option("subscribe", t.topic1).load()


def batch_write_topic_option(spark: SparkSession, t: Topics, changed: bool) -> list[Row]:
    df = _plain_batch(spark, t)
    # Write key-value data from a DataFrame to a specific Kafka topic specified in an option
    df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .write \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .option("topic", t.out) \
        .options(**(_kafka_write(t) if changed else {})) \
        .mode("append" if changed else "errorifexists") \
        .save()  # changed: runId, key and value name their columns, mode append (errorifexists: the default)
    return _written(spark, t)


def batch_write_topic_column(spark: SparkSession, t: Topics, changed: bool) -> Any:
    df = _plain_batch(spark, t).selectExpr(f"'{t.out}' AS topic", "key", "value")
    # Write key-value data from a DataFrame to Kafka using a topic specified in the data
    df.selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \
        .write \
        .format(FORMAT) \
        .option("kafka.bootstrap.servers", t.servers) \
        .mode("append") \
        .save()


READ = r"envelope none"  # no runId, several topics or a pattern: each line names the option of a plain read
KAFKA_COLUMNS = r"are format\('kafka'\)'s, but a controlmsg writer takes a column as the record's payload only by"
TOPIC_COLUMN = r"a 'topic' column does not choose the topic"
EXAMPLES = [
    Example("readStream, subscribe to 1 topic", "changed", "envelope none", READ, stream_one_topic),
    Example("readStream, 1 topic with headers", "changed", "envelope none", READ, stream_one_topic_with_headers),
    Example("readStream, multiple topics", "changed", "envelope none", READ, stream_several_topics),
    Example("readStream, a pattern", "changed", "envelope none", READ, stream_pattern),
    Example("read, 1 topic, earliest to latest", "changed", "envelope none", READ, batch_one_topic),
    Example("read, multiple topics, explicit offsets", "changed", "envelope none", READ, batch_explicit_offsets),
    Example("read, a pattern, earliest to latest", "changed", "envelope none", READ, batch_pattern),
    Example("writeStream, topic in an option", "changed", "runId; key and value options", KAFKA_COLUMNS,
            stream_write_topic_option),
    Example("writeStream, topic in the data", "refused", "", TOPIC_COLUMN, stream_write_topic_column),
    # Spark refuses the default mode errorifexists for every Python data source, before the source is asked.
    Example("write, topic in an option", "changed", "runId; key and value options; mode append",
            r"ErrorIfExists|errorifexists", batch_write_topic_option),
    Example("write, topic in the data", "refused", "", TOPIC_COLUMN, batch_write_topic_column),
]


def _produce(servers: str, t: Topics) -> list[tuple[str, str, str]]:
    """``RECORDS`` plain JSON records with a header into each of the two plain topics: (topic, key, value)."""
    producer = Producer({"bootstrap.servers": servers})
    sent = []
    for i in range(2 * RECORDS):
        topic = t.topic1 if i % 2 else t.topic2
        partition = (i // 2) % 2 if topic == t.topic1 else 0
        key, value = f"k{i}", orjson.dumps({"id": i}).decode()
        producer.produce(topic, value.encode(), key=key.encode(), partition=partition, headers=[("source", b"guide")])
        sent.append((topic, key, value))
    assert producer.flush(30) == 0
    return sent


@pytest.fixture(scope="module")
def guide_topics(kafka_config: dict[str, Any], bootstrap_servers: str) -> tuple[Topics, list[tuple[str, str, str]]]:
    prefix = f"guide-{uuid.uuid4().hex[:8]}"
    t = Topics(bootstrap_servers, f"{prefix}-1", f"{prefix}-2", f"{prefix}-.*", "", "", "")
    create_topic(kafka_config, t.topic1, 2)
    create_topic(kafka_config, t.topic2, 1)
    return t, _produce(bootstrap_servers, t)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.run.__name__ for e in EXAMPLES])
def test_the_integration_guides_example(example: Example, spark: SparkSession, kafka_config: dict[str, Any],
                                        guide_topics: tuple[Topics, list[tuple[str, str, str]]],
                                        tmp_path: Path) -> None:
    base, sent = guide_topics
    out = f"guide-out-{uuid.uuid4().hex[:8]}"
    t = Topics(base.servers, base.topic1, base.topic2, base.pattern, out, uuid.uuid4().hex[:8],
               str(tmp_path / "checkpoint"))
    # As the guide writes it (the format's name aside): refused in one line that names what to change.
    with pytest.raises(Exception) as refused:  # Spark wraps the source's error in its own kind
        example.run(spark, t, False)
    assert re.search(example.refusal, str(refused.value), re.DOTALL), str(refused.value)[-2000:]
    if example.outcome == "refused":
        return
    got = example.run(spark, t, True)
    one = sorted((k, v) for topic, k, v in sent if topic == t.topic1)
    both = sorted((k, v) for _, k, v in sent)
    expected: dict[Callable[[SparkSession, Topics, bool], Any], list[tuple[str, str]]] = {
        stream_one_topic: one, stream_one_topic_with_headers: one, stream_several_topics: both,
        stream_pattern: both, batch_one_topic: one, batch_pattern: both, stream_write_topic_option: one,
        batch_write_topic_option: one,
        # topic1 partition 0 from offset 3 to 10, partition 1 from the start, topic2 whole
        batch_explicit_offsets: sorted(
            [(k, v) for topic, k, v in sent if topic == t.topic2]
            + [(k, v) for j, (topic, k, v) in enumerate(s for s in sent if s[0] == t.topic1)
               if (j % 2 == 0 and 3 <= j // 2 < 10) or j % 2 == 1]),
    }
    want = expected[example.run]
    assert sorted((r["key"], r["value"]) for r in got) == want
    if example.run is stream_one_topic_with_headers:
        assert all([(h["key"], bytes(h["value"])) for h in r["headers"]] == [("source", b"guide")] for r in got)


def test_the_readme_counts_the_examples() -> None:
    """The README's count of the guide's examples is :data:`EXAMPLES`'."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    counts = {o: sum(e.outcome == o for e in EXAMPLES) for o in ("unchanged", "changed", "refused")}
    line = (f"{len(EXAMPLES)} examples: {counts['unchanged']} run unchanged, {counts['changed']} with a documented "
            f"change, {counts['refused']} refused")
    assert line in readme, line
