"""Topic administration on confluent-kafka: create, describe, wait for a topic to exist."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from controlmsg.errors import TopicError
from controlmsg.kafka.refusals import ConnectionWatch, denied, mark_reached
from controlmsg.kafka.retry import retrying
from controlmsg.kafka.settings import for_client

__all__ = [
    "LatestOffsets", "TopicSettings", "add_topic_options", "cluster_metadata", "create_topic", "end_offsets",
    "partition_count", "topic_settings_from_args",
    "wait_for_topic", "watermark_offsets",
]


# What librdkafka says when no broker answered at all: a wrong address, or the wrong security protocol.
_NO_ANSWER = frozenset({KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


T = TypeVar("T")


class _Admin(AdminClient):
    """An AdminClient that keeps its :class:`~controlmsg.kafka.refusals.ConnectionWatch`."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.watch: ConnectionWatch | None = conf.get("error_cb") if isinstance(conf.get("error_cb"),
                                                                                ConnectionWatch) else None


def _admin(config: Mapping[str, Any]) -> AdminClient:
    return _Admin(for_client(config, "admin"))


def _result(admin: AdminClient, future: Future[T], timeout: float) -> T:
    """``future.result(timeout)`` of a request of ``admin``, serving the client's callbacks meanwhile, so
    that a cluster that refuses the client raises :class:`~controlmsg.errors.ClusterRefused` within a
    second of librdkafka saying so (:mod:`controlmsg.kafka.refusals`) instead of at the timeout."""
    deadline = time.monotonic() + timeout
    watch = admin.watch if isinstance(admin, _Admin) else None
    while True:
        try:
            return future.result(timeout=min(0.2, max(deadline - time.monotonic(), 0.0)))
        except FutureTimeout:
            if time.monotonic() >= deadline:
                raise
        admin.poll(0)
        if watch is not None:
            watch.check()


class _AdminSession:
    """An admin client for a series of requests, replaced by a new one after a try that failed.

    A client keeps the node its first metadata named as controller (on KRaft, any live broker) and sends
    CreateTopics and DescribeTopics there. When that node dies, the client waits for it ("Failed while
    waiting for controller: Local: Timed out") until its metadata is next refreshed, which can take up
    to five minutes by default; until then, asking again with the same client fails the same way. A new
    client bootstraps from the nodes still up and learns a live one.
    """

    def __init__(self, config: Mapping[str, Any], client: AdminClient | None = None) -> None:
        self.config = config
        self.client = client if client is not None else _admin(config)

    def retrying(self, call: Callable[[AdminClient], T], *, timeout: float) -> T:
        """``call(client)`` under :func:`~controlmsg.kafka.retry.retrying`, each try after the first with
        a new client. The client is kept alive until its result is in: a collected client cancels its
        requests."""
        tries = 0

        def attempt() -> T:
            nonlocal tries
            if tries:
                self.client = _admin(self.config)
            tries += 1
            return call(self.client)

        result = retrying(attempt, timeout=timeout)
        mark_reached(self.config)
        return result


def _failure(config: Mapping[str, Any], operation: str, topic: str, error: KafkaError, detail: object) -> str:
    """One line on why ``operation`` on ``topic`` failed: refused, who asked (``sasl.username``); no
    answer, where and how it asked. ``detail``: what to quote of the error otherwise."""
    refused = denied(config, error, f"{operation} topic {topic!r}", repr(topic))
    if refused is not None:
        return refused
    if error.code() in _NO_ANSWER:
        protocol = config.get("security.protocol", "plaintext")
        return (f"cannot {operation} topic {topic!r}: {error.str()} (no answer from "
                f"{config.get('bootstrap.servers')} with security.protocol {protocol}: check both)")
    return f"cannot {operation} topic {topic!r}: {detail}"


@dataclass(frozen=True)
class TopicSettings:
    """How the topics a command creates are made: ``replication_factor`` -1 is the cluster's default."""

    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)

    def as_args(self) -> list[str]:
        """The same settings as command-line options (for a child job)."""
        out = [] if self.replication_factor == -1 else ["--replication-factor", str(self.replication_factor)]
        for key, value in self.config.items():
            out += ["--topic-config", f"{key}={value}"]
        return out

    def as_options(self) -> dict[str, str]:
        """The same settings as ``format("controlmsg")`` writer options."""
        out = {f"topicConfig.{k}": v for k, v in self.config.items()}
        if self.replication_factor != -1:
            out["replicationFactor"] = str(self.replication_factor)
        return out


