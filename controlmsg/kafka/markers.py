"""Commit markers: what a transactional writer commits with its records so that a retry knows it is done.

A marker is a consumer-group offset with JSON metadata, committed **inside** the writer's transaction
(``send_offsets_to_transaction``), for a group named after the writer's transactional id under the prefix
that lag tools leave out (:func:`~controlmsg.core.naming.marker_group`: ``controlmsg.marker.<topic>-<task>``),
on partition 0 of the topic written. It becomes visible exactly when the records do. A new attempt first initialises
transactions (which fences older attempts and finishes their transactions), then reads the marker: if
it is there, an earlier attempt committed and this one must not write again.

Markers live in one empty consumer group per writer, which Kafka drops after
``offsets.retention.minutes`` (7 days by default). With ACLs, a writer needs Write on its transactional
id and Read on its marker group (a prefixed ACL on ``controlmsg.marker.`` covers them all).

**Markers written before 2026-11-28** are in a group named the transactional id itself. A writer that finds
no marker in its group looks there too, so a run started by an earlier version goes on exactly once; its
next marker goes to the new group. That second lookup is what a task without a marker (its first attempt)
pays for it: docs/PERFORMANCE.md has the figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from controlmsg.core.codec import encode_control
from controlmsg.core.messages import ControlMessage
from controlmsg.core.naming import marker_group
from controlmsg.errors import DeliveryError
from controlmsg.kafka.aborts import abort_or_fence
from controlmsg.kafka.refusals import check_client, denied
from controlmsg.kafka.retry import init_transactions, is_retriable, retrying_transaction
from controlmsg.kafka.settings import for_client
from controlmsg.kafka.writer import HEADER_RUN, HEADER_TASK, produce_waiting

__all__ = ["MarkerStore", "Round", "TransactionalProducer", "write_control_round"]


class TransactionalProducer(Protocol):
    """A producer with an open transaction: confluent-kafka's ``Producer`` or a ``ControlWriter``."""

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group_metadata: Any,
                                    timeout: float) -> None: ...


class MarkerStore:
    """The marker of the writer whose transactional id is ``transactional_id``, for ``topic``.

    ``config``: the writer's client settings (only those that reach the cluster are used). Opening
    creates a consumer (it joins no group; it only reads and commits the group's offset). Use as a
    context manager or call :meth:`close`.
    """

    def __init__(self, config: Mapping[str, Any], transactional_id: str, topic: str, timeout: float = 30.0, *,
                 legacy_lookup: bool = True) -> None:
        self.group = marker_group(transactional_id)
        self.legacy_group: str | None = transactional_id if legacy_lookup else None
        """Where a marker written before 2026-11-28 is (see the module docstring); ``None``: not looked in."""
        self.topic = topic
        self.timeout = timeout
        self._config = config
        self._conf = {**for_client(config, "consumer"), "group.id": self.group, "enable.auto.commit": False,
                      "isolation.level": "read_committed"}
        self._consumer = Consumer(self._conf)

    def load(self) -> dict[str, Any] | None:
        """The committed marker, or ``None``: the marker group's, else the legacy group's. Retries while the
        group coordinator is loading or moving (retriable errors) up to ``timeout`` s; raises
        :class:`DeliveryError` naming the topic and group, :class:`~controlmsg.errors.ClusterRefused` within
        seconds when the cluster refuses the client (the lookup asks in calls of at most 2 s, serving the
        consumer's callbacks between them)."""
        deadline = time.monotonic() + self.timeout
        found = self._committed(self._consumer, self._conf, self.group, deadline)
        if found is not None or self.legacy_group is None:
            return found
        legacy_conf = {**self._conf, "group.id": self.legacy_group}
        legacy = Consumer(legacy_conf)
        try:
            return self._committed(legacy, legacy_conf, self.legacy_group, deadline)
        finally:
            legacy.close()

    def _committed(self, consumer: Consumer, conf: Mapping[str, Any], group: str,
                   deadline: float) -> dict[str, Any] | None:
        while True:
            try:
                (tp,) = consumer.committed([TopicPartition(self.topic, 0)],
                                           timeout=max(min(2.0, deadline - time.monotonic()), 0.1))
                error = tp.error
            except KafkaException as exc:
                error = exc.args[0]
            if error is None:
                break
            consumer.poll(0)  # serves the error callback: it joins no group and is assigned nothing
            check_client(conf)
            if not is_retriable(error) or time.monotonic() >= deadline:
                raise DeliveryError(
                    denied(self._config, error, f"look up the commit marker of group {group!r} on topic "
                                                f"{self.topic!r}", repr(group))
                    or f"cannot look up the commit marker of {group!r} on topic {self.topic!r}: {error}")
            time.sleep(0.2)
        if tp.offset < 0:
            return None
        marker: dict[str, Any] = orjson.loads(tp.metadata or "{}")
        return marker

    def add(self, producer: TransactionalProducer, marker: Mapping[str, Any], position: int = 0) -> None:
        """Add ``marker`` to ``producer``'s open transaction. ``position`` is the offset recorded (any
        value >= 0; the metadata is what counts). Raises :class:`DeliveryError`."""
        tp = TopicPartition(self.topic, 0, max(position, 0), metadata=orjson.dumps(dict(marker)).decode())
        try:
            producer.send_offsets_to_transaction([tp], self._consumer.consumer_group_metadata(), self.timeout)
        except KafkaException as exc:
            raise DeliveryError(
                f"cannot add the commit marker of {self.group!r} to the transaction on topic {self.topic!r}: "
                f"{exc.args[0]}") from exc

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> MarkerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Round = tuple[Sequence[ControlMessage], Mapping[str, Any]]
"""The control messages to write, and the marker to commit with them."""


