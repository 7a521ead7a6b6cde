"""Records that do not fit the DataFrame, on a real broker and a real SparkSession: FAILFAST names topic,
partition and offset; PERMISSIVE keeps the row and the value; ``deadLetterTopic`` sets the record aside in
the one dead-letter format, batch and stream, and refuses to start without its topic."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from controlmsg.kafka import ControlWriter
from tests.spark.helpers import options

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = "n long, s string, _key string, _partition int, _offset long"
NOT_UTF8 = b"\xff\xfek"

# (partition, key, payload, why it is bad or None): offsets follow the order within each partition.
RECORDS: list[tuple[int, bytes | None, bytes, str | None]] = [
    (0, b"a", b'{"n": 1, "s": "one"}', None),
    (0, b"b", b"{nope", "the value is not JSON"),
    (0, b"c", b'{"n": 2, "s": "two"}', None),
    (0, b"d", b"[1, 2]", "the value is a JSON list, not an object"),
    (0, b"e", b'{"n": "x", "s": "kept"}', "field 'n' does not fit type int64"),
    (0, None, b'{"n": 3, "s": "three"}', None),
    (1, NOT_UTF8, b'{"n": 4, "s": "\xc3\xa9"}', "the key is not UTF-8 text"),
    (1, b"f", b'{"n": 5}', None),
    (1, b"g", b'{"n": 6, "s": "not utf-8 \xff"}', "the value is not JSON"),
    # pyarrow alone would take these: 7.5 truncated to 7, true as 1
    (1, b"h", b'{"n": 7.5, "s": "x"}', "field 'n' does not fit type int64: a value is a number with a fraction "
                                       "or an exponent, not an integer"),
    (1, b"i", b'{"n": true, "s": "y"}', "field 'n' does not fit type int64: a value is true or false, not an integer"),
]


def with_offsets() -> list[tuple[int, int, bytes | None, bytes, str | None]]:
    seen: dict[int, int] = {}
    out = []
    for p, key, payload, why in RECORDS:
        out.append((p, seen.get(p, 0), key, payload, why))
        seen[p] = seen.get(p, 0) + 1
    return out


def write_records(config: dict[str, Any], topic: str, records: list[tuple[int, bytes | None, bytes, str | None]],
                  run: str = "r1") -> None:
    with ControlWriter(config, topic, task_name="up-0", task_count=1, run_id=run, data_headers=True) as w:
        for p, key, payload, _ in records:
            w.send_bytes(payload, key=key, partition=p)
        w.send_end_of_stream()
        w.flush()


def read_all(config: dict[str, Any], topic: str, expected: int) -> list[Any]:
    """Every record of partition 0 of ``topic``, waiting (up to 30 s) until ``expected`` are there."""
    consumer = Consumer({**config, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        got += [m for m in consumer.consume(100, 0.5) if m.error() is None]
    time.sleep(0.5)
    got += [m for m in consumer.consume(100, 0.5) if m.error() is None]  # none more, if all is well
    consumer.close()
    return got


def read(spark: SparkSession, topic: str, servers: str, schema: str | None = SCHEMA, **more: str) -> DataFrame:
    reader = spark.read.format("controlmsg").options(**options(topic, servers, **more))
    return (reader.schema(schema) if schema is not None else reader).load()


def check_dead_letters(config: dict[str, Any], topic: str, dlq: str) -> None:
    """``dlq`` holds exactly the bad records of :data:`RECORDS`, as they were, with origin and reason."""
    bad = [(p, off, key, payload, why) for p, off, key, payload, why in with_offsets() if why is not None]
    got = read_all(config, dlq, len(bad))
    got.sort(key=lambda m: (int(dict(m.headers())["controlmsg-dlq-partition"]),
                            int(dict(m.headers())["controlmsg-dlq-offset"])))
    assert len(got) == len(bad)
    for m, (p, off, key, payload, why) in zip(got, bad, strict=True):
        headers = dict(m.headers())
        assert m.value() == b"\x00" + payload  # the record as it was: the envelope, type byte included
        assert m.key() == key
        assert headers["controlmsg-run"] == b"r1"  # the record's own headers are kept
        assert headers["controlmsg-dlq-topic"].decode() == topic
        assert (headers["controlmsg-dlq-partition"], headers["controlmsg-dlq-offset"]) == (
            str(p).encode(), str(off).encode())
        assert why is not None and why in headers["controlmsg-dlq-reason"].decode()


def test_failfast_names_the_offset_of_the_first_bad_record(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    good = [(0, b"k", b'{"n": %d}' % i, None) for i in range(3)]
    write_records(kafka_config, topic, [*good, (0, b"k", b'{"n": "x"}', "misfit"), (0, b"k", b'{"n": 1.5}', "misfit")])
    with pytest.raises(PySparkException, match=rf"topic '{topic}' partition 0 offset 3: field 'n' does not fit"):
        read(spark, topic, bootstrap_servers, "n long").collect()

    topic = new_topic(1)
    write_records(kafka_config, topic, [*good, (0, NOT_UTF8, b'{"n": 9}', "key"), (0, b"k", b"\xff", "value")])
    with pytest.raises(PySparkException, match=rf"topic '{topic}' partition 0 offset 3: the key is not UTF-8"):
        read(spark, topic, bootstrap_servers, "n long, _key string").collect()
    with pytest.raises(PySparkException, match=rf"topic '{topic}' partition 0 offset 3: the key is not UTF-8"):
        read(spark, topic, bootstrap_servers, "partition int, offset long, key string, value string").collect()
    with pytest.raises(PySparkException, match=rf"topic '{topic}' partition 0 offset 4: the value is not UTF-8"):
        read(spark, topic, bootstrap_servers, "partition int, offset long, key binary, value string").collect()
    # and the error says what to do
    with pytest.raises(PySparkException, match="set the option deadLetterTopic"):
        read(spark, topic, bootstrap_servers, "n long").collect()


def test_permissive_keeps_every_row_and_the_bad_values(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    write_records(kafka_config, topic, RECORDS)
    rows = read(spark, topic, bootstrap_servers, SCHEMA + ", _corrupt_record string", mode="permissive").collect()
    by_place = {(r._partition, r._offset): r for r in rows}
    assert len(rows) == len(RECORDS)
    for p, off, _, payload, why in with_offsets():
        row = by_place[(p, off)]
        if why is None:
            assert row._corrupt_record is None
            assert row.n is not None
        else:
            assert row._corrupt_record == payload.decode("utf-8", "backslashreplace")
    assert by_place[(0, 4)].n is None and by_place[(0, 4)].s == "kept"  # only the field that does not fit
    assert by_place[(0, 1)].n is None and by_place[(0, 1)].s is None
    assert by_place[(1, 0)]._key == "\\xff\\xfek" and by_place[(1, 0)].n == 4  # the key, escaped
    assert by_place[(1, 2)]._corrupt_record == '{"n": 6, "s": "not utf-8 \\xff"}'

    binary = read(spark, topic, bootstrap_servers, "n long, _partition int, _offset long, bad binary",
                  mode="PERMISSIVE", columnNameOfCorruptRecord="bad").collect()
    assert {(r._partition, r._offset): r.bad for r in binary if r.bad is not None} == {
        (p, off): payload for p, off, key, payload, why in with_offsets()
        if why is not None and "key" not in why}  # a key is not read here: that record is good

    with pytest.raises(PySparkException, match="declare the column in the schema"):
        read(spark, topic, bootstrap_servers, SCHEMA, mode="PERMISSIVE").collect()


def test_dead_letter_topic_gets_exactly_the_bad_records(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    dlq = new_topic(1, prefix="dlq")
    write_records(kafka_config, topic, RECORDS)
    rows = read(spark, topic, bootstrap_servers, deadLetterTopic=dlq).collect()
    good = sorted((p, off) for p, off, _, _, why in with_offsets() if why is None)
    assert sorted((r._partition, r._offset) for r in rows) == good
    assert sorted(r.n for r in rows) == [1, 2, 3, 5]
    check_dead_letters(kafka_config, topic, dlq)


def test_a_missing_dead_letter_topic_fails_at_start(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(1)
    write_records(kafka_config, topic, RECORDS[:2])
    missing = f"{topic}-no-such-dlq"
    with pytest.raises(PySparkException, match=f"dead-letter topic '{missing}' does not exist; create it first"):
        read(spark, topic, bootstrap_servers, deadLetterTopic=missing).collect()
    stream = (spark.readStream.format("controlmsg")
              .options(**options(topic, bootstrap_servers, deadLetterTopic=missing)).schema(SCHEMA).load())
    query = (stream.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(60)
    except Exception as exc:  # Spark's StreamingQueryException, whichever module it comes from
        assert f"dead-letter topic '{missing}' does not exist" in str(exc)
    else:
        pytest.fail("a stream with a missing dead-letter topic must fail")
    finally:
        query.stop()
    assert query.lastProgress is None or query.lastProgress["numInputRows"] == 0


def test_a_stream_dead_letters_the_bad_records_too(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    topic = new_topic(2)
    dlq = new_topic(1, prefix="dlq")
    write_records(kafka_config, topic, RECORDS)
    rows: list[Any] = []
    stream = (spark.readStream.format("controlmsg")
              .options(**options(topic, bootstrap_servers, deadLetterTopic=dlq)).schema(SCHEMA).load())
    query = (stream.writeStream.foreachBatch(lambda df, _id: rows.extend(df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    assert sorted(r.n for r in rows) == [1, 2, 3, 5]
    check_dead_letters(kafka_config, topic, dlq)


def test_invalid_options_are_refused_with_the_valid_ones(
    spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(1)
    with pytest.raises(PySparkException, match="'mode' must be one of FAILFAST, PERMISSIVE, DROPMALFORMED"):
        read(spark, topic, bootstrap_servers, mode="lenient").collect()
    with pytest.raises(PySparkException, match="must be of type string or binary"):
        read(spark, topic, bootstrap_servers, "n long, _corrupt_record int", mode="PERMISSIVE").collect()


def test_a_job_that_fails_says_why_in_two_lines_and_keeps_the_trace(
    bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """``python -m spark_jobs.batch.sink`` reading a record whose value is not JSON (FAILFAST): its own Spark
    application fails; the job ends with the cause (topic, partition, offset) and what to do, the full
    trace goes to --log-file."""
    import os
    import subprocess
    import sys

    topic = new_topic(1)
    write_records(kafka_config, topic, [(0, b"k", b'{"key": "a"}', None), (0, b"k", b'{"key": ', "value")])
    log_file = tmp_path / "sink-error.log"
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.batch.sink", "--input-topic", topic, "--output", str(tmp_path / "out.csv"),
         "--bootstrap-servers", bootstrap_servers, "--run-id", "r1", "--master", "local[1]", "--timeout", "60",
         "--log-file", str(log_file), "--spark-conf", "spark.task.maxFailures=1"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-2:]
    assert last[0].startswith(f"sink: ReadError: topic '{topic}' partition 0 offset 1: the value is not JSON"), last
    assert last[1].startswith("sink: fix or set aside the record") and last[1].endswith(f"full trace in {log_file}")
    trace = log_file.read_text()
    assert "Traceback" in trace and "offset 1: the value is not JSON" in trace
