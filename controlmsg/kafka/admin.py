"""Topic administration on confluent-kafka: create, describe, wait for a topic to exist."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from controlmsg.errors import TopicError

__all__ = ["connection_settings", "create_topic", "partition_count", "wait_for_topic"]

_CONNECTION_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "client.", "socket.", "broker.")


def connection_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a producer's or consumer's ``config`` that any client needs to reach the same
    cluster (bootstrap, security, socket); the rest would only draw warnings from other client kinds."""
    return {k: v for k, v in config.items() if k.startswith(_CONNECTION_PREFIXES)}


def _admin(config: Mapping[str, Any]) -> AdminClient:
    return AdminClient(connection_settings(config))


def create_topic(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    *,
    replication_factor: int = 1,
    exist_ok: bool = True,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until its metadata is visible.

    Blocks up to ``timeout`` seconds. With ``exist_ok`` an existing topic is accepted only if it has the
    same number of partitions; otherwise raises :class:`TopicError`.
    """
    admin = _admin(config)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(topic_config or {}))
    future = admin.create_topics([new], operation_timeout=timeout)[topic]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if not (exist_ok and err.code() == err.TOPIC_ALREADY_EXISTS):
            raise TopicError(f"cannot create topic {topic!r}: {err.str()}") from exc
    have = wait_for_topic(config, topic, timeout=timeout)
    if have != partitions:
        raise TopicError(f"topic {topic!r} exists with {have} partitions, not {partitions}")


def partition_count(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> int | None:
    """The number of partitions of ``topic``, or ``None`` if it does not exist. Blocks up to ``timeout``."""
    try:
        meta = _admin(config).list_topics(topic=topic, timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot describe topic {topic!r}: {exc.args[0]}") from exc
    tmeta = meta.topics.get(topic)
    if tmeta is None or tmeta.error is not None or not tmeta.partitions:
        return None
    return len(tmeta.partitions)


def wait_for_topic(config: Mapping[str, Any], topic: str, timeout: float = 30.0) -> int:
    """Block until ``topic`` exists; return its partition count. Raises :class:`TopicError` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        count = partition_count(config, topic, timeout=max(1.0, min(remaining, 5.0)))
        if count is not None:
            return count
        if remaining <= 0:
            raise TopicError(f"topic {topic!r} does not exist (waited {timeout:g} s)")
        time.sleep(min(0.2, max(remaining, 0.0)))
