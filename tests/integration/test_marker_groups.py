"""Commit markers as lag tools see them: Kafka's own ``kafka-consumer-groups --list`` (run from Kafka's jars,
:mod:`controlmsg.clusters.kafka_tools`) shows every marker group under ``controlmsg.marker.``, the one
pattern docs/OPERATIONS.md gives Burrow and the lag exporters to leave out, and a real consumer's group
outside it. A marker an earlier version left in a group named the transactional id is still found, and the
next one goes to the new group."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from controlmsg.clusters.kafka_tools import consumer_groups
from controlmsg.core.messages import WatermarkMessage
from controlmsg.core.naming import marker_group, task_name, transactional_id
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round

pytestmark = pytest.mark.kafka

EXCLUDED = re.compile(r"^controlmsg\.marker\.")  # docs/OPERATIONS.md's pattern, as a lag tool applies it


def test_lag_tools_can_leave_out_every_marker_group_and_nothing_else(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    txns = [transactional_id(topic, task_name("job", "r1", i)) for i in range(3)]
    for i, txn in enumerate(txns):
        def plan(committed: dict[str, Any] | None, i: int = i) -> Round | None:
            return [WatermarkMessage(task_name("job", "r1", i), 3, 1_000, "r1")], {"batch": 0}
        write_control_round(kafka_config, topic, 2, plan, transactional_id=txn)
    consumer = Consumer({**kafka_config, "group.id": f"reader-of-{topic}", "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)  # a real consumer's progress
    consumer.close()

    listed = set(consumer_groups(bootstrap_servers, "--list").split())
    ours = {g for g in listed if topic in g}
    assert {g for g in ours if EXCLUDED.match(g)} == {marker_group(t) for t in txns}, ours
    assert {g for g in ours if not EXCLUDED.match(g)} == {f"reader-of-{topic}"}, ours
    assert not set(txns) & listed, "no marker group is named the transactional id any more"


def test_a_marker_an_earlier_version_left_is_found_and_the_next_goes_to_the_marker_group(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    txn = transactional_id(topic, task_name("job", "r1", 0))
    legacy = Consumer({**kafka_config, "group.id": txn, "enable.auto.commit": False})  # where it was before
    legacy.commit(offsets=[TopicPartition(topic, 0, 0, metadata=orjson.dumps({"batch": 4}).decode())],
                  asynchronous=False)
    legacy.close()
    with MarkerStore(kafka_config, txn, topic) as store:
        assert store.load() == {"batch": 4}

    def plan(committed: dict[str, Any] | None) -> Round | None:
        assert committed == {"batch": 4}, "the round is planned from the earlier version's marker"
        return [WatermarkMessage(task_name("job", "r1", 0), 1, 5_000, "r1")], {"batch": 5}

    write_control_round(kafka_config, topic, 2, plan, transactional_id=txn)
    with MarkerStore(kafka_config, txn, topic) as store:
        assert store.load() == {"batch": 5}
    assert marker_group(txn) in consumer_groups(bootstrap_servers, "--list").split()
