"""A stage written on with ``writeStream.format("controlmsg")`` learns its watermark and the end of its input
from its query's offset log. Where that log cannot be read, the query is refused when it starts, naming the
location and the option of the weaker rule; it never carries on with a weaker rule unasked (the stage would
end and its output would never get its end of stream). ``viewfs:`` mounted onto a local directory stands
for any location that only Spark's Hadoop file systems reach (``hdfs:``, ``s3a:``...): Spark reads and
writes it through Hadoop, Python cannot."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from controlmsg.kafka import ControlWriter
from controlmsg.kafka.admin import partition_count
from controlmsg.spark import WATERMARK_COLUMNS, await_stage, end_stream, run_status
from controlmsg.spark.stage import checkpoint_progress, claim_stage, progress_of, round_batch, stage_status
from controlmsg.spark.stage_listener import follow_stages, stop_following
from tests.spark.helpers import BASE_TS, options
from tests.spark.test_event_time import (
    OUT_SCHEMA,
    T0,
    TASKS,
    Upstream,
    start_two_hops,
    three_hour_sums,
    upstream,
    wait_for,
)
from tests.spark.topic_dump import count_by, dump_topic

pytestmark = [pytest.mark.spark, pytest.mark.kafka]
__all__ = ["upstream"]  # the fixture of tests/spark/test_event_time.py

ROWS = 40
LAST_TS = BASE_TS + (ROWS - 1) * 60_000


@pytest.fixture
def ended_input(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> str:
    """A topic holding one upstream task's run ``r1``: ``ROWS`` records a minute apart, then its end."""
    topic = new_topic(2)
    writer = ControlWriter(kafka_config, topic, task_name="t0", task_count=1, run_id="r1")
    for i in range(ROWS):
        ts = BASE_TS + i * 60_000
        writer.send({"user": f"u{i % 3}", "ts": datetime.fromtimestamp(ts / 1000, UTC).isoformat()}, key=f"u{i % 3}")
    writer.send_end_of_stream()
    writer.flush()
    writer.close()
    return topic


@pytest.fixture
def viewfs(spark: SparkSession, tmp_path: Path) -> Iterator[str]:
    """A ``viewfs://`` root mounted onto a local directory, in the session's Hadoop configuration."""
    key = "fs.viewfs.mounttable.cm.link./stages"
    (tmp_path / "mounted").mkdir()
    spark.conf.set(key, (tmp_path / "mounted").as_uri())
    try:
        yield "viewfs://cm/stages"
    finally:
        spark.conf.unset(key)


def start_stage(spark: SparkSession, servers: str, source: str, out: str, *, watermark_rows: bool = False,
                **more: str) -> StreamingQuery:
    """A stateless stage: the input run ``r1`` of ``source`` onto run ``s1`` of ``out``, ``availableNow``.
    ``watermark_rows``: read them too (and leave them out of the output): the reader then runs a micro-batch
    after the one that saw the end of stream."""
    schema = f"user string, ts timestamp, {WATERMARK_COLUMNS}" if watermark_rows else "user string, ts timestamp"
    events = (spark.readStream.format("controlmsg").options(**options(source, servers, timeout="120"))
              .schema(schema).load())
    if watermark_rows:
        events = events.where(~F.col("_control")).select("user", "ts")
    return (events.writeStream.format("controlmsg").options(**options(out, servers, run="s1", **more))
            .option("key", "user").option("eventTime", "ts").trigger(availableNow=True).start())


def refusal(query: StreamingQuery) -> str:
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(120)
    return str(failed.value)


def test_a_checkpoint_python_cannot_read_is_refused_when_the_query_starts(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], ended_input: str,
        viewfs: str) -> None:
    out = f"out-{uuid.uuid4().hex[:8]}"
    location = f"{viewfs}/stage"
    query = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=location)
    message = refusal(query)
    assert f"checkpointLocation {location!r} is not on the driver's local file system (scheme 'viewfs')" in message
    assert "set option stageProgress to driver and wait on the query with controlmsg.spark.await_stage" in message
    assert "or to eventTime for the weaker rule" in message
    assert partition_count(kafka_config, out, 10) is None, "refused before anything was created"


