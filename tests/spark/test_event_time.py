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

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from controlmsg.kafka import ControlWriter
from controlmsg.spark import WATERMARK_COLUMNS, late_records, observed_counts, with_watermark
from tests.spark.helpers import options, query_failure

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = f"user string, ts timestamp, amount long, {WATERMARK_COLUMNS}"
TASKS = ("fast-0", "fast-1", "slow")
OUT_SCHEMA = "window struct<start: timestamp, end: timestamp>, user string, n long, total long"


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
    rows = spark.read.schema(OUT_SCHEMA).parquet(str(path)).collect()
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


def stream(spark: SparkSession, topic: str, servers: str) -> DataFrame:
    return spark.readStream.format("controlmsg").options(**options(topic, servers, timeout="300")).schema(SCHEMA).load()


def hourly(spark: SparkSession, topic: str, servers: str) -> DataFrame:
    return (with_watermark(stream(spark, topic, servers), "ts").groupBy(F.window("ts", "1 hour"), "user")
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
    side = (late_records(stream(spark, topic, bootstrap_servers), "ts")
            .writeStream.format("parquet").option("path", str(tmp_path / "late"))
            .option("checkpointLocation", str(tmp_path / "ck-late")).trigger(availableNow=True).start())
    try:
        wait_for(lambda: not query.isActive or any(p["numInputRows"] > 0 for p in query.recentProgress), 60,
                 "the first micro-batch")
        assert query.isActive, f"{query_failure(query)}; the late records' query: {query_failure(side)}"
        time.sleep(2)
        assert windows(spark, out) == Counter(), "no window may close before the slow task passes its end"

        # The slow task catches up to 02:30, with records that a plain withWatermark would drop as late.
        up.records("slow", range(31, 150, 4))
        up.watermark("slow", 150)
        expected = up.expected()
        first_two = {k: n for k, n in expected.items() if k[0] < datetime(2026, 1, 1, 2)}
        wait_for(lambda: windows(spark, out) == first_two, 60, "the windows before 02:00, in full")

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
        assert sum(c["late_rows"] for c in map(observed_counts, progress) if c is not None) == 1
        assert all(op["numRowsDroppedByWatermark"] == 0 for p in progress for op in p["stateOperators"])
    finally:
        for q in (query, side):
            q.stop()


def test_keep_late_passes_late_rows_on_and_counts_them(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], tmp_path: Path) -> None:
    """``with_watermark(..., keep_late=True)`` in a stage without state: every record is written, the late one
    too (the next topic's readers judge it against the watermark before it), and it is counted in
    ``late_rows``, as the default would have dropped it."""
    up, topic = upstream
    for task in TASKS:
        up.records(task, range(0, 60, 9))
        up.watermark(task, 60)
    out = tmp_path / "out"
    query = (with_watermark(stream(spark, topic, bootstrap_servers), "ts", keep_late=True).select("user", "ts")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        wait_for(lambda: not query.isActive or any(p["numInputRows"] > 0 for p in query.recentProgress), 60,
                 "the first micro-batch")
        up.records("slow", range(10, 11), late=True)  # behind the 60 minutes every task promised
        up.records("fast-0", range(61, 70, 4))
        up.end()
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None, query_failure(query)
        rows = spark.read.parquet(str(out)).collect()
        got = sorted((r["user"], int(r["ts"].replace(tzinfo=UTC).timestamp() * 1000)) for r in rows)
        assert got == sorted(up.sent + up.late), "every record once, the late one too"
        counts = [c for c in map(observed_counts, query.recentProgress) if c is not None]
        assert sum(c["late_rows"] for c in counts) == 1
    finally:
        query.stop()


QUIET_MS = 30 * 60_000


def apply_in_pandas_with_state(events: DataFrame) -> DataFrame:
    """Per user, a count that an event-time timeout emits 30 minutes after the user's latest event."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

    def count_until_quiet(key: tuple[str], frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        if state.hasTimedOut:
            (n,) = state.get
            state.remove()
            yield pd.DataFrame({"user": [key[0]], "n": [n]})
            return
        n = state.get[0] if state.exists else 0
        latest = 0
        for frame in frames:
            n += len(frame)
            latest = max(latest, int(frame["ts"].max().timestamp() * 1000))
        state.update((n,))
        state.setTimeoutTimestamp(max(latest + QUIET_MS, state.getCurrentWatermarkMs() + 1))

    return events.groupBy("user").applyInPandasWithState(count_until_quiet, "user string, n long", "n long",
                                                         "append", GroupStateTimeout.EventTimeTimeout)


def transform_with_state_in_pandas(events: DataFrame) -> DataFrame:
    """The same with ``transformWithStateInPandas`` and an event-time timer."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import (
        ExpiredTimerInfo,
        StatefulProcessor,
        StatefulProcessorHandle,
        TimerValues,
    )

    class CountUntilQuiet(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.count = handle.getValueState("count", "n long, timer long")

        def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                            timerValues: TimerValues) -> Iterator[pd.DataFrame]:
            state = self.count.get()
            n, timer = state if state is not None else (0, None)
            latest = 0
            for frame in rows:
                n += len(frame)
                latest = max(latest, int(frame["ts"].max().timestamp() * 1000))
            if timer is not None:
                self.handle.deleteTimer(timer)
            timer = max(latest + QUIET_MS, timerValues.getCurrentWatermarkInMs() + 1)
            self.handle.registerTimer(timer)
            self.count.update((n, timer))
            return iter([])

        def handleExpiredTimer(self, key: Any, timerValues: TimerValues,
                               expiredTimerInfo: ExpiredTimerInfo) -> Iterator[pd.DataFrame]:
            state = self.count.get()
            assert state is not None
            n = state[0]
            self.count.clear()
            yield pd.DataFrame({"user": [key[0]], "n": [n]})

        def close(self) -> None:
            pass

    return events.groupBy("user").transformWithStateInPandas(CountUntilQuiet(), "user string, n long", "Append",
                                                             "EventTime")


