"""``format("controlmsg")`` through Spark Connect: a client session (``sc://``) against a real Connect server
started from the pyspark installation (:mod:`controlmsg.clusters.connect`, one for the module), on a real
broker.

The server runs in a directory of its own, not the checkout, with this venv's Python for its workers: it
finds ``pyspark_controlmsg`` through the installed package, editable (as ``make setup`` installs it) or not.
A session that has not registered anything writes and reads with ``format("controlmsg")``, and reads as a
stream to the end of stream, its progress carrying the source's lag and upstream
(:func:`~controlmsg.spark.source_metrics`); a session on which ``controlmsg.spark.register`` ran (the
documented fallback) reads, writes a stream, and runs a stateful stage on the reconciled watermark
(:func:`with_watermark`).

pyspark picks Connect or classic functions (``F.col``...) by the process's environment: the module sets
``SPARK_CONNECT_MODE_ENABLED`` while it runs and removes it after, and builds its sessions with the
Connect builder itself, so it runs beside the classic session of the other Spark tests.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from controlmsg.clusters.connect import ConnectServer, start_server, stop_server
from controlmsg.clusters.job_group import JobGroup
from controlmsg.core.events import StreamEnded, WatermarkAdvanced
from controlmsg.kafka import ControlReader, ControlWriter
from controlmsg.kafka.data_records import DataRecord
from controlmsg.spark import WATERMARK_COLUMNS, observed_counts, register, source_metrics, with_watermark
from tests.spark.helpers import make_rows, options
from tests.spark.jobs import kill9
from tests.spark.test_event_time import Upstream, windows

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROWS_SCHEMA = "user string, ts long, amount long, score double, note string"
WAIT_S = 180
T0 = 1_767_225_600_000


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    server = start_server(tmp_path_factory.mktemp("connect-server"), master="local[2]")
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def connect_mode() -> Iterator[None]:
    before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["SPARK_CONNECT_MODE_ENABLED"]
        else:
            os.environ["SPARK_CONNECT_MODE_ENABLED"] = before


def connect_session(server: ConnectServer) -> Any:
    """A new Connect session (its own server-side session)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    return RemoteSparkSession.builder.remote(server.url).create()


@pytest.fixture(scope="module")
def remote(connect_server: ConnectServer, connect_mode: None) -> Iterator[SparkSession]:
    """The documented way: a Connect session, then ``controlmsg.spark.register`` on it."""
    session = connect_session(connect_server)
    register(session)
    register(session)  # idempotent
    try:
        yield session
    finally:
        session.stop()


def sample(spark: SparkSession, n: int = 200) -> tuple[DataFrame, list[tuple[Any, ...]]]:
    rows = make_rows(n, users=7)
    return spark.createDataFrame(rows, ROWS_SCHEMA), rows


def as_tuples(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in ("user", "ts", "amount", "score", "note")) for r in df.collect())


def write_batch(spark: SparkSession, topic: str, servers: str) -> list[tuple[Any, ...]]:
    df, rows = sample(spark)
    df.repartition(3).write.format("controlmsg").mode("append").options(**options(topic, servers)) \
        .option("key", "user").option("eventTime", "ts").save()
    return rows


@pytest.fixture
def unregistered(connect_server: ConnectServer, connect_mode: None) -> Iterator[SparkSession]:
    """A Connect session on which nothing was registered: ``format("controlmsg")`` is the server's discovery
    of ``pyspark_controlmsg`` (an editable install here: ``make setup``)."""
    session = connect_session(connect_server)
    try:
        yield session
    finally:
        session.stop()


