"""Read a whole topic with a plain consumer (no bookkeeping), for assertions about what is on the wire."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from controlmsg.core.codec import decode, decode_json_payload, split_run
from controlmsg.core.messages import EndOfStreamMessage, MessageType, WatermarkMessage
from controlmsg.kafka import partition_count
from controlmsg.kafka.writer import HEADER_RUN, HEADER_TASK


@dataclass(frozen=True)
class WireRecord:
    partition: int
    offset: int
    kind: str  # "data", "watermark", "eos"
    task: str | None  # the writing task: from the header (data) or the control message
    value: Any  # decoded JSON (data) or the control message
    headers: tuple[tuple[str, bytes | None], ...] = ()  # the record's headers, in order
    run: str | None = None  # a data record's run: from its envelope (wire format 2) or its header, if it says


def dump_topic(config: dict[str, Any], topic: str, isolation: str = "read_committed") -> list[WireRecord]:
    """Every record of ``topic`` (all partitions, from the beginning to the current end)."""
    count = partition_count(config, topic)
    assert count is not None, topic
    consumer = Consumer({**config, "group.id": f"dump-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(count)])
    done: set[int] = set()
    out: list[WireRecord] = []
    deadline = time.monotonic() + 60
    try:
        while len(done) < count:
            assert time.monotonic() < deadline, f"{topic}: partitions {done} of {count} read to the end in 60 s"
            # consume() waits for a full batch or the timeout, so keep the timeout short.
            msgs: list[Any] = consumer.consume(1000, 0.1)  # records read have int partitions/offsets
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    done.add(msg.partition())
                    continue
                decoded = decode(msg.value())
                if isinstance(decoded, bytes):
                    headers = dict(msg.headers() or [])
                    task = headers[HEADER_TASK].decode() if HEADER_TASK in headers else None
                    run = (split_run(msg.value())[0] if msg.value()[0] == MessageType.USER_MESSAGE_OF_RUN
                           else headers.get(HEADER_RUN))
                    out.append(WireRecord(msg.partition(), msg.offset(), "data", task, decode_json_payload(decoded),
                                          tuple(msg.headers() or ()), None if run is None else run.decode()))
                elif isinstance(decoded, WatermarkMessage):
                    out.append(WireRecord(msg.partition(), msg.offset(), "watermark", decoded.task_name, decoded))
                else:
                    assert isinstance(decoded, EndOfStreamMessage)
                    out.append(WireRecord(msg.partition(), msg.offset(), "eos", decoded.task_name, decoded))
    finally:
        consumer.close()
    return out


def count_by(records: list[WireRecord], kind: str) -> Counter[tuple[int, str | None]]:
    """How many records of ``kind`` each (partition, task) has."""
    return Counter((r.partition, r.task) for r in records if r.kind == kind)
