"""A chain's first topic (``envelope none``, written by ordinary producers) read with
:func:`controlmsg.spark.with_watermark`: a watermark per partition (each partition's largest event time minus
``maxOutOfOrderness``, the minimum over the partitions that are not idle, never back), on a real broker and
SparkSession.

The issue's scenario: 4 partitions, events in time order within each, partitions 0-2 at hours 0-5 and
partition 3 at hour 0, which catches up later; 1h windows, no delay. Spark's ``withWatermark`` moves to hour
5 and drops partition 3's later records as late; ``with_watermark`` drops none, and its windows equal an
oracle computed here in plain Python (no code shared with the system)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from controlmsg.spark import WATERMARK_COLUMNS, observed_counts, run_status, source_metrics, with_watermark
from tests.spark.helpers import query_failure

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MINUTE = 60_000
HOUR = 60 * MINUTE
STEP = 150_000  # a record every 2.5 minutes: 24 per hour and partition
SCHEMA = "user string not null, ts timestamp not null, p int"
OUT_SCHEMA = "window struct<start: timestamp, end: timestamp>, n long"


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


class Producing:
    """Plain JSON records as an application writes them, each kept for the oracle."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.producer = Producer(config)
        self.topic = topic
        self.sent: list[int] = []  # event times, ms

    def hours(self, partition: int, first: int, last: int, *, also: tuple[int, ...] = ()) -> None:
        """Records of ``partition`` (and of the partitions ``also``, in the same flush) from hour ``first`` to
        the end of hour ``last``, in time order."""
        for p in (partition, *also):
            self.at(p, range(T0 + first * HOUR, T0 + (last + 1) * HOUR, STEP), flush=False)
        self.producer.flush(30)

    def at(self, partition: int, times: range | list[int], *, flush: bool = True) -> None:
        for ms in times:
            value = {"user": f"u{ms // STEP % 5}", "ts": iso(ms), "p": partition}
            self.producer.produce(self.topic, orjson.dumps(value), partition=partition)
            self.sent.append(ms)
        if flush:
            self.producer.flush(30)


def oracle(event_times: list[int], *, before: int | None = None) -> Counter[datetime]:
    """Records per 1h window start, in plain Python; only windows that end at or before ``before``."""
    out: Counter[datetime] = Counter()
    for ms in event_times:
        start = ms - ms % HOUR
        if before is None or start + HOUR <= before:
            out[datetime.fromtimestamp(start / 1000, UTC).replace(tzinfo=None)] += 1
    return out


def windows(spark: SparkSession, path: Path) -> Counter[datetime]:
    if not (path / "_spark_metadata").exists():
        return Counter()
    out: Counter[datetime] = Counter()
    for r in spark.read.schema(OUT_SCHEMA).parquet(str(path)).collect():
        assert r["window"]["start"] not in out, f"window {r['window']['start']} written twice"
        out[r["window"]["start"]] = r["n"]
    return out


def wait_for(condition: Callable[[], bool], seconds: float, what: str, query: StreamingQuery) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert query.isActive, f"{what}: {query_failure(query)}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def read(spark: SparkSession, topic: str, servers: str, **more: str) -> DataFrame:
    return (spark.readStream.format("controlmsg").option("envelope", "none").option("subscribe", topic)
            .option("kafka.bootstrap.servers", servers).option("timeout", "120").options(**more)
            .schema(SCHEMA).load())


def hourly(events: DataFrame) -> DataFrame:
    return events.groupBy(F.window("ts", "1 hour")).agg(F.count("*").alias("n"))


def start(df: DataFrame, out: Path, checkpoint: Path, **trigger: Any) -> StreamingQuery:
    return (df.writeStream.outputMode("append").format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).trigger(**trigger).start())


def spark_watermark(query: StreamingQuery) -> int | None:
    """Spark's event-time watermark in the query's last progress (epoch ms; ``None``: none yet)."""
    progress: Any = query.lastProgress or {}
    mark = progress.get("eventTime", {}).get("watermark")
    if not mark:
        return None
    ms = int(datetime.fromisoformat(mark.replace("Z", "+00:00")).timestamp() * 1000)
    return ms or None