def test_batch_write_and_read_without_register(
        unregistered: SparkSession, remote: SparkSession, bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    rows = write_batch(unregistered, topic, bootstrap_servers)
    for session in (unregistered, remote):
        got = session.read.format("controlmsg").options(**options(topic, bootstrap_servers)).schema(ROWS_SCHEMA).load()
        assert as_tuples(got) == sorted(rows)


def test_available_now_read_stream_without_register_ends_at_end_of_stream_and_reports_its_lag(
        unregistered: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(2)
    rows = write_batch(unregistered, topic, bootstrap_servers)
    out = tmp_path / "out"
    query = (unregistered.readStream.format("controlmsg").options(**options(topic, bootstrap_servers))
             .schema(f"{ROWS_SCHEMA}, _watermark timestamp").load()
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(WAIT_S)
        assert not query.isActive, "the availableNow query ends by itself at the end of stream"
        assert query.exception() is None
        last = source_metrics(query.lastProgress or {})[topic]
    finally:
        query.stop()
    assert as_tuples(unregistered.read.parquet(str(out))) == sorted(rows)
    assert last["maxOffsetsBehindLatest"] == "0" and last["endOfStream"] == "true"
    assert last["upstreamTasksEnded"] == last["upstreamTasksExpected"] == "1"  # a batch write's driver


def test_write_stream_carries_the_end_of_stream_onward(
        remote: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    source, sink = new_topic(2), new_topic(2)
    rows = write_batch(remote, source, bootstrap_servers)
    query = (remote.readStream.format("controlmsg").options(**options(source, bootstrap_servers))
             .schema(ROWS_SCHEMA).load().repartition(2)
             .writeStream.format("controlmsg").options(**options(sink, bootstrap_servers, run="s1"))
             .option("key", "user").option("eventTime", "ts")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(WAIT_S)
        assert not query.isActive and query.exception() is None
    finally:
        query.stop()
    # A batch read ends only at the end of stream: the stream writer wrote it by itself.
    got = remote.read.format("controlmsg").options(**options(sink, bootstrap_servers, run="s1")) \
        .schema(ROWS_SCHEMA).load()
    assert as_tuples(got) == sorted(rows)


def test_a_stateful_stage_on_the_reconciled_watermark(
        remote: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """Item 1's hourly counts, through Connect: the slow task's records, behind the fast tasks' event
    times, are in their windows; each window once; the query ends at the end of stream."""
    topic = new_topic(4)
    up = Upstream(kafka_config, topic)
    try:
        up.records("fast-0", range(0, 180, 7))
        up.records("fast-1", range(3, 180, 11))
        up.watermark("fast-0", 180)
        up.watermark("fast-1", 180)
        up.records("slow", range(1, 180, 5))
        up.end()
    finally:
        for w in up.writers.values():
            w.close()
    events = (remote.readStream.format("controlmsg").options(**options(topic, bootstrap_servers, timeout="300"))
              .schema(f"user string, ts timestamp, amount long, {WATERMARK_COLUMNS}").load())
    out = tmp_path / "out"
    query = (with_watermark(events, "ts").groupBy(F.window("ts", "1 hour"), "user").agg(F.count("*").alias("n"),
                                                                                     F.sum("amount").alias("total"))
             .writeStream.outputMode("append").format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        query.awaitTermination(WAIT_S)
        assert not query.isActive and query.exception() is None
    finally:
        query.stop()
    want: Counter[tuple[datetime, str]] = up.expected()
    assert windows(remote, out) == want, "every window once, with the slow task's records"
    progress = query.recentProgress
    assert all(op["numRowsDroppedByWatermark"] == 0 for p in progress for op in p["stateOperators"])
    counts = [c for c in map(observed_counts, progress) if c is not None]
    assert counts and sum(c["late_rows"] for c in counts) == 0
    assert sum(c["watermark_rows"] for c in counts) >= 1, "watermark rows reached the watermark node"


@pytest.mark.beside  # a client program, killed and started again: about 40 s, in the second lane
def test_a_stage_whose_connect_client_went_away_fails_in_one_line_and_a_new_client_ends_it(
        connect_server: ConnectServer, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """A Connect client follows its stage (``stageProgress driver``, ``await_stage``) and is killed: the query
    runs on in the server with nothing writing its rounds. Its sink sees the follower's round stand still while
    micro-batches commit, and fails the query after ``timeout`` in one line (it used to run on unfollowed until
    the server dropped the session). The client program started again ends the stream: every record once,
    then the end of stream."""
    source, sink = new_topic(2), new_topic(2)
    writers = [ControlWriter(kafka_config, source, task_name=f"t{t}", task_count=2, run_id="r1") for t in range(2)]
    sent: Counter[tuple[str, int, int]] = Counter()

    def write(minute: int, *, end: bool = False) -> None:
        for t, writer in enumerate(writers):
            record = (f"u{minute % 3}", T0 + minute * 60_000 + t, minute * 2 + t)
            writer.send({"user": record[0], "ts": record[1], "amount": record[2]}, key=record[0])
            sent[record] += 1
            if end:
                writer.send_end_of_stream()
            else:
                writer.send_watermark(T0 + (minute + 1) * 60_000)
            writer.flush()

    command = [sys.executable, "-m", "tests.spark.connect_stage_driver", "--remote", connect_server.url,
               "--input", source, "--output", sink, "--checkpoint", str(tmp_path / "ck"),
               "--bootstrap-servers", bootstrap_servers, "--timeout", "10"]
    refusal = "has written no stage round after micro-batch"
    jobs = JobGroup(tmp_path, env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"})
    items: list[Any] = []
    try:
        for minute in range(3):
            write(minute)
        jobs.start("client", command)
        with ControlReader(kafka_config, sink, run_id="s1", topic_timeout=120) as down:
            deadline = time.monotonic() + WAIT_S
            while not any(isinstance(i, WatermarkAdvanced) for i in items):  # the client's rounds come through
                assert time.monotonic() < deadline, f"no stage round in {WAIT_S} s:\n{jobs['client'].tail()}"
                items += down.poll(0.5)
            kill9(jobs, "client")
            server_log = connect_server.log.read_text(encoding="utf-8", errors="replace").count(refusal)
            minute = 3
            while connect_server.log.read_text(encoding="utf-8", errors="replace").count(refusal) == server_log:
                assert minute < 3 + WAIT_S // 2, "the orphaned query was not failed"
                write(minute)  # a micro-batch to commit, with nobody following
                minute += 1
                items += down.poll(2)
            jobs.start("client", command)
            write(minute, end=True)
            codes = jobs.wait(WAIT_S)
            assert codes == {"client": 0}, jobs["client"].tail()
            assert "ended True" in jobs["client"].tail()
            items += down.read_until_end(timeout=60)
    finally:
        jobs.close()
        for writer in writers:
            writer.close()
    got = Counter((r["user"], r["ts"], r["amount"]) for r in
                  (orjson.loads(i.payload) for i in items if isinstance(i, DataRecord)))
    assert got == sent, "every record once, across the client's kill and the failed query"
    assert isinstance(items[-1], StreamEnded)
