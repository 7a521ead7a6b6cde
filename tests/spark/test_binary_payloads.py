"""A stage on binary payloads (Avro, Protobuf, any bytes): a stream read of the record's own ``value`` carries
the watermark fields too, so the payload is decoded after the read (``from_avro``, ``from_protobuf``, here plain
Spark SQL) and the windows still close on the reconciled watermark.

The upstream tasks frame each payload as a schema registry does (a magic byte 0 and a 4-byte schema id before
the encoded record), so the test strips the framing as docs/SPARK.md tells users to. The payload after it is
``user|event time in ms`` in UTF-8: not JSON, so a read that took ``value`` for a JSON field would fail. The
same read of JSON payloads, decoded with ``from_json``: before 2026-11-27 the read took ``value`` for a member
of the JSON object, every row was null, and the query ended with no window and no error."""

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

from controlmsg.kafka import ControlWriter
from controlmsg.spark import WATERMARK_COLUMNS, with_watermark
from tests.spark.helpers import options

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
SCHEMA_ID = 42
TASKS = 2


def framed(user: str, ts: int) -> bytes:
    """One record as a schema-registry serializer frames it: magic byte, schema id, then the record."""
    return b"\x00" + struct.pack(">I", SCHEMA_ID) + f"{user}|{ts}".encode()


@pytest.mark.parametrize("payload", ["framed", "json"])
def test_a_stream_of_binary_payloads_keeps_its_watermark_and_ends(
        payload: str, spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(2)
    expected: Counter[tuple[datetime, str]] = Counter()
    for task in range(TASKS):
        writer = ControlWriter(kafka_config, topic, task_name=f"t{task}", task_count=TASKS, run_id="r1")
        for minute in range(task, 300, 7):
            user, ts = f"u{minute % 3}", T0 + minute * 60_000
            if payload == "framed":
                writer.send_bytes(framed(user, ts), key=user)
            else:  # the payload the read used to take 'value' from, as a JSON field: every row was null
                writer.send({"user": user, "ts": ts}, key=user)
            start = ts - ts % 3_600_000
            expected[(datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None), user)] += 1
        writer.send_watermark(T0 + 300 * 60_000)
        writer.send_end_of_stream()
        writer.flush()
        writer.close()

    raw = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, timeout="120"))
           .schema(f"value binary, {WATERMARK_COLUMNS}").load())
    marks = ("_watermark", "_partition_watermark", "_control")
    if payload == "framed":
        body = F.expr("cast(substring(value, 6, length(value) - 5) as string)")  # past the magic byte and id
        fields = raw.select(F.split(body, r"\|").alias("f"), *marks).select(
            F.col("f")[0].alias("user"), F.col("f")[1].cast("long").alias("ms"), *marks)
    else:
        fields = raw.select(F.from_json(F.col("value").cast("string"), "user string, ts long").alias("f"), *marks) \
            .select("f.user", F.col("f.ts").alias("ms"), *marks)
    events = fields.select("user", F.timestamp_millis("ms").alias("ts"), *marks)
    hourly = with_watermark(events, "ts").groupBy(F.window("ts", "1 hour"), "user").count()
    out = tmp_path / "out"
    query = (hourly.writeStream.outputMode("append").format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the query ends by itself at the end of stream"
    assert query.exception() is None
    got = Counter({(r["window"]["start"], r["user"]): r["count"]
                   for r in spark.read.parquet(str(out)).collect()})
    assert got == expected
    seen = [p["eventTime"].get("watermark") for p in query.recentProgress]
    assert seen[-1] == "9999-12-31T23:59:59.999Z", f"the end of stream reached Spark's watermark: {seen}"
