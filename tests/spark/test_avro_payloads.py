"""A stream of Avro payloads made by Spark's ``to_avro`` and decoded with ``from_avro`` after the read
(docs/SPARK.md, "Binary payloads"): the raw read carries the watermark columns, the windows close on them,
and the query ends by itself at the end of stream.

The upstream tasks frame each payload as a schema registry does (magic byte 0, a 4-byte big-endian schema id,
then the Avro binary that ``to_avro`` made); the stage strips the framing, decodes, and counts per hour. The
oracle is plain Python over what was written.

pyspark 4.2.0 only (marker ``spark42("avro")``: the session gets spark-avro's jar, run by ``make
test-spark42``): spark-avro is not served for Spark 4.3."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro
from pyspark.sql.types import LongType, StringType, StructField, StructType

from controlmsg.kafka import ControlWriter
from controlmsg.spark import WATERMARK_COLUMNS, with_watermark
from tests.spark.helpers import options, query_failure

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.spark42("avro")]

T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
SCHEMA_ID = 7
TASKS = 2
CLICK = ('{"type": "record", "name": "Click", "fields": '
         '[{"name": "user", "type": "string"}, {"name": "ts", "type": "long"}]}')
"""The writers' and the reader's Avro schema: ``ts`` in ms since the epoch."""


def avro_payloads(spark: SparkSession, clicks: list[tuple[str, int]]) -> list[bytes]:
    """``clicks`` (user, ms) encoded by ``to_avro`` with :data:`CLICK`, framed as a schema registry does."""
    schema = StructType([StructField("user", StringType(), False), StructField("ts", LongType(), False)])
    df = spark.createDataFrame(clicks, schema).coalesce(1)
    encoded = df.select(to_avro(F.struct("user", "ts"), CLICK).alias("avro")).collect()
    return [b"\x00" + struct.pack(">I", SCHEMA_ID) + bytes(r["avro"]) for r in encoded]


def test_a_stream_of_avro_payloads_decoded_with_from_avro_keeps_its_watermark_and_ends(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(2)
    expected: Counter[tuple[datetime, str]] = Counter()
    for task in range(TASKS):
        clicks = [(f"u{minute % 3}", T0 + minute * 60_000) for minute in range(task, 300, 7)]
        payloads = avro_payloads(spark, clicks)
        assert len(payloads) == len(clicks) and all(p[5:] for p in payloads)
        writer = ControlWriter(kafka_config, topic, task_name=f"t{task}", task_count=TASKS, run_id="r1")
        for (user, ts), payload in zip(clicks, payloads, strict=True):
            writer.send_bytes(payload, key=user)
            start = ts - ts % 3_600_000
            expected[(datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None), user)] += 1
        writer.send_watermark(T0 + 300 * 60_000)
        writer.send_end_of_stream()
        writer.flush()
        writer.close()

    raw = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, timeout="120"))
           .schema(f"value binary, {WATERMARK_COLUMNS}").load())
    marks = ("_watermark", "_partition_watermark", "_control")
    body = F.expr("substring(value, 6, length(value) - 5)")  # past the magic byte and the schema id
    events = (raw.select(from_avro(body, CLICK).alias("click"), *marks)
              .select("click.user", F.timestamp_millis("click.ts").alias("ts"), *marks))
    hourly = with_watermark(events, "ts").groupBy(F.window("ts", "1 hour"), "user").count()
    out = tmp_path / "out"
    query = (hourly.writeStream.outputMode("append").format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the query ends by itself at the end of stream"
    assert query.exception() is None, query_failure(query)
    got = Counter({(r["window"]["start"], r["user"]): r["count"]
                   for r in spark.read.parquet(str(out)).collect()})
    assert got == expected
    seen = [p["eventTime"].get("watermark") for p in query.recentProgress]
    assert seen[-1] == "9999-12-31T23:59:59.999Z", f"the end of stream reached Spark's watermark: {seen}"
