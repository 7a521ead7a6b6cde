"""Option ``groupId``: a stream read commits what each micro-batch consumed to a consumer group, and Kafka's
own ``kafka-consumer-groups --describe`` (run from Kafka's jars, :mod:`controlmsg.clusters.kafka_tools`) shows
the stage's lag, down to 0 at the end of stream, on an intermediate topic (whose transactions end in markers
that no record follows) and on a plain topic. The group has no member: nothing reads from it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from controlmsg.clusters.kafka_tools import consumer_groups
from controlmsg.kafka import ControlWriter
from tests.spark.helpers import options

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = 1_767_225_600_000


def described(servers: str, group: str) -> tuple[dict[tuple[str, int], tuple[int, int, int]], str]:
    """``kafka-consumer-groups --describe --group <group>``: (topic, partition) -> (current offset, log end
    offset, lag), as the tool prints them, and its whole output."""
    text = consumer_groups(servers, "--describe", "--group", group)
    rows: dict[tuple[str, int], tuple[int, int, int]] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == group and cells[2].isdigit():
            rows[(cells[1], int(cells[2]))] = (int(cells[3]), int(cells[4]), int(cells[5]))
    return rows, text


def run_to_the_end(spark: SparkSession, opts: dict[str, str], schema: str) -> None:
    query = (spark.readStream.format("controlmsg").options(**opts).schema(schema).load()
             .writeStream.format("noop").trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the stream did not end"
        assert query.exception() is None
    finally:
        query.stop()


def test_an_intermediate_topics_stage_shows_its_lag_in_a_consumer_group_falling_to_0_at_the_end(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
        new_topic: Callable[..., str]) -> None:
    topic, group = new_topic(2), f"lag-{new_topic(1)}"
    writers = [ControlWriter(kafka_config, topic, task_name=f"t{t}", task_count=2, run_id="r1") for t in range(2)]
    try:
        for t, writer in enumerate(writers):
            for i in range(30):
                writer.send({"user": f"u{i % 4}", "ts": T0 + i * 1000 + t}, key=f"u{i % 4}")
            writer.send_end_of_stream()
            writer.flush()
    finally:
        for writer in writers:
            writer.close()
    before, _ = described(bootstrap_servers, group)
    assert before == {}, "no group before the read"
    run_to_the_end(spark, options(topic, bootstrap_servers, groupId=group), "user string, ts long")
    rows, text = described(bootstrap_servers, group)
    assert set(rows) == {(topic, 0), (topic, 1)}, text
    assert all(current == end and lag == 0 and end > 0 for current, end, lag in rows.values()), text
    members = consumer_groups(bootstrap_servers, "--describe", "--group", group, "--members")
    assert "CONSUMER-ID" in members and not any(line.startswith(group) for line in members.splitlines()), (
        f"the group has no member: nothing reads from it\n{members}")


def test_a_plain_topics_read_commits_its_offsets_to_the_group(
        spark: SparkSession, bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic, group = new_topic(3), f"lag-{new_topic(1)}"
    producer = Producer({"bootstrap.servers": bootstrap_servers})
    for i in range(90):
        producer.produce(topic, json.dumps({"user": f"u{i % 5}", "n": i}).encode(), key=f"u{i % 5}".encode())
    producer.flush(30)
    opts = {"subscribe": topic, "envelope": "none", "kafka.bootstrap.servers": bootstrap_servers,
            "availableNowEnds": "true", "groupId": group}
    run_to_the_end(spark, opts, "user string, n long")
    rows, text = described(bootstrap_servers, group)
    assert set(rows) == {(topic, p) for p in range(3)}, text
    assert sum(end for _, end, _ in rows.values()) == 90, text
    assert all(current == end and lag == 0 for current, end, lag in rows.values()), text