def rows_in(query: StreamingQuery) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


def dropped(progress: list[Any]) -> int:
    return sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"])


def late(progress: list[Any]) -> int:
    return sum(c["late_rows"] for c in map(observed_counts, progress) if c is not None)


def test_a_lagging_partition_loses_nothing_with_a_watermark_per_partition(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    topic = new_topic(4)
    source = Producing(kafka_config, topic)
    for p in range(3):
        source.hours(p, 0, 5)
    source.hours(3, 0, 0)
    began = time.monotonic()
    ours_out, spark_out = tmp_path / "ours", tmp_path / "spark"
    ours = start(with_watermark(read(spark, topic, bootstrap_servers, maxOutOfOrderness="0s"), "ts")
                 .transform(hourly), ours_out, tmp_path / "ck-ours", processingTime="1 second")
    plain = start(read(spark, topic, bootstrap_servers).withWatermark("ts", "0 seconds").transform(hourly),
                  spark_out, tmp_path / "ck-spark", processingTime="1 second")
    marks: list[int] = []
    try:
        p3_hour0 = T0 + HOUR - STEP
        wait_for(lambda: spark_watermark(ours) == p3_hour0, 120, "our watermark at partition 3's hour 0", ours)
        wait_for(lambda: spark_watermark(plain) == T0 + 6 * HOUR - STEP, 120, "Spark's watermark at hour 5", plain)
        held = source_metrics(ours.lastProgress or {})[topic]
        assert (held["watermarkHeldBackOnPartition"], held["watermarkHeldBackAt"]) == ("3", str(p3_hour0)), held
        assert windows(spark, ours_out) == Counter(), "no window closes before partition 3 passes its end"

        source.hours(3, 1, 5)  # partition 3 catches up
        total = len(source.sent)
        wait_for(lambda: rows_in(plain) >= total, 120, "Spark's query to read it all", plain)
        closed = T0 + 5 * HOUR
        wait_for(lambda: windows(spark, ours_out) == oracle(source.sent, before=closed), 120,
                 "our windows up to 05:00, in full", ours)
        # Spark's numRowsDroppedByWatermark counts the rows its stateful operator drops, after the partial
        # aggregation (one per window and task), not records: the records lost are what its windows miss.
        expected = oracle(source.sent, before=closed)
        spark_lost = sum((expected - windows(spark, spark_out)).values())
        ours_lost = sum((expected - windows(spark, ours_out)).values())
        print(f"\nrecords dropped as late, of {total} ({total - 456} from partition 3 after it caught up): Spark's "
              f"withWatermark {spark_lost} missing from the windows to 05:00 (numRowsDroppedByWatermark "
              f"{dropped(plain.recentProgress)}); with_watermark {ours_lost} missing, late_rows "
              f"{late(ours.recentProgress)}, numRowsDroppedByWatermark {dropped(ours.recentProgress)}; "
              f"{time.monotonic() - began:.1f} s")
        assert spark_lost > 0 and dropped(plain.recentProgress) > 0, "Spark's withWatermark drops partition 3's"
        marks += [m for m in (_source_mark(p, topic) for p in ours.recentProgress) if m is not None]
    finally:
        for q in (ours, plain):
            q.stop()
    assert late(ours.recentProgress) == 0 and dropped(ours.recentProgress) == 0
    assert marks == sorted(marks), "the watermark never goes back"

    # Started again from its checkpoint as a bounded input: the end of the input closes the last window.
    again = start(with_watermark(read(spark, topic, bootstrap_servers, maxOutOfOrderness="0s",
                                      availableNowEnds="true"), "ts").transform(hourly),
                  ours_out, tmp_path / "ck-ours", availableNow=True)
    assert again.awaitTermination(120), query_failure(again)
    assert again.exception() is None, query_failure(again)
    assert windows(spark, ours_out) == oracle(source.sent), "every window once, equal to the oracle"
    assert late(again.recentProgress) == 0 and dropped(again.recentProgress) == 0
    after = [m for m in (_source_mark(p, topic) for p in again.recentProgress) if m is not None]
    assert after and min(after) >= max(marks), "the watermark never goes back across the restart"


def _source_mark(progress: Any, topic: str) -> int | None:
    mark = source_metrics(progress).get(topic, {}).get("watermark")
    return int(mark) if mark is not None else None


def test_an_idle_partition_stops_holding_the_watermark_back_and_a_restart_keeps_it(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """Partition 2 gives one hour and then nothing: after ``idleTimeout`` it holds nothing back, and the
    windows close on partitions 0 and 1 with its records in them. It comes back behind the watermark: those
    records are late (counted), it holds the watermark back again, and the watermark stays. A restart from
    the checkpoint goes on from the same watermark, never back: records behind it are still late."""
    topic = new_topic(3)
    source = Producing(kafka_config, topic)
    for p in range(3):
        source.hours(p, 0, 0)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    opts = {"maxOutOfOrderness": "0s", "idleTimeout": "3s"}
    query = start(with_watermark(read(spark, topic, bootstrap_servers, **opts), "ts").transform(hourly),
                  out, checkpoint, processingTime="1 second")
    try:
        first = T0 + HOUR - STEP
        wait_for(lambda: spark_watermark(query) == first, 120, "the watermark at hour 0's last record", query)
        time.sleep(3.5)  # every partition idle: the watermark stays; then 0 and 1 go on, 2 stays idle
        source.hours(0, 1, 3, also=(1,))
        kept = list(source.sent)
        moved = T0 + 4 * HOUR - STEP
        wait_for(lambda: spark_watermark(query) == moved, 120, "the watermark without partition 2", query)
        wait_for(lambda: windows(spark, out) == oracle(kept, before=T0 + 3 * HOUR), 60,
                 "the windows to 03:00, partition 2's records in the first", query)
        metrics = next(m for m in (source_metrics(p).get(topic, {}) for p in query.recentProgress)
                       if m.get("watermark") == str(moved))
        assert metrics["idlePartitions"] == "1" and metrics["watermarkHeldBackOnPartition"] in ("0", "1"), metrics

        source.at(2, [T0 + HOUR + 7 * MINUTE, T0 + 2 * HOUR])  # back, behind the watermark: late
        wait_for(lambda: late(query.recentProgress) == 2, 60, "partition 2's two late records", query)
        metrics = source_metrics(query.lastProgress or {})[topic]
        assert (metrics["watermarkHeldBackOnPartition"], metrics["watermarkHeldBackAt"]) == ("2", str(T0 + 2 * HOUR))
        assert spark_watermark(query) == moved and metrics["watermark"] == str(moved), "it does not go back"
    finally:
        query.stop()
    assert dropped(query.recentProgress) == 0

    source.at(0, [T0 + 30 * MINUTE])  # behind the watermark: late after the restart as before it
    source.at(1, [T0 + 4 * HOUR])
    again = start(with_watermark(read(spark, topic, bootstrap_servers, **opts), "ts").transform(hourly),
                  out, checkpoint, availableNow=True)
    assert again.awaitTermination(120), query_failure(again)
    assert again.exception() is None, query_failure(again)
    assert late(again.recentProgress) == 1 and dropped(again.recentProgress) == 0
    marks = [int(m["watermark"]) for m in (source_metrics(p).get(topic, {}) for p in again.recentProgress)
             if "watermark" in m]
    assert marks and min(marks) >= moved, marks
    assert windows(spark, out) == oracle(kept, before=T0 + 3 * HOUR)


def test_what_cannot_be_honoured_is_refused_in_one_line(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(1)
    bare = read(spark, topic, bootstrap_servers)
    with pytest.raises(ValueError, match=r"with_watermark on a plain topic .* \.option\('maxOutOfOrderness', '10s'\)"):
        with_watermark(bare, "ts")
    declared = (spark.readStream.format("controlmsg").option("envelope", "none").option("subscribe", topic)
                .option("kafka.bootstrap.servers", bootstrap_servers)
                .schema(f"{SCHEMA}, {WATERMARK_COLUMNS}").load())
    with pytest.raises(Exception, match="needs the options 'eventTimeField' and 'maxOutOfOrderness'"):
        query = start(with_watermark(declared, "ts").transform(hourly), tmp_path / "o", tmp_path / "c",
                      availableNow=True)
        query.awaitTermination(60)
    with pytest.raises(Exception, match="a batch read reads what is there"):
        (spark.read.format("controlmsg").option("envelope", "none").option("topic", topic)
         .option("kafka.bootstrap.servers", bootstrap_servers).option("maxOutOfOrderness", "1s").load().collect())


def test_the_first_hop_of_a_chain_passes_the_watermark_on_and_ends_by_itself(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """A bounded plain input (``availableNowEnds``) -> ``with_watermark`` -> hourly counts ->
    ``writeStream.format("controlmsg")``: the watermark per partition reaches the end of time at the end of the
    input, so the stateful stage emits its last window and ends its run by itself; the next job reads every
    window, equal to the oracle (it used to need ``end_stream`` by hand)."""
    topic, out = new_topic(3), new_topic(2)
    source = Producing(kafka_config, topic)
    source.hours(0, 0, 2, also=(1,))
    source.hours(2, 0, 0)
    write_opts = {"topic": out, "runId": "first-hop", "kafka.bootstrap.servers": bootstrap_servers, "timeout": "60",
                  "key": "k", "eventTime": "end"}
    counts = (with_watermark(read(spark, topic, bootstrap_servers, maxOutOfOrderness="0s", availableNowEnds="true"),
                             "ts").transform(hourly)
              .select(F.date_format("window.start", "HH:mm").alias("k"), F.col("window.end").alias("end"), "n"))
    query = (counts.writeStream.outputMode("append").format("controlmsg").options(**write_opts)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert query.awaitTermination(120), query_failure(query)
    assert query.exception() is None, query_failure(query)
    status = run_status(write_opts)
    assert status is not None and status["ended"], status
    got = (spark.read.format("controlmsg").options(**{k: v for k, v in write_opts.items() if k != "key"})
           .schema("k string, end timestamp, n long").load().collect())
    assert Counter({datetime.fromisoformat(f"2026-01-01T{r['k']}:00"): r["n"] for r in got}) == oracle(source.sent)
    assert len(got) == 3 and late(query.recentProgress) == 0


def test_watermark_alignment_holds_a_partition_that_runs_ahead(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """A skewed backfill: partition 0 at hours 0-5, partition 1 at hours 0-1, read 40 offsets per micro-batch
    (shared in proportion: partition 0 would take three of four and run hours ahead). With ``maxWatermarkDrift``
    1h, while partition 1 has records, no micro-batch takes partition 0 more than the drift (and one record)
    past the watermark at its start; once partition 1 has none, partition 0 is read on, and the bounded input
    ends with every window equal to the oracle."""
    topic = new_topic(2)
    source = Producing(kafka_config, topic)
    source.hours(0, 0, 5)
    source.hours(1, 0, 1)
    events = with_watermark(read(spark, topic, bootstrap_servers, maxOutOfOrderness="0s", maxWatermarkDrift="1h",
                                 maxOffsetsPerTrigger="40", availableNowEnds="true"), "ts")
    query = start(events.transform(hourly), tmp_path / "out", tmp_path / "ck", availableNow=True)
    assert query.awaitTermination(180), query_failure(query)
    assert query.exception() is None, query_failure(query)
    checked = 0
    for progress in query.recentProgress:
        source_progress = progress["sources"][0]
        begin, end = (orjson.loads(o) if isinstance(o, str) else o
                      for o in (source_progress["startOffset"], source_progress["endOffset"]))
        if not begin or not end or "eventTime" not in begin:
            continue
        mark = begin["eventTime"]["watermark"]
        largest = {p: big for _, p, big, _ in end["eventTime"]["partitions"]}
        if mark is not None and begin["offsets"][topic]["1"] < 48 and end["offsets"][topic]["0"] > \
                begin["offsets"][topic]["0"]:
            assert largest[0] <= mark + HOUR + STEP, (mark, largest)
            checked += 1
    assert checked > 0
    assert windows(spark, tmp_path / "out") == oracle(source.sent)
    assert late(query.recentProgress) == 0 and dropped(query.recentProgress) == 0
