"""Topic lookups for the Spark side that never create a topic.

controlmsg's ``partition_count``/``wait_for_topic`` ask with a metadata request for the one topic, and
a broker with ``auto.create.topics.enable=true`` (Kafka's default) answers that by creating the topic
with its default partition count. A reader planned before its upstream job, or a writer pointed at a
topic that does not exist yet, would then make a wrong topic. DescribeTopics never creates one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from controlmsg.errors import TopicError
from controlmsg.kafka.admin import connection_settings

__all__ = ["wait_for_topic_no_create"]


def wait_for_topic_no_create(config: Mapping[str, Any], topic: str, timeout: float | None) -> int:
    """Block until ``topic`` exists (forever if ``timeout`` is ``None``); return its partition count.

    Asks with DescribeTopics, which never creates the topic (see the module docstring). Raises
    :class:`~controlmsg.errors.TopicError` on timeout or when the topic cannot be described.
    """
    admin = AdminClient(connection_settings(config))
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        future = admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic]
        try:
            return len(future.result().partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicError(f"cannot describe topic {topic!r}: {exc.args[0]}") from exc
        if deadline is not None and time.monotonic() >= deadline:
            raise TopicError(f"topic {topic!r} does not exist (waited {timeout:g} s)")
        time.sleep(0.2)