def add_topic_options(parser: argparse.ArgumentParser) -> None:
    """``--replication-factor N`` and ``--topic-config KEY=VALUE`` (repeatable), for the topics a command
    creates; read them back with :func:`topic_settings_from_args`."""
    parser.add_argument("--replication-factor", type=int, default=-1, metavar="N",
                        help="replicas of each topic this creates (default: the cluster's default.replication.factor)")
    parser.add_argument("--topic-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a config of each topic this creates, e.g. min.insync.replicas=2 (repeatable)")


def topic_settings_from_args(args: argparse.Namespace) -> TopicSettings:
    """The :class:`TopicSettings` of :func:`add_topic_options`'s options. Raises ``ValueError`` naming a
    ``--topic-config`` without ``=`` or a replication factor below 1 (other than the default -1)."""
    factor = int(getattr(args, "replication_factor", -1))
    if factor != -1 and factor < 1:
        raise ValueError(f"--replication-factor must be at least 1, got {factor}")
    config: dict[str, str] = {}
    for setting in getattr(args, "topic_config", []) or []:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--topic-config {setting!r}: expected KEY=VALUE")
        config[key.strip()] = value.strip()
    return TopicSettings(factor, config)


def create_topic(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    *,
    replication_factor: int = -1,
    exist_ok: bool = True,
    topic_config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Create ``topic`` with ``partitions`` partitions and wait until its metadata is visible.

    ``replication_factor`` -1 (the default) takes the cluster's ``default.replication.factor`` (1 on the
    local single broker, 3 on the local three-node cluster); ``topic_config`` sets topic configs such as
    ``min.insync.replicas``.

    Blocks up to ``timeout`` seconds. With ``exist_ok`` an existing topic is accepted only if it has the
    same number of partitions; otherwise raises :class:`TopicError`.
    """
    session = _AdminSession(config)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(topic_config or {}))

    def create(admin: AdminClient) -> None:  # each try waits up to 10 s, so a stuck one leaves time to retry
        _result(admin, admin.create_topics([new], operation_timeout=min(timeout, 8.0),
                                           request_timeout=min(timeout, 10.0))[topic], timeout)

    try:
        session.retrying(create, timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if not (exist_ok and err.code() == err.TOPIC_ALREADY_EXISTS):
            raise TopicError(_failure(config, "create", topic, err, err.str())) from exc
    have = _wait_for_topic(session, topic, timeout)
    if have != partitions:
        raise TopicError(f"topic {topic!r} exists with {have} partitions, not {partitions}")


def cluster_metadata(config: Mapping[str, Any], timeout: float = 10.0) -> Any:
    """The cluster's metadata (confluent-kafka's ``ClusterMetadata``: brokers, controller, every topic's
    partitions with leader, replicas and in-sync replicas), as ``kcat -L`` shows it. One Metadata request
    for all topics, never one that names a topic (a broker with ``auto.create.topics.enable`` would create
    it). Retries what a restarting broker answers for up to ``timeout`` s; raises :class:`TopicError`."""
    def ask(admin: AdminClient) -> Any:
        return admin.list_topics(timeout=min(timeout, 10.0))

    try:
        return _AdminSession(config).retrying(ask, timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot read the cluster's metadata: {exc.args[0]}") from exc


def partition_count(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> int | None:
    """The number of partitions of ``topic``, or ``None`` if it does not exist. Blocks up to ``timeout``.

    Asks with DescribeTopics, which never creates a topic: a metadata request for one topic would make a
    broker with ``auto.create.topics.enable=true`` (Kafka's default) create it with its default partition
    count, so a reader planned before its upstream job would make a wrong topic.
    """
    return _describe(_AdminSession(config), topic, timeout)


def _describe(session: _AdminSession, topic: str, timeout: float) -> int | None:
    """Retries what a restarting or paused broker answers (see :mod:`controlmsg.kafka.retry`) for up to
    ``timeout`` s, each request waiting up to 10 s, each retry with a new client (see
    :class:`_AdminSession`). ``None``: the topic does not exist."""
    def describe(admin: AdminClient) -> int | None:
        future = admin.describe_topics(TopicCollection([topic]), request_timeout=min(timeout, 10.0))[topic]
        try:
            return len(_result(admin, future, timeout + 5.0).partitions)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise

    try:
        return session.retrying(describe, timeout=timeout)
    except KafkaException as exc:
        raise TopicError(_failure(session.config, "describe", topic, exc.args[0], exc.args[0])) from exc


def wait_for_topic(config: Mapping[str, Any], topic: str, timeout: float | None = 30.0) -> int:
    """Block until ``topic`` exists (forever if ``timeout`` is ``None``); return its partition count.
    Never creates it. Raises :class:`TopicError` on timeout or when it cannot be described."""
    return _wait_for_topic(_AdminSession(config), topic, timeout)


def _wait_for_topic(session: _AdminSession, topic: str, timeout: float | None) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = 30.0 if deadline is None else max(deadline - time.monotonic(), 10.0)
        count = _describe(session, topic, left)
        if count is not None:
            return count
        if deadline is not None and time.monotonic() >= deadline:
            raise TopicError(f"topic {topic!r} does not exist (waited {timeout:g} s)")
        time.sleep(0.2)


_NOT_KNOWN_YET: Final = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                                   KafkaError._UNKNOWN_TOPIC})
"""What a broker ("unknown topic or partition") or the client's own metadata ("Local: Unknown
partition") says of a topic created a moment ago."""


def watermark_offsets(consumer: Consumer, topic: str, partition: int, timeout: float = 10.0) -> tuple[int, int]:
    """``consumer.get_watermark_offsets`` of a partition of a topic that exists, asked again for up to
    ``timeout`` s while the answer is retriable (:mod:`controlmsg.kafka.retry`) or "unknown topic or
    partition" (from the broker or the client's own metadata): a topic just created is described by the
    controller before every leader, and the client, know its partitions. Raises :class:`TopicError`
    naming the partition."""
    from confluent_kafka import TopicPartition

    def ask() -> tuple[int, int]:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() in _NOT_KNOWN_YET:
                raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, error.str())) from exc
            raise

    try:
        return retrying(ask, timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0]
        raise TopicError(f"cannot get the offsets of topic {topic!r} partition {partition}: "
                         f"{error.str() if isinstance(error, KafkaError) else exc}") from exc