def test_a_query_without_the_checkpoint_option_is_refused(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, tmp_path: Path) -> None:
    """Spark's default location (``spark.sql.streaming.checkpointLocation``) is not passed to a data
    source: the writer cannot find the offset log and says so."""
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "default"))
    try:
        query = start_stage(spark, bootstrap_servers, ended_input, f"out-{uuid.uuid4().hex[:8]}")
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    message = refusal(query)
    assert "no option checkpointLocation" in message and "stageProgress" in message


def test_stage_progress_event_time_takes_the_weaker_rule_and_ends_by_hand(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str],
        viewfs: str) -> None:
    out = new_topic(2)
    query = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=f"{viewfs}/weaker",
                        stageProgress="eventTime", allowedLateness="5m")
    query.awaitTermination(180)
    assert query.exception() is None
    status = run_status(options(out, bootstrap_servers, run="s1"))
    assert status is not None
    assert status["watermark"] == LAST_TS - 5 * 60_000, "the largest eventTime minus allowedLateness"
    assert not status.get("ended"), "no end of stream without the offset log"
    assert end_stream(options(out, bootstrap_servers, run="s1")) == 1
    ended = run_status(options(out, bootstrap_servers, run="s1"))
    assert ended is not None and ended["ended"] is True


def test_an_offset_log_of_version_2_is_read(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """``spark.sql.streaming.offsetLog.formatVersion=2`` prefixes each source's offset with its id: the
    stage still ends by itself."""
    out, checkpoint = new_topic(2), tmp_path / "ck"
    spark.conf.set("spark.sql.streaming.offsetLog.formatVersion", "2")
    try:
        query = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=str(checkpoint))
        query.awaitTermination(180)
    finally:
        spark.conf.unset("spark.sql.streaming.offsetLog.formatVersion")
    assert query.exception() is None
    first = (checkpoint / "offsets" / "0").read_text().splitlines()
    assert first[0] == "v2" and first[2].startswith("0:{"), first[:1] + first[2:]
    status = run_status(options(out, bootstrap_servers, run="s1"))
    assert status is not None and status["ended"] is True, status


def test_stage_progress_driver_ends_a_stage_on_a_checkpoint_anywhere(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str],
        viewfs: str) -> None:
    """A stateless stage: its driver program's ``await_stage`` writes the end of stream once the input
    ended, from the query's progress alone; the micro-batch Spark runs after that one writes nothing."""
    out = new_topic(2)
    opts = options(out, bootstrap_servers, run="s1", stageProgress="driver")
    query = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=f"{viewfs}/driver",
                        stageProgress="driver", watermark_rows=True)
    assert await_stage(query, opts, timeout=180) is True
    status = run_status(opts)
    assert status is not None and status["ended"] is True and status["endedBy"] == "stage"
    assert status["maxEventTime"] == LAST_TS
    assert end_stream(opts) == 1, "ending it again by hand changes nothing"
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, out)
    assert sum(1 for r in wire if r.kind == "data") == ROWS
    assert count_by(wire, "eos") == {(0, "spark-s1-driver"): 1, (1, "spark-s1-driver"): 1}


def test_two_stages_on_hadoop_checkpoints_carry_the_watermark_and_the_end_of_stream(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], new_topic: Callable[..., str],
        viewfs: str, tmp_path: Path) -> None:
    """The two hops of tests/spark/test_event_time.py, hop 1 with its checkpoint on viewfs and
    ``stageProgress driver``: hop 2 gets hop 1's reconciled watermark and its end of stream, and every window."""
    up, topic = upstream
    middle = new_topic(3)
    opts = options(middle, bootstrap_servers, run="h1", timeout="300", stageProgress="driver")
    for task in TASKS:
        up.records(task, range(TASKS.index(task), 150, 5))
        up.watermark(task, 150)
    hop1, hop2, out = start_two_hops(spark, bootstrap_servers, topic, middle, opts, f"{viewfs}/hop1", tmp_path)
    ended: list[bool] = []
    follower = threading.Thread(target=lambda: ended.append(await_stage(hop1, opts, timeout=240)))
    follower.start()
    try:
        # Hop 2's watermark is hop 1's input's reconciled watermark (02:30), from await_stage's rounds.
        wait_for(lambda: any(p["eventTime"].get("watermark") == "2026-01-01T02:30:00.000Z"
                             for p in hop2.recentProgress), 120, "hop 1's watermark in hop 2")
        for task in TASKS:
            up.records(task, range(150 + TASKS.index(task), 300, 5))
        up.end()
        follower.join(240)
        assert ended == [True]
        hop2.awaitTermination(180)
        assert not hop2.isActive and hop2.exception() is None, "the end of stream passed through hop 1"
    finally:
        for q in (hop1, hop2):
            q.stop()
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, middle)
    marks = [r.value.timestamp for r in wire if r.kind == "watermark" and r.partition == 0]
    assert marks and marks == sorted(marks) and marks[-1] >= int(T0.timestamp() * 1000) + 150 * 60_000, marks
    assert count_by(wire, "eos") == {(p, "spark-h1-driver"): 1 for p in range(3)}
    got = {(r["window"]["start"], r["user"]): r["n"] for r in spark.read.schema(OUT_SCHEMA).parquet(str(out)).collect()}
    assert got == three_hour_sums(up)


