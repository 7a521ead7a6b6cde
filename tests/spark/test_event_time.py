"""Spark's own event-time operators on the reconciled watermark (:func:`controlmsg.spark.with_watermark`),
on a real broker and SparkSession.

Three upstream tasks write one topic; ``slow`` lags behind ``fast-0`` and ``fast-1``. A plain
``withWatermark("ts", "0 seconds")`` would move Spark's watermark to the fast tasks' event times and drop
the slow task's records as late; with ``with_watermark`` every window closes once, when the reconciled
watermark passes its end, with every record the upstream tasks had not yet covered by their watermarks;
a micro-batch of control messages alone closes windows; ``availableNow`` ends at end of stream; a really
late record is counted and kept by a side query; a restart from the checkpoint repeats nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from controlmsg.kafka import ControlWriter
from controlmsg.spark import WATERMARK_COLUMNS, late_records, with_watermark
from tests.spark.helpers import options

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = f"user string, ts timestamp, amount long, {WATERMARK_COLUMNS}"
TASKS = ("fast-0", "fast-1", "slow")


def at(minutes: float) -> int:
    return int((T0 + timedelta(minutes=minutes)).timestamp() * 1000)


class Upstream:
    """Three upstream tasks of run r1; every record sent is kept for the oracle."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.writers = {name: ControlWriter(config, topic, task_name=name, task_count=len(TASKS), run_id="r1")
                        for name in TASKS}
        self.sent: list[tuple[str, int]] = []  # (user, event time ms) of the records that are not late
        self.late: list[tuple[str, int]] = []

    def records(self, task: str, minutes: range, *, late: bool = False) -> None:
        w = self.writers[task]
        for m in minutes:
            user = f"u{m % 3}"
            ts = at(m)
            w.send({"user": user, "ts": datetime.fromtimestamp(ts / 1000, UTC).isoformat(), "amount": m},
                   key=user)
            (self.late if late else self.sent).append((user, ts))
        w.flush()

    def watermark(self, task: str, minutes: float) -> None:
        self.writers[task].send_watermark(at(minutes))
        self.writers[task].flush()

    def end(self) -> None:
        for w in self.writers.values():
            w.send_end_of_stream()
            w.flush()

    def expected(self, window_minutes: int = 60) -> Counter[tuple[datetime, str]]:
        """Count per (window start, user) of the records that are not late."""
        out: Counter[tuple[datetime, str]] = Counter()
        for user, ts in self.sent:
            start = ts - ts % (window_minutes * 60_000)
            out[(datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None), user)] += 1
        return out


def windows(spark: SparkSession, path: Path) -> Counter[tuple[datetime, str]]:
    if not (path / "_spark_metadata").exists():
        return Counter()
    rows = spark.read.parquet(str(path)).collect()
    out: Counter[tuple[datetime, str]] = Counter()
    for r in rows:
        key = (r["window"]["start"], r["user"])
        assert key not in out, f"window {key} written twice"
        out[key] = r["n"]
    return out


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def hourly(spark: SparkSession, topic: str, servers: str) -> DataFrame:
    ev = spark.readStream.format("controlmsg").options(**options(topic, servers)).schema(SCHEMA).load()
    return (with_watermark(ev, "ts").groupBy(F.window("ts", "1 hour"), "user")
            .agg(F.count("*").alias("n"), F.sum("amount").alias("total")))


def start_hourly(spark: SparkSession, topic: str, servers: str, out: Path, checkpoint: Path) -> StreamingQuery:
    return (hourly(spark, topic, servers).writeStream.outputMode("append").format("parquet")
            .option("path", str(out)).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


@pytest.fixture
def upstream(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> Iterator[tuple[Upstream, str]]:
    topic = new_topic(4)
    up = Upstream(kafka_config, topic)
    yield up, topic
    for w in up.writers.values():
        w.close()


def test_windows_close_on_the_reconciled_watermark_with_the_slow_tasks_records(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], tmp_path: Path) -> None:
    up, topic = upstream
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    # The fast tasks are three hours in; the slow one half an hour.
    up.records("fast-0", range(0, 180, 7))
    up.records("fast-1", range(3, 180, 11))
    up.watermark("fast-0", 180)
    up.watermark("fast-1", 180)
    up.records("slow", range(1, 30, 5))
    up.watermark("slow", 30)
    query = start_hourly(spark, topic, bootstrap_servers, out, checkpoint)
    side = (late_records(spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers))
                         .schema(SCHEMA).load(), "ts")
            .writeStream.format("parquet").option("path", str(tmp_path / "late"))
            .option("checkpointLocation", str(tmp_path / "ck-late")).trigger(availableNow=True).start())
    try:
        wait_for(lambda: query.lastProgress is not None and query.lastProgress["numInputRows"] > 0, 60,
                 "the first micro-batch")
        time.sleep(2)
        assert windows(spark, out) == Counter(), "no window may close before the slow task passes its end"

        # The slow task catches up to 02:30, with records that a plain withWatermark would drop as late.
        up.records("slow", range(31, 150, 4))
        up.watermark("slow", 150)
        expected = up.expected()
        first_two = {k: n for k, n in expected.items() if k[0] < datetime(2026, 1, 1, 2)}
        try:
            wait_for(lambda: windows(spark, out) == first_two, 60, "the windows before 02:00, in full")
        except AssertionError:
            print("GOT", sorted(windows(spark, out).items()))
            print("WANT", sorted(first_two.items()))
            for p in query.recentProgress:
                print(p["batchId"], p["numInputRows"], p["eventTime"], p.get("observedMetrics"), [op["numRowsDroppedByWatermark"] for op in p["stateOperators"]])
            raise

        # Control messages alone: the slow task moves to 03:30, so the reconciled watermark is 03:00.
        up.watermark("slow", 210)
        upto_three = {k: n for k, n in expected.items() if k[0] < datetime(2026, 1, 1, 3)}
        wait_for(lambda: windows(spark, out) == upto_three, 60, "the 02:00 window, closed by a watermark alone")

        # A record fast-0 had promised to be past: late, counted and kept aside, never in a window.
        up.records("fast-0", range(100, 101), late=True)
        up.records("fast-0", range(200, 240, 13))
        up.end()
        query.awaitTermination(120)
        side.awaitTermination(120)
        assert not query.isActive and query.exception() is None
        assert windows(spark, out) == up.expected(), "every window once, with every record not late"
        late_rows = spark.read.parquet(str(tmp_path / "late")).collect()
        assert [(r["user"], int(r["ts"].replace(tzinfo=UTC).timestamp() * 1000)) for r in late_rows] == up.late
        progress = query.recentProgress
        assert sum(p["observedMetrics"]["controlmsg"]["late_rows"] for p in progress
                   if "controlmsg" in p["observedMetrics"]) == 1
        assert all(op["numRowsDroppedByWatermark"] == 0 for p in progress for op in p["stateOperators"])
    finally:
        for q in (query, side):
            q.stop()