def offset_spans(config: Mapping[str, Any], topic: str, partitions: int, timeout: float = 10.0) -> dict[int, int]:
    """How many offsets each of the ``partitions`` of ``topic`` holds now (end minus log start, read
    committed): what a read from the beginning goes through (records, control messages, transaction
    markers). Two ListOffsets requests per broker, not one per partition. Raises :class:`TopicError`."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    tps = [TopicPartition(topic, p) for p in range(partitions)]

    def ask(client: AdminClient) -> dict[int, int]:
        found: dict[str, dict[int, int]] = {}
        specs = (("start", OffsetSpec.earliest()), ("end", OffsetSpec.latest()))  # type: ignore[no-untyped-call]
        for name, spec in specs:
            futures = client.list_offsets({tp: spec for tp in tps}, request_timeout=timeout,
                                          isolation_level=IsolationLevel.READ_COMMITTED)
            found[name] = {tp.partition: int(f.result(timeout).offset) for tp, f in futures.items()}
        return {p: max(found["end"][p] - found["start"][p], 0) for p in range(partitions)}

    try:
        return _AdminSession(config).retrying(ask, timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot list the offsets of topic {topic!r}: {exc.args[0]}") from exc


class LatestOffsets:
    """The end offsets (last stable offsets: read committed) of a topic's partitions, asked again at each
    call with one ListOffsets request per broker, not one per partition; the admin client is kept between
    calls (a stream reader asks at every trigger). Raises :class:`TopicError`."""

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.topic = topic
        self._session = _AdminSession(config)

    def __call__(self, partitions: Iterable[int], timeout: float = 10.0) -> dict[int, int]:
        from confluent_kafka import IsolationLevel, TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        tps = [TopicPartition(self.topic, p) for p in partitions]
        if not tps:
            return {}
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]

        def ask(client: AdminClient) -> dict[int, int]:
            futures = client.list_offsets({tp: latest for tp in tps}, request_timeout=timeout,
                                          isolation_level=IsolationLevel.READ_COMMITTED)
            return {tp.partition: int(_result(client, f, timeout).offset) for tp, f in futures.items()}

        try:
            return self._session.retrying(ask, timeout=timeout)
        except KafkaException as exc:
            raise TopicError(f"cannot list the end offsets of topic {self.topic!r}: {exc.args[0]}") from exc


def end_offsets(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> dict[int, int]:
    """The current end offset (high watermark) of every partition of ``topic``. Raises
    :class:`TopicError` when the topic does not exist after ``timeout`` s, or when a partition's end
    cannot be had within ``timeout`` s (naming the partition; see :func:`watermark_offsets`).

    A topic that does not exist yet is asked for again until ``timeout``: on a cluster of several
    nodes, the node asked right after :func:`create_topic` returned may not know the topic yet (CI saw
    "does not exist" for a stop-channel topic just created on the three-node cluster)."""
    from confluent_kafka import Consumer

    count = _wait_for_topic(_AdminSession(config), topic, timeout)
    consumer = Consumer({**for_client(config, "consumer"), "group.id": "controlmsg-end-offsets",
                         "enable.auto.commit": False})
    try:
        return {p: watermark_offsets(consumer, topic, p, timeout)[1] for p in range(count)}
    finally:
        consumer.close()