@pytest.mark.parametrize("operator", [apply_in_pandas_with_state, transform_with_state_in_pandas],
                         ids=lambda f: f.__name__)
def test_event_time_timers_fire_on_the_reconciled_watermark(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], tmp_path: Path,
        operator: Callable[[DataFrame], DataFrame]) -> None:
    """Per user, a count that an event-time timer emits 30 minutes after the user's latest event: the
    slow task's records are in the counts, and a timer fires on a control message alone.
    ``transformWithStateInPandas`` needs the RocksDB state store."""
    up, topic = upstream
    up.records("fast-0", range(0, 60, 6))
    up.records("fast-1", range(2, 60, 9))
    up.watermark("fast-0", 200)
    up.watermark("fast-1", 200)
    up.records("slow", range(1, 20, 4))
    up.watermark("slow", 20)
    emitted: dict[str, int] = {}

    def keep(df: DataFrame, _batch: int) -> None:
        for r in df.collect():
            assert r["user"] not in emitted, f"user {r['user']} emitted twice"
            emitted[r["user"]] = r["n"]

    provider = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(provider)
    assert before is not None
    spark.conf.set(provider, "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    try:  # a query takes its state store from the session when it starts
        query = (operator(with_watermark(stream(spark, topic, bootstrap_servers), "ts"))
                 .writeStream.outputMode("append").foreachBatch(keep)
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    finally:
        spark.conf.set(provider, before)
    try:
        wait_for(lambda: not query.isActive or any(p["numInputRows"] > 0 for p in query.recentProgress), 60,
                 "the first micro-batch")
        assert query.isActive, query_failure(query)
        time.sleep(2)
        assert emitted == {}, "no timer may fire before the slow task passes it"
        up.records("slow", range(21, 70, 3))  # within the users' 30 quiet minutes of the fast tasks' events
        up.watermark("slow", 120)  # every user's latest event is before 01:10: every timer is due at 01:40
        want = Counter(user for user, _ in up.sent)
        wait_for(lambda: emitted == dict(want), 60, "every user's count, fired by a watermark alone")
        up.end()
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None
        assert emitted == dict(want)
    finally:
        query.stop()


def test_a_restart_from_the_checkpoint_writes_no_window_twice_and_keeps_the_watermark(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], tmp_path: Path) -> None:
    up, topic = upstream
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    for task in TASKS:
        up.records(task, range(TASKS.index(task), 150, 5))
        up.watermark(task, 150)
    query = start_hourly(spark, topic, bootstrap_servers, out, checkpoint)
    closed = {k: n for k, n in up.expected().items() if k[0] < datetime(2026, 1, 1, 2)}
    try:
        wait_for(lambda: windows(spark, out) == closed, 60, "the windows before 02:00")
    finally:
        query.stop()
    progress = query.lastProgress
    assert progress is not None
    before = progress["eventTime"]["watermark"]

    for task in TASKS:
        up.records(task, range(150 + TASKS.index(task), 300, 5))
    up.end()
    again = start_hourly(spark, topic, bootstrap_servers, out, checkpoint)
    try:
        again.awaitTermination(120)
        assert not again.isActive and again.exception() is None
    finally:
        again.stop()
    assert windows(spark, out) == up.expected(), "every window once, across the restart"
    marks = [p["eventTime"]["watermark"] for p in again.recentProgress if "watermark" in p["eventTime"]]
    assert marks and min(marks) >= before, f"the watermark went back: {before} then {marks}"


def test_two_stages_carry_the_reconciled_watermark_and_the_end_of_stream_onward(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """Hop 1: hourly windows, written with ``writeStream.format("controlmsg")`` (event time: the window's
    end). Hop 2: three-hour sums of hop 1's results on hop 1's watermark. Neither calls ``end_stream``."""
    up, topic = upstream
    middle = new_topic(3)
    for task in TASKS:
        up.records(task, range(TASKS.index(task), 150, 5))
        up.watermark(task, 150)
    hop1, hop2, out = start_two_hops(spark, bootstrap_servers, topic, middle,
                                     options(middle, bootstrap_servers, run="h1", timeout="300"),
                                     str(tmp_path / "ck1"), tmp_path)
    try:
        # Hop 2's watermark is hop 1's input's reconciled watermark (02:30), not hop 1's latest window end.
        wait_for(lambda: any(p["eventTime"].get("watermark") == "2026-01-01T02:30:00.000Z"
                             for p in hop2.recentProgress), 90, "hop 1's watermark in hop 2")
        for task in TASKS:
            up.records(task, range(150 + TASKS.index(task), 300, 5))
        up.end()
        hop1.awaitTermination(180)
        hop2.awaitTermination(180)
        assert not hop1.isActive and hop1.exception() is None
        assert not hop2.isActive and hop2.exception() is None, "the end of stream passed through hop 1 by itself"
    finally:
        for q in (hop1, hop2):
            q.stop()
    got = {(r["window"]["start"], r["user"]): r["n"] for r in spark.read.schema(OUT_SCHEMA).parquet(str(out)).collect()}
    assert got == three_hour_sums(up)
    assert all(op["numRowsDroppedByWatermark"] == 0 for p in hop2.recentProgress for op in p["stateOperators"])


def start_two_hops(spark: SparkSession, servers: str, topic: str, middle: str, hop1_options: dict[str, str],
                   hop1_checkpoint: str, tmp_path: Path) -> tuple[StreamingQuery, StreamingQuery, Path]:
    """Hop 1: hourly windows of ``topic``, written on ``middle`` (run ``h1``; event time: the window's end) with
    ``hop1_options``. Hop 2: three-hour sums of hop 1's results on hop 1's watermark, to Parquet. Returns both
    queries and hop 2's output directory."""
    hop1 = (hourly(spark, topic, servers)
            .select(F.col("window.start").alias("start"), F.col("window.end").alias("end"), "user", "n", "total")
            .writeStream.format("controlmsg").options(**hop1_options).option("key", "user")
            .option("eventTime", "end").option("checkpointLocation", hop1_checkpoint)
            .trigger(availableNow=True).start())
    # Declares none of WATERMARK_COLUMNS: with_watermark, called right on the read, adds them.
    results = (spark.readStream.format("controlmsg").options(**options(middle, servers, run="h1", timeout="300"))
               .schema("start timestamp, end timestamp, user string, n long, total long").load())
    out = tmp_path / "out"
    hop2 = (with_watermark(results, "end").groupBy(F.window("end", "3 hours"), "user")
            .agg(F.sum("n").alias("n"), F.sum("total").alias("total"))
            .writeStream.outputMode("append").format("parquet").option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ck2")).trigger(availableNow=True).start())
    return hop1, hop2, out


def three_hour_sums(up: Upstream) -> dict[tuple[datetime, str], int]:
    """Hop 2's expected output: the records that are not late, per three-hour window of their hour's end."""
    want: Counter[tuple[datetime, str]] = Counter()
    for (start, user), n in up.expected().items():
        end = start + timedelta(hours=1)
        want[(end.replace(hour=end.hour - end.hour % 3), user)] += n
    return dict(want)


@pytest.mark.parametrize(("make", "step"), [
    (lambda ev: ev.filter(F.col("amount") > 0), "Filter"),
    (lambda ev: ev.dropna(subset=["user"]), "Filter"),
    (lambda ev: ev.dropDuplicates(["user", "ts"]), "Deduplicate"),
    (lambda ev: ev.join(ev.sparkSession.createDataFrame([("u1", "gold")], "user string, tier string"), "user"),
     "Join"),
])
def test_a_step_that_can_drop_the_watermark_rows_before_with_watermark_is_refused(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str],
        make: Callable[[DataFrame], DataFrame], step: str) -> None:
    """A filter before ``with_watermark`` dropped the watermark rows and the query ended with no window and no
    word; now ``with_watermark`` refuses it, naming the step, before any query starts."""
    events = stream(spark, new_topic(1), bootstrap_servers)
    with pytest.raises(ValueError, match=rf"must be called right on the readStream.*made with .*{step}"):
        with_watermark(make(events), "ts")
    # selects and new columns keep every row: accepted, as is a filter after it
    kept = events.withColumn("cents", F.col("amount") * 100).select("user", "ts", "cents", "_watermark",
                                                                     "_partition_watermark", "_control")
    assert with_watermark(kept, "ts").filter(F.col("cents") > 0).columns == [
        "user", "ts", "cents", "_watermark", "_partition_watermark"]


def filter_pushed_below_the_watermark_node(df: DataFrame, event_time: str) -> DataFrame:
    """What :func:`with_watermark` would run on a Spark whose optimizer pushed its filter below the watermark
    node (an upgrade that changed ``PushPredicateThroughNonJoin``): the same columns and watermark node, the
    watermark rows dropped before the node counts them."""
    control = F.coalesce(F.col("_control"), F.lit(False))
    return (df.where(~control).withColumn("_controlmsg_watermark", F.col("_watermark"))
            .withWatermark("_controlmsg_watermark", "0 seconds")
            .select(*[F.col(name).alias(name, metadata={"spark.watermarkDelayMs": 0}) if name == event_time
                      else F.col(name) for name in df.columns if name != "_control"]))


@pytest.mark.parametrize("follows", [True, False], ids=["with_watermark", "filter_pushed_below_the_node"])
def test_a_stage_fails_naming_the_spark_version_when_sparks_watermark_does_not_follow_the_reconciled_one(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], new_topic: Callable[..., str],
        tmp_path: Path, follows: bool) -> None:
    """Each micro-batch's sink compares Spark's watermark with the reconciled watermark its input had given by
    the micro-batch before. With ``with_watermark`` they are equal and the stage ends with its input; with the
    plan a Spark that pushes the filter would run, the watermark rows never reach the node, Spark's watermark
    stays at the records' ``_watermark`` (01:00) after the input ended, and the query fails with
    :class:`~controlmsg.errors.WatermarkNotFollowed`, naming Spark's version."""
    import pyspark

    up, topic = upstream
    for task in TASKS:
        up.records(task, range(TASKS.index(task), 60, 5))
        up.watermark(task, 60)
    events = stream(spark, topic, bootstrap_servers)
    marked = with_watermark(events, "ts") if follows else filter_pushed_below_the_watermark_node(events, "ts")
    query = (marked.select("user", "ts", "amount").writeStream.format("controlmsg")
             .options(**options(new_topic(2), bootstrap_servers, run="s1")).option("key", "user")
             .option("eventTime", "ts").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        wait_for(lambda: not query.isActive or any(p["numInputRows"] > 0 for p in query.recentProgress), 120,
                 "the first micro-batch")
        assert query.isActive, query_failure(query)
        # Records read in a later micro-batch carry _watermark 01:00; none carries a later one.
        for task in TASKS:
            up.records(task, range(60 + TASKS.index(task), 120, 5))
        up.end()
        if follows:
            query.awaitTermination(120)
            assert not query.isActive and query.exception() is None
            marks = [p["eventTime"].get("watermark") for p in query.recentProgress]
            assert any(m.startswith("9999-12-31") for m in marks if m), f"Spark's watermark never ended: {marks}"
        else:
            version = re.escape(pyspark.__version__)
            with pytest.raises(Exception, match=(
                    r"controlmsg\.errors\.WatermarkNotFollowed: .*Spark's watermark in micro-batch \d+ is "
                    rf"2026-01-01T01:00:00\.000Z, behind the reconciled watermark 9999-12-31T.*: Spark {version} "
                    "does not follow with_watermark")):
                query.awaitTermination(120)
    finally:
        query.stop()


def test_with_watermark_adds_the_watermark_fields_to_a_read_that_declares_none(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    """Right on the read, ``with_watermark`` and ``late_records`` read the stream again with
    :data:`WATERMARK_COLUMNS` added (the two-hop test runs such a query); after a step, they say where to call
    it, and the old way (the fields spelled into the schema) is unchanged."""
    topic = new_topic(1)
    bare = (spark.readStream.format("controlmsg").options(**options(topic, bootstrap_servers))
            .schema("user string, ts timestamp, amount long").load())
    assert with_watermark(bare, "ts").columns == ["user", "ts", "amount", "_watermark", "_partition_watermark"]
    assert late_records(bare, "ts").columns == ["user", "ts", "amount", "_watermark", "_partition_watermark"]
    with pytest.raises(ValueError, match=r"needs the fields \['_watermark', '_control'\].*call it right on"):
        with_watermark(bare.select("user", "ts"), "ts")
    assert with_watermark(stream(spark, topic, bootstrap_servers), "ts").columns == [
        "user", "ts", "amount", "_watermark", "_partition_watermark"]


def test_sparks_max_watermark_policy_is_refused_in_one_line(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    """``multipleWatermarkPolicy=max`` would run a query over two inputs on the faster one's watermark."""
    topic = new_topic(1)
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "max")
    try:
        with pytest.raises(ValueError, match=r"multipleWatermarkPolicy is 'max': with_watermark needs 'min'"):
            with_watermark(stream(spark, topic, bootstrap_servers), "ts")
    finally:
        spark.conf.unset("spark.sql.streaming.multipleWatermarkPolicy")
    assert with_watermark(stream(spark, topic, bootstrap_servers), "ts").isStreaming  # min, Spark's default
