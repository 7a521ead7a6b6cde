"""Dead letters: the one format every controlmsg reader writes bad records in, and the producer that does it.

A dead letter is the bad record **as it was in the source topic**: the same value bytes (the whole
envelope, type byte included), the same key and the same headers, followed by four headers that say where
it came from and why it was set aside:

==============================  =====================================================================
``controlmsg-dlq-reason``       why the record is bad, in words (UTF-8)
``controlmsg-dlq-topic``        the topic it was read from
``controlmsg-dlq-partition``    its partition (decimal text)
``controlmsg-dlq-offset``       its offset (decimal text)
==============================  =====================================================================

:class:`~controlmsg.kafka.reader.ControlReader` (``controlmsg consume --dead-letter-topic``) writes bad
envelopes and protocol violations this way, the Spark reader (option ``deadLetterTopic``) records whose
value does not fit the DataFrame's schema. Re-reading a dead-letter topic therefore needs one decoder.

A :class:`DeadLetters` is opened only once the dead-letter topic is known to exist (never created here: a
typo would otherwise swallow bad records into a topic nobody reads), and a caller may count a record as
handled only after :meth:`DeadLetters.flush` returned: that is when the broker has acknowledged it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from confluent_kafka import KafkaException, Producer

from controlmsg.errors import DeliveryError, Location, TopicError
from controlmsg.kafka.admin import partition_count
from controlmsg.kafka.settings import for_client

__all__ = [
    "HEADER_DLQ_OFFSET",
    "HEADER_DLQ_PARTITION",
    "HEADER_DLQ_REASON",
    "HEADER_DLQ_TOPIC",
    "DeadLetters",
    "check_dead_letter_topic",
    "dead_letter_headers",
]

HEADER_DLQ_REASON: Final = "controlmsg-dlq-reason"
HEADER_DLQ_TOPIC: Final = "controlmsg-dlq-topic"
HEADER_DLQ_PARTITION: Final = "controlmsg-dlq-partition"
HEADER_DLQ_OFFSET: Final = "controlmsg-dlq-offset"

_FAILURES_KEPT: Final = 3


def dead_letter_headers(original: Sequence[tuple[str, Any]] | None, reason: str, topic: str, partition: int,
                        offset: int) -> list[tuple[str, Any]]:
    """The headers of a dead letter: the record's own (``original``, kept in order), then the four of this
    module's table."""
    return [
        *(original or ()),
        (HEADER_DLQ_REASON, reason.encode()),
        (HEADER_DLQ_TOPIC, topic.encode()),
        (HEADER_DLQ_PARTITION, str(partition).encode()),
        (HEADER_DLQ_OFFSET, str(offset).encode()),
    ]


def check_dead_letter_topic(config: Mapping[str, Any], topic: str, timeout: float = 10.0) -> None:
    """Raise :class:`~controlmsg.errors.TopicError` unless ``topic`` exists (asked without creating it).
    Blocks up to ``timeout`` seconds. Call it before reading anything, so a bad record never finds its
    dead-letter topic missing."""
    if partition_count(config, topic, timeout) is None:
        raise TopicError(f"dead-letter topic {topic!r} does not exist; create it first "
                         "(controlmsg create-topic), so that no bad record is lost")


class DeadLetters:
    """A producer of dead letters to ``topic`` (which the caller has checked exists, see
    :func:`check_dead_letter_topic`). ``config``: librdkafka settings, passed through.

    :meth:`send` queues a record and returns at once; :meth:`flush` blocks until every queued record is
    acknowledged and raises :class:`~controlmsg.errors.DeliveryError` if any was not. Not thread-safe.
    """

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.topic = topic
        self.sent = 0
        """Records queued by :meth:`send`."""
        self.delivered = 0
        """Records the broker has acknowledged (as far as delivery reports were served)."""
        self._failures: list[str] = []
        self._failed = 0
        self._producer = Producer({**for_client(config, "producer"), "on_delivery": self._on_delivery})

    def send(self, value: bytes | None, key: bytes | None, headers: Sequence[tuple[str, Any]] | None,
             reason: str, where: Location) -> None:
        """Queue the bad record read at ``where`` (topic, partition and offset all known), unchanged, with
        the dead-letter headers. Raises :class:`~controlmsg.errors.DeliveryError` when librdkafka refuses
        it (after serving delivery reports while its local queue is full)."""
        assert where.topic is not None and where.partition is not None and where.offset is not None
        full = dead_letter_headers(headers, reason, where.topic, where.partition, where.offset)
        while True:
            try:
                self._producer.produce(self.topic, value, key, headers=full)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                raise DeliveryError(f"cannot dead-letter the record at {where} to {self.topic!r}: {exc}") from exc
        self.sent += 1

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is None:
            self.delivered += 1
            return
        self._failed += 1
        if len(self._failures) < _FAILURES_KEPT:
            self._failures.append(f"partition {msg.partition()}: {err.str()}")

    def flush(self, source_topic: str, timeout: float = 30.0) -> None:
        """Block (up to ``timeout`` s) until every record sent is acknowledged. Raises
        :class:`~controlmsg.errors.DeliveryError` naming how many were not, when any failed or is still
        queued: the caller must then not count them as handled. ``source_topic`` is named in the message."""
        left = self._producer.flush(timeout)
        if left or self._failed:
            reasons = "; ".join(self._failures) or f"still queued after {timeout:g} s"
            raise DeliveryError(
                f"{left + self._failed} of {self.sent} bad record(s) of topic {source_topic!r} were not written "
                f"to dead-letter topic {self.topic!r}: {reasons}")

    def close(self, timeout: float = 30.0) -> None:
        """Serve what is still queued (up to ``timeout`` s), without raising: call :meth:`flush` first
        where the outcome matters."""
        self._producer.flush(timeout)