def test_stage_progress_driver_without_a_follower_fails_then_resumes_exactly_once(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str],
        viewfs: str) -> None:
    """A session without the stage listener (Spark Connect; here taken off) and ``awaitTermination()`` in
    place of ``await_stage``: until 2026-11-27 the stage ended by itself, exit code 0, and its output never
    got a watermark or its end of stream. Now the sink's first commit waits for a follower's claim (the option
    ``timeout``), then fails the query in one line. The same query started again and followed ends the
    stream, with every record once (the first start's tasks had committed theirs)."""
    out, location = new_topic(2), f"{viewfs}/unfollowed"
    stop_following(spark)
    try:
        # the listener's thread ended with it (until 2026-11-28 it stayed, with its exit hook)
        assert not [t for t in threading.enumerate() if t.name == "controlmsg-stage-listener"]
        query = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=location,
                            stageProgress="driver", timeout="5")
        message = refusal(query)
    finally:
        follow_stages(spark)
    assert "needs the driver program to follow the query: nothing claimed query run" in message
    assert "controlmsg.spark.await_stage(query, options)" in message
    status = run_status(options(out, bootstrap_servers, run="s1"))
    assert status is None or not status.get("ended")

    opts = options(out, bootstrap_servers, run="s1", stageProgress="driver")
    again = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=location,
                        stageProgress="driver")
    assert await_stage(again, opts, timeout=180) is True
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, out)
    assert sum(1 for r in wire if r.kind == "data") == ROWS
    assert count_by(wire, "eos") == {(0, "spark-s1-driver"): 1, (1, "spark-s1-driver"): 1}


@pytest.mark.parametrize("wait", ["awaitTermination", "await_stage"])
def test_a_driver_started_again_after_the_last_micro_batch_ends_the_stream_from_the_checkpoint(
        spark: SparkSession, bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str], viewfs: str,
        wait: str) -> None:
    """A driver killed after the stage's last micro-batch committed and before its round was written (here its
    follower claims the run, as at a start, and writes no round), then started again: nothing is left to run.
    The stream ends all the same, with the round of the last micro-batch the checkpoint (on viewfs) holds as
    committed, whether the new driver waits with ``awaitTermination()`` (the session's listener) or with
    ``await_stage``. Spark reports the restart's trigger that runs nothing under the id of the micro-batch it
    would have run; until 2026-11-28 the round was written under that id, so a real micro-batch of that id
    later would have found its round written (its end of stream skipped). ``checkpoint_progress`` reads the
    same facts from the checkpoint itself, for a driver that gets no progress at all."""
    out, location = new_topic(2), f"{viewfs}/restarted-{wait}"
    opts = options(out, bootstrap_servers, run="s1", stageProgress="driver")
    stop_following(spark)
    try:
        first = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=location,
                            stageProgress="driver")
        claim_stage(opts, str(first.runId))
        first.awaitTermination(180)
        assert first.exception() is None and first.lastProgress is not None
    finally:
        follow_stages(spark)
    last = int(first.lastProgress["batchId"])
    claimed = stage_status(opts)
    assert claimed is not None and "batch" not in claimed, claimed  # claimed, and no round
    assert count_by(dump_topic({"bootstrap.servers": bootstrap_servers}, out), "eos") == {}, "no round written yet"
    found = checkpoint_progress(spark._jsparkSession, location, str(first.id))
    assert found is not None and round_batch(found) == last, found
    facts = progress_of(found)
    assert facts.inputs_ended and not facts.stateful, facts

    again = start_stage(spark, bootstrap_servers, ended_input, out, checkpointLocation=location,
                        stageProgress="driver")
    if wait == "await_stage":
        assert await_stage(again, opts, timeout=180) is True
    else:
        again.awaitTermination(180)
        assert again.exception() is None
        wait_for(lambda: (stage_status(opts) or {}).get("ended") is True, 60, "the listener's last round")
    assert again.lastProgress is not None and "addBatch" not in again.lastProgress["durationMs"], "ran nothing"
    assert (stage_status(opts) or {}).get("batch") == last, "the round of the last committed micro-batch"
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, out)
    assert sum(1 for r in wire if r.kind == "data") == ROWS
    assert count_by(wire, "eos") == {(0, "spark-s1-driver"): 1, (1, "spark-s1-driver"): 1}


