"""Readers wait for their upstream: started first, they complete once it has ended; with a timeout they
fail with a message that names the partitions and the upstream tasks still owed."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from controlmsg.kafka import ControlWriter, create_topic
from controlmsg.spark import run_status
from tests.conftest import MAX_ATTEMPTS
from tests.spark.helpers import SCHEMA, make_rows, options, read, write

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def test_reader_started_before_the_upstream_job_waits_for_it(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    topic = f"{request.node.name}-{uuid.uuid4().hex[:8]}"  # does not exist yet
    rows = make_rows(300, users=6)
    got: dict[str, Any] = {}

    def downstream() -> None:
        try:
            # One reader task for all partitions, so the upstream job keeps a core of the two.
            df = read(spark, topic, bootstrap_servers, schema=SCHEMA, timeout="120", partitionsPerTask="3")
            got["rows"] = df.collect()
        except BaseException as exc:  # reported by the main thread
            got["error"] = exc
        got["done"] = time.monotonic()

    reader = threading.Thread(target=downstream, daemon=True)
    reader.start()
    # 1. No topic: planning waits for it, and does not create it (a broker may auto-create topics).
    time.sleep(6)
    assert reader.is_alive() and not got, got
    assert topic not in AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(timeout=10).topics
    create_topic(kafka_config, topic, 3)
    # 2. The topic, but no upstream yet: the reader task runs and waits for end of stream.
    deadline = time.monotonic() + 60
    while not spark.sparkContext.statusTracker().getActiveStageIds():
        assert time.monotonic() < deadline and reader.is_alive(), got
        time.sleep(0.2)
    time.sleep(1)
    assert reader.is_alive() and not got, got
    # 3. The upstream job runs (on the other core) and ends: the reader completes with its rows.
    write(spark.createDataFrame(rows, SCHEMA).repartition(2), topic, bootstrap_servers, key="user", eventTime="ts")
    written = time.monotonic()
    reader.join(120)
    assert not reader.is_alive()
    assert "error" not in got, got.get("error")
    assert got["done"] >= written
    status = run_status(options(topic, bootstrap_servers))
    assert status is not None and status["rows"] == 300
    assert sorted(tuple(r) for r in got["rows"]) == sorted(rows)


def test_reader_timeout_names_partitions_and_tasks(
    spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    # An upstream of three tasks named like controlmsg.core.naming.task_name: p0 ended, p1 is under way, p2 silent.
    writers = [ControlWriter(kafka_config, topic, task_name=f"up-r1-p{i}", task_count=3, run_id="r1")
               for i in range(2)]
    writers[0].send({"user": "a", "ts": 1}, key="a")
    writers[0].send_end_of_stream()
    writers[1].send_watermark(1_000)
    for w in writers:
        w.flush()
    # One reader task for the three partitions: the job's error is the message of the task that failed
    # (with several tasks, whichever ran out of attempts first).
    df = read(spark, topic, bootstrap_servers, timeout="2", partitionsPerTask="3")
    group = f"timeout-{uuid.uuid4().hex[:8]}"
    spark.sparkContext.setJobGroup(group, "a reader that times out")
    try:
        with pytest.raises(Exception) as info:
            df.collect()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    message = str(info.value)
    assert "EndOfStreamTimeout" in message
    assert (f"topic '{topic}' run 'r1': end of stream not reached within 2 s on partitions "
            "[0, 1, 2] (this reader reads [0, 1, 2])") in message
    for p in (0, 1, 2):
        assert (f"partition {p}: waiting for end of stream from upstream tasks up-r1-p1 (reported, not ended) "
                f"and upstream tasks up-r1-p2 (not heard from); 1 of 3 ended") in message
    # Spark tried the reader task MAX_ATTEMPTS times, each attempt ending at its own 2 s timeout (the message above).
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
    infos = [tracker.getStageInfo(s) for job in jobs if job is not None for s in job.stageIds]
    assert [(i.numTasks, i.numFailedTasks) for i in infos if i is not None] == [(1, MAX_ATTEMPTS)], infos


def test_reader_timeout_without_any_control_message(
    spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    df = read(spark, topic, bootstrap_servers, "r9", timeout="1", partitionsPerTask="2")
    with pytest.raises(Exception, match=r"partition 1: no control message of the run yet \(upstream task count "
                                        r"unknown\)"):
        df.collect()


def test_reader_timeout_when_the_topic_never_appears(spark: SparkSession, bootstrap_servers: str) -> None:
    topic = f"never-{uuid.uuid4().hex[:8]}"
    df = read(spark, topic, bootstrap_servers, timeout="1")
    with pytest.raises(Exception, match=f"topic '{topic}' does not exist"):
        df.collect()
