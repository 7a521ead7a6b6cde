"""Read a topic's control messages without committing anything, and report what each partition knows.

Unlike :class:`~controlmsg.kafka.reader.ControlReader`, inspection is diagnostic: it keeps one
:class:`~controlmsg.core.bookkeeping.InputTracker` per run found in the topic (so an old run never hides a
new one), records protocol errors instead of stopping at the first, and reads only up to the end offsets
the topic had when inspection started.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.codec import decode
from controlmsg.core.events import PartitionStatus
from controlmsg.errors import Location, ProtocolError, ReadError
from controlmsg.kafka.admin import wait_for_topic, watermark_offsets
from controlmsg.kafka.fetching import EOF_FETCH_WAIT_MS, consume_ready
from controlmsg.kafka.settings import for_client

__all__ = ["RunReport", "TopicReport", "inspect_topic"]


@dataclass
class RunReport:
    """What one run's control messages say, per partition."""

    run_id: str
    tracker: InputTracker
    last_seen: int = 0  # order of the last control message of this run, to find the newest run

    @property
    def partitions(self) -> list[PartitionStatus]:
        return self.tracker.statuses()


@dataclass
class TopicReport:
    topic: str
    end_offsets: dict[int, int]
    user_messages: dict[int, int]
    runs: dict[str, RunReport] = field(default_factory=dict)
    errors: list[ProtocolError] = field(default_factory=list)

    @property
    def newest_run(self) -> RunReport | None:
        return max(self.runs.values(), key=lambda r: r.last_seen, default=None)


def inspect_topic(
    config: Mapping[str, Any], topic: str, run_id: str | None = None, timeout: float = 30.0
) -> TopicReport:
    """Read ``topic`` from the beginning up to its current end offsets and return the report.

    Only runs whose id equals ``run_id`` are kept when it is given. Blocks until done or ``timeout``
    seconds passed (then raises :class:`~controlmsg.errors.ReadError`). Commits nothing.
    """
    count = wait_for_topic(config, topic, timeout)
    consumer = Consumer(
        {
            "group.id": f"controlmsg-inspect-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": EOF_FETCH_WAIT_MS,
            **for_client(config, "consumer"),
            # The last offsets of a transactional topic are commit markers, which are never delivered: the
            # end of a partition is known from the partition-EOF event, whose offset is past them.
            "enable.partition.eof": True,
        }
    )
    try:
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for p in range(count):
            low, high = watermark_offsets(consumer, topic, p, timeout)
            ends[p] = high
            if high > low:
                starts.append(TopicPartition(topic, p, low))
        report = TopicReport(topic, ends, {p: 0 for p in range(count)})
        consumer.assign(starts)
        pending = {tp.partition for tp in starts}
        deadline = time.monotonic() + timeout
        seen = 0
        while pending:
            if time.monotonic() > deadline:
                raise ReadError(
                    f"inspecting topic {topic!r}: partitions {sorted(pending)} not read within {timeout:g} s"
                )
            for msg in consume_ready(consumer, 1000, 0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[msg.partition()]:
                        pending.discard(msg.partition())
                    continue
                p = cast(int, msg.partition())
                off = cast(int, msg.offset())
                if off + 1 >= ends[p]:
                    pending.discard(p)
                if off >= ends[p]:
                    continue
                try:
                    decoded = decode(msg.value())
                    if isinstance(decoded, bytes):
                        report.user_messages[p] += 1
                        continue
                    if run_id is not None and decoded.run_id != run_id:
                        continue
                    run = report.runs.get(decoded.run_id)
                    if run is None:
                        run = RunReport(decoded.run_id, InputTracker(range(count), decoded.run_id, topic))
                        report.runs[decoded.run_id] = run
                    seen += 1
                    run.last_seen = seen
                    run.tracker.on_control(p, decoded, off)
                except ProtocolError as exc:
                    report.errors.append(exc.at(Location(topic, p, off)))
        return report
    except KafkaException as exc:
        raise ReadError(f"inspecting topic {topic!r} failed: {exc.args[0]}") from exc
    finally:
        consumer.close()
