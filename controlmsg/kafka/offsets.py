"""Where a read starts, in kcat's words (``-o``), made absolute offsets per partition.

``beginning``, ``end``, ``N`` (the absolute offset N), ``-N`` (N offsets before the end) and
``s@TIMESTAMP_MS`` (the first record whose timestamp is at or after it; the end when there is none), as
``kcat -o`` means them. Offsets are looked up once, at the start, read committed (the end is the last
stable offset, what a controlmsg reader can read up to), so a checkpoint saved afterwards holds
absolute offsets only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from controlmsg.errors import ConfigError, TopicError

__all__ = ["StartAt", "StartKind", "parse_start", "resolve_start"]


class StartKind(Enum):
    """The kinds of ``-o`` value."""

    BEGINNING = "beginning"
    END = "end"
    OFFSET = "offset"
    FROM_END = "from_end"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class StartAt:
    """A parsed ``-o`` value: its kind and number (the offset, the count back from the end, or the
    timestamp in ms; 0 for ``beginning`` and ``end``)."""

    kind: StartKind
    value: int = 0


_SPEC: Final = re.compile(r"(?:(?P<offset>\d+)|-(?P<back>\d+)|s@(?P<ts>\d+))")


def parse_start(text: str) -> StartAt:
    """``text`` (kcat's ``-o`` value) as a :class:`StartAt`. Raises :class:`ConfigError` naming the values
    it takes."""
    word = text.strip().lower()
    if word == "beginning":
        return StartAt(StartKind.BEGINNING)
    if word == "end":
        return StartAt(StartKind.END)
    match = _SPEC.fullmatch(word)
    if match is None:
        raise ConfigError(f"-o {text!r}: expected beginning, end, an offset N, -N (N before the end) or "
                          "s@TIMESTAMP_MS (as kcat takes them)")
    if match["offset"] is not None:
        return StartAt(StartKind.OFFSET, int(match["offset"]))
    if match["back"] is not None:
        return StartAt(StartKind.FROM_END, int(match["back"]))
    return StartAt(StartKind.TIMESTAMP, int(match["ts"]))


def resolve_start(config: Mapping[str, Any], topic: str, partitions: Sequence[int], start: StartAt,
                  timeout: float = 10.0) -> dict[int, int]:
    """The absolute offset to start each of ``partitions`` of ``topic`` at: ``N`` as it is (as in kcat; past
    the end, the reader waits for it), ``-N`` at least the log start, a timestamp with no record at or
    after it the end. Blocks for one watermark request per partition (and one offsets-for-times request).
    Raises :class:`TopicError` when Kafka does not answer within ``timeout`` s."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from controlmsg.kafka.settings import for_client

    if start.kind is StartKind.OFFSET:
        return dict.fromkeys(partitions, start.value)
    consumer = Consumer({**for_client(config, "consumer"), "group.id": "controlmsg-start-offsets",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout, False) for p in partitions}
        if start.kind is StartKind.BEGINNING:
            return {p: low for p, (low, _) in marks.items()}
        if start.kind is StartKind.END:
            return {p: high for p, (_, high) in marks.items()}
        if start.kind is StartKind.FROM_END:
            return {p: max(low, high - start.value) for p, (low, high) in marks.items()}
        found = consumer.offsets_for_times([TopicPartition(topic, p, start.value) for p in partitions], timeout)
        return {tp.partition: tp.offset if tp.offset >= 0 else marks[tp.partition][1] for tp in found}
    except KafkaException as exc:
        raise TopicError(f"cannot look up where to start reading topic {topic!r} (-o): {exc.args[0]}") from exc
    finally:
        consumer.close()
