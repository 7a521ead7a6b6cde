"""What the transactions on a topic left behind, as a ``read_committed`` reader sees it (shared by the tests
of aborts, fencing and stops)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition


def held_back(config: dict[str, Any], topic: str, partitions: int,
              timeout: float = 30.0) -> tuple[dict[int, tuple[int, int]], list[Any]]:
    """Per partition whose last stable offset (where a ``read_committed`` reader meets its end) is behind the
    high watermark, i.e. a transaction is still open there: ``(last stable, high)``; and every committed
    record of the topic. Fails when a partition's end is not reached within ``timeout``."""
    consumer = Consumer({**config, "group.id": f"held-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    stable: dict[int, int] = {}
    records: list[Any] = []
    # The high watermark as read_uncommitted sees it: a read_committed consumer's offset query answers the
    # last stable offset instead, which would hide the open transaction looked for.
    uncommitted = Consumer({**config, "group.id": f"high-{uuid.uuid4().hex}", "isolation.level": "read_uncommitted"})
    try:
        highs = {p: uncommitted.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                 for p in range(partitions)}
    finally:
        uncommitted.close()
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(stable) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                err = msg.error()
                if err is None:
                    records.append(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    partition, offset = msg.partition(), msg.offset()
                    assert partition is not None and offset is not None
                    stable[partition] = offset
                else:
                    raise AssertionError(f"{topic}: {err}")
    finally:
        consumer.close()
    assert len(stable) == partitions, f"{topic}: the end was not reached on every partition ({stable})"
    return {p: (stable[p], highs[p]) for p in range(partitions) if stable[p] < highs[p]}, records
