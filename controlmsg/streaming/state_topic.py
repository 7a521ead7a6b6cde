"""A window task's state in its compacted Kafka topic: the topic's settings, one commit's state added to the
task's open transaction, and the task's state read back as its latest commit left it. The records and the
fold that rebuilds the state from them are :mod:`controlmsg.streaming.window_state` (pure); the task that
commits and restores with these is :mod:`controlmsg.streaming.window`.

The state records of task ``i`` go to partition ``i mod N`` of the state topic (``N`` its partition
count), so a restarting task reads one partition only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from controlmsg.errors import ReadError
from controlmsg.kafka.admin import wait_for_topic, watermark_offsets
from controlmsg.kafka.fetching import EOF_FETCH_WAIT_MS, consume_ready
from controlmsg.kafka.retry import ConsumerErrors
from controlmsg.kafka.settings import for_client
from controlmsg.kafka.writer import ControlWriter
from controlmsg.streaming.window_state import STATE_FORMAT, TaskStateLog, commit_records, header_key, window_prefix
from controlmsg.streaming.windows import TumblingWindows

__all__ = [
    "STATE_FORMAT",
    "read_task_state",
    "state_key",
    "state_topic_config",
    "write_task_state",
]

STATE_SEGMENT_MS: Final = 10 * 60_000
"""The state topic's ``segment.ms`` unless the run's topic settings name one (:func:`state_topic_config`)."""


def state_topic_config(given: Mapping[str, str]) -> dict[str, str]:
    """The settings to create a state topic with: ``given`` (the run's topic settings), then
    ``cleanup.policy=compact`` always, and ``segment.ms`` of :data:`STATE_SEGMENT_MS` unless ``given`` sets
    ``segment.ms`` or ``segment.bytes``.

    Why the segment: Kafka compacts closed segments only, and a segment closes at ``segment.bytes`` (1 GB
    by default) or ``segment.ms`` (7 days). With the defaults a state topic is never compacted in a run of
    hours, so a restarted task reads every state change since the run began: in the soak's first 8 minutes
    55,598 records for a few hundred open windows, growing without bound. Ten-minute segments let the
    cleaner bound what a restore reads to the open windows, the tombstones of ``delete.retention.ms`` and
    about the last ten minutes of changes."""
    config = dict(given)
    if "segment.ms" not in config and "segment.bytes" not in config:
        config["segment.ms"] = str(STATE_SEGMENT_MS)
    config["cleanup.policy"] = "compact"
    return config


def state_key(run_id: str, task_index: int) -> str:
    """The key of task ``task_index``'s header record in the state topic (its window records add
    ``/w/...``, see :mod:`controlmsg.streaming.window_state`)."""
    return header_key(run_id, task_index)


def read_task_state(config: Mapping[str, Any], state_topic: str, run_id: str, task_index: int,
                    timeout: float = 30.0) -> TaskStateLog | None:
    """The task's state as its latest commit left it (``None``: no header record, the task never
    committed): every record of its state partition, read with ``read_committed`` from the beginning up to
    the end offset taken at the start, folded by :class:`~controlmsg.streaming.window_state.TaskStateLog`.
    Records of aborted transactions are never seen.

    Call it after the task's transactional producer has been initialised: ``init_transactions`` aborts
    what a previous instance of the task left open, which could otherwise hold the last stable offset
    back. ``timeout`` bounds the wait for the topic and each wait for the next records, not the whole read
    (a large state takes longer). Raises :class:`ReadError` when the end is not reached (another task's
    transaction held open) or Kafka reports an error, :class:`CheckpointError` when the header is not
    JSON or of an unknown format.
    """
    count = wait_for_topic(config, state_topic, timeout)
    partition = task_index % count
    log = TaskStateLog(run_id, task_index, f"state topic {state_topic!r} partition {partition}")
    consumer = Consumer({
        # Larger fetches: a restore reads one partition, possibly millions of small records.
        "max.partition.fetch.bytes": 16 << 20,
        "fetch.wait.max.ms": EOF_FETCH_WAIT_MS,  # the restore ends on the end-of-partition event
        **for_client(config, "consumer"),
        "group.id": f"controlmsg-window-state-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    })
    errors = ConsumerErrors()
    try:
        low, high = watermark_offsets(consumer, state_topic, partition, timeout)
        if high <= low:
            return None
        consumer.assign([TopicPartition(state_topic, partition, OFFSET_BEGINNING)])
        apply = log.apply
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() >= deadline:
                raise ReadError(
                    f"state topic {state_topic!r} partition {partition}: end offset {high} not reached within "
                    f"{timeout:g} s of the last record (an open transaction holds the last stable offset back?)"
                )
            msgs: list[Any] = consume_ready(consumer, 10_000, 0.1)
            at_end = False
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end = msg.offset() >= high
                        continue
                    if errors.passes(err, msg.partition()):
                        continue
                    raise ReadError(f"reading state topic {state_topic!r} failed: {err.str()}")
                apply(msg.key(), msg.value())
                if msg.offset() + 1 >= high:
                    at_end = True
            if at_end:
                break
            if msgs:
                deadline = time.monotonic() + timeout
    except KafkaException as exc:
        raise ReadError(f"reading state topic {state_topic!r} failed: {exc.args[0]}") from exc
    finally:
        consumer.close()
    return None if log.header is None else log


def write_task_state(writer: ControlWriter, state_topic: str, partition: int, run_id: str, task_index: int,
                     header: Mapping[str, Any], windows: TumblingWindows) -> tuple[int, int]:
    """Add one commit's state to ``writer``'s open transaction: a record per window changed since the last
    ``windows.mark_committed()``, a tombstone per window closed since, then the header record (``header``
    plus ``"format"`` and ``"windows"``), all to ``partition`` of ``state_topic``. Does not commit: the
    caller commits the transaction, then calls ``windows.mark_committed()``. Returns the number of records
    and of key plus value bytes produced. Raises :class:`DeliveryError` when librdkafka refuses a record.
    """
    prefix = window_prefix(run_id, task_index)
    produce = writer.produce_to
    records = size = 0
    for key, value in commit_records(prefix, windows.changes()):
        produce(state_topic, value, key, partition)
        records += 1
        size += len(key) + (0 if value is None else len(value))
    doc = {"format": STATE_FORMAT, **header, "windows": windows.state_header()}
    key_b = state_key(run_id, task_index).encode()
    value_b = orjson.dumps(doc)
    produce(state_topic, value_b, key_b, partition)
    return records + 1, size + len(key_b) + len(value_b)