def test_await_termination_on_a_checkpoint_anywhere_carries_the_watermark_and_the_end_of_stream(
        spark: SparkSession, bootstrap_servers: str, upstream: tuple[Upstream, str], new_topic: Callable[..., str],
        viewfs: str, tmp_path: Path) -> None:
    """The issue-37 stage as Spark teams write it: ``with_watermark``, hourly windows, ``stageProgress driver``
    on viewfs, and the driver waits with ``awaitTermination()``. Until 2026-11-27 hop 1 ended with its windows
    and no watermark and no end of stream, and hop 2 waited forever; now the session's listener follows it."""
    up, topic = upstream
    middle = new_topic(3)
    opts = options(middle, bootstrap_servers, run="h1", timeout="300", stageProgress="driver")
    for task in TASKS:
        up.records(task, range(TASKS.index(task), 300, 5))
        up.watermark(task, 300)
    up.end()
    hop1, hop2, out = start_two_hops(spark, bootstrap_servers, topic, middle, opts, f"{viewfs}/awaited", tmp_path)
    try:
        hop1.awaitTermination(240)
        assert not hop1.isActive and hop1.exception() is None
        hop2.awaitTermination(240)
        assert not hop2.isActive and hop2.exception() is None, "the end of stream passed through hop 1"
    finally:
        for q in (hop1, hop2):
            q.stop()
    status = run_status(opts)
    assert status is not None and status["ended"] is True
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, middle)
    assert count_by(wire, "eos") == {(p, "spark-h1-driver"): 1 for p in range(3)}
    got = {(r["window"]["start"], r["user"]): r["n"] for r in spark.read.schema(OUT_SCHEMA).parquet(str(out)).collect()}
    assert got == three_hour_sums(up)


DRIVER_PROGRAM = """
import sys
from controlmsg.spark import spark_session
source, out, servers, mounted = sys.argv[1:5]
spark = spark_session("local[2]", conf={"fs.viewfs.mounttable.cm.link./stages": mounted})
opts = {"topic": out, "runId": "s1", "kafka.bootstrap.servers": servers, "stageProgress": "driver"}
query = (spark.readStream.format("controlmsg").options(topic=source, runId="r1", timeout="120")
         .option("kafka.bootstrap.servers", servers).schema("user string, ts timestamp").load()
         .writeStream.format("controlmsg").options(**opts).option("key", "user").option("eventTime", "ts")
         .option("checkpointLocation", "viewfs://cm/stages/program").trigger(availableNow=True).start())
query.awaitTermination()
print("awaited", flush=True)
"""


def test_a_driver_program_that_ends_right_after_await_termination_still_ends_the_stream(
        bootstrap_servers: str, ended_input: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    """Spark tells a listener of the last micro-batch after ``awaitTermination()`` has returned: the program's
    exit waits for the stage's last round (``atexit``), so a ``spark-submit`` script of four lines ends its
    output's stream."""
    out = new_topic(2)
    (tmp_path / "mounted").mkdir()
    program = tmp_path / "stage.py"
    program.write_text(DRIVER_PROGRAM)
    done = subprocess.run([sys.executable, str(program), ended_input, out, bootstrap_servers,
                           (tmp_path / "mounted").as_uri()], capture_output=True, text=True, timeout=300,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and "awaited" in done.stdout, done.stderr[-3000:]
    status = run_status(options(out, bootstrap_servers, run="s1", stageProgress="driver"))
    assert status is not None and status.get("ended") is True, (status, done.stderr[-3000:])
    wire = dump_topic({"bootstrap.servers": bootstrap_servers}, out)
    assert sum(1 for r in wire if r.kind == "data") == ROWS
    assert count_by(wire, "eos") == {(0, "spark-s1-driver"): 1, (1, "spark-s1-driver"): 1}