def write_control_round(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    plan: Callable[[dict[str, Any] | None], Round | None],
    *,
    transactional_id: str,
    timeout: float = 60.0,
) -> dict[str, Any] | None:
    """Write a round of control messages, each to every partition of ``topic``, and commit them in ONE
    transaction with their marker (in the group ``transactional_id``): all or nothing, exactly once.

    The transaction is initialised first (fencing an older writer with the same id, finishing its
    transaction), then the committed marker is read and ``plan(committed)`` decides from it: the messages
    and the new marker, or ``None`` to write nothing (a round already done); it may raise to refuse.
    Returns the committed marker when nothing was written, else ``None``. Raises :class:`DeliveryError`.
    Used by the driver of a Spark write, which writes control messages on behalf of its tasks (see
    :mod:`controlmsg.spark.writing`).
    """
    conf = {**for_client(config, "producer"), "transactional.id": transactional_id}
    producer = Producer(conf)
    with MarkerStore(config, transactional_id, topic, timeout) as store:
        try:
            init_transactions(producer, conf, timeout=timeout)
        except KafkaException as exc:
            raise DeliveryError(
                denied(conf, exc.args[0], f"start transactions on topic {topic!r} as transactional id "
                                          f"{transactional_id!r}", repr(transactional_id))
                or f"cannot start transactions on topic {topic!r}: {exc.args[0]}") from exc
        committed = store.load()
        decided = plan(committed)
        if decided is None:
            return committed
        messages, marker = decided
        try:
            producer.begin_transaction()
            for message in messages:
                value = encode_control(message)
                headers: list[tuple[str, str | bytes | None]] = [
                    (HEADER_TASK, message.task_name.encode()), (HEADER_RUN, message.run_id.encode())]
                for p in range(partitions):
                    produce_waiting(producer, topic, value, None, p, headers)
            store.add(producer, marker)
            retrying_transaction(producer.commit_transaction, timeout=timeout, what="commit_transaction")
        except (KafkaException, DeliveryError) as exc:
            # Abort now: an open transaction would hold read_committed readers back until it timed out
            # (transactionTimeoutMs, 600 s for the Spark writes). A failed abort fences the id or is logged.
            abort_or_fence(producer, conf, topic, timeout=10.0)
            if isinstance(exc, DeliveryError):
                raise
            raise DeliveryError(f"cannot commit control messages to topic {topic!r}: {exc.args[0]}") from exc
    return None
