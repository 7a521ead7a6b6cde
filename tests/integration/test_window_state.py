"""The window task's state changelog on a real broker: commits of changed windows only, restore after an
aborted transaction and after a killed (fenced) writer, state larger than one Kafka record, other tasks
in the same partition, and a format 1 state record resumed by a running task."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from controlmsg.kafka import ControlReader, ControlWriter, create_topic
from controlmsg.streaming.state_topic import read_task_state, state_key, state_topic_config, write_task_state
from controlmsg.streaming.window import run_window_task
from controlmsg.streaming.windows import TumblingWindows

RUN = "run-s"
SIZE = 1000


def state_topic(config: dict[str, Any]) -> str:
    name = f"ws-state-{uuid.uuid4().hex[:8]}"
    create_topic(config, name, 2, topic_config=state_topic_config({}))
    return name


def task_writer(config: dict[str, Any], topic: str, output: str, task: int) -> ControlWriter:
    """A transactional writer as the window task makes one (same transactional id for every instance)."""
    return ControlWriter({**config, "transactional.id": f"ws-{topic}-{task}"}, output, task_name=f"w-p{task}",
                         task_count=1, run_id=RUN)


def restored(config: dict[str, Any], topic: str, task: int) -> TumblingWindows:
    log = read_task_state(config, topic, RUN, task, timeout=30)
    assert log is not None
    return log.windows(SIZE, ("v",))


def end_offset(config: dict[str, Any], topic: str, partition: int) -> int:
    consumer = Consumer({**config, "group.id": f"ws-{uuid.uuid4().hex}"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
    finally:
        consumer.close()


def test_commits_abort_and_a_killed_writer_leave_exactly_the_committed_state(
    kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = state_topic(kafka_config)
    output = new_topic(1, "ws-out")
    task = 1  # partition 1 of the state topic
    rng = random.Random(7)
    windows = TumblingWindows(SIZE, ("v",))
    writer = task_writer(kafka_config, topic, output, task)
    for step in range(6):  # several commits: 3000 windows at first, then a few changed, some closed
        n = 3000 if step == 0 else 60
        for _ in range(n):
            key = f"k{rng.randrange(3000)}"
            windows.add(key, step * SIZE + rng.randrange(3 * SIZE), {"v": rng.choice([1, 2.5, None])})
        windows.advance(step * SIZE)
        changes = windows.changes()
        assert len(changes.updated) <= n  # what changed, not the open windows (about 2500)
        records, _ = write_task_state(writer, topic, task, RUN, task, {"step": step}, windows)
        assert records == len(changes.updated) + len(changes.closed) + 1
        writer.commit()
        windows.mark_committed()
    committed = windows.snapshot()
    assert restored(kafka_config, topic, task).snapshot() == committed

    # An aborted transaction: its records reach the log, but read_committed never shows them.
    before = end_offset(kafka_config, topic, task)
    for i in range(500):
        windows.add(f"gone{i}", 9 * SIZE, {"v": 1})
    windows.advance(8 * SIZE)
    write_task_state(writer, topic, task, RUN, task, {"step": "aborted"}, windows)
    writer.flush()  # on the broker, then aborted (abort alone would drop them before they were sent)
    writer.abort()
    assert end_offset(kafka_config, topic, task) > before + 500
    log = read_task_state(kafka_config, topic, RUN, task)
    assert log is not None and log.header is not None and log.header["step"] == 5
    assert log.windows(SIZE, ("v",)).snapshot() == committed

    # Killed mid-transaction: the records are written, the writer vanishes without commit or abort. The
    # next instance's init_transactions fences it and aborts the open transaction.
    windows = restored(kafka_config, topic, task)
    for i in range(500):
        windows.add(f"zombie{i}", 9 * SIZE, {"v": 1})
    write_task_state(writer, topic, task, RUN, task, {"step": "killed"}, windows)
    writer.flush()
    successor = task_writer(kafka_config, topic, output, task)
    try:
        assert restored(kafka_config, topic, task).snapshot() == committed
    finally:
        successor.close()


def test_state_larger_than_a_record_restores_exactly(kafka_config: dict[str, Any], new_topic: Callable[..., str]
                                                     ) -> None:
    topic = state_topic(kafka_config)
    output = new_topic(1, "ws-out")
    windows = TumblingWindows(SIZE, ("v",))
    other = TumblingWindows(SIZE, ("v",))
    for i in range(60_000):  # about 3 MB of window records: the old single record could not hold it
        windows.add(f"user-{i:08d}-\"/w/[ä", (i % 5) * SIZE, {"v": i * 0.5})
        other.add(f"other-{i % 50}", 0, {"v": 1})
    writer = task_writer(kafka_config, topic, output, 0)
    other_writer = task_writer(kafka_config, topic, output, 2)  # task 2: the same partition as task 0
    try:
        _, size = write_task_state(writer, topic, 0, RUN, 0, {}, windows)
        assert size > 2 << 20
        writer.commit()
        windows.mark_committed()
        write_task_state(other_writer, topic, 0, RUN, 2, {}, other)
        other_writer.commit()
        closed = windows.advance(2 * SIZE)  # 24,000 tombstones
        assert len(closed) == 24_000
        write_task_state(writer, topic, 0, RUN, 0, {}, windows)
        writer.commit()
        windows.mark_committed()
    finally:
        writer.close()
        other_writer.close()
    back = restored(kafka_config, topic, 0)
    assert back.snapshot() == windows.snapshot() and back.open_windows == 36_000
    assert restored(kafka_config, topic, 2).snapshot() == other.snapshot()
    assert repr(back.close_all()) == repr(windows.close_all())


def test_a_format_1_state_record_is_resumed_and_rewritten(kafka_config: dict[str, Any],
                                                         new_topic: Callable[..., str]) -> None:
    """A task whose last commit was written by the previous version (one record, whole snapshot) resumes
    from it; its first commit writes every window as a record and a format 2 header."""
    input_topic, output, late = new_topic(1, "ws-in"), new_topic(1, "ws-out"), new_topic(1, "ws-late")
    topic = f"ws-state-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_config, topic, 1, topic_config=state_topic_config({}))
    upstream = ControlWriter(kafka_config, input_topic, task_name="a", task_count=1, run_id=RUN)
    for i in range(10):
        upstream.send({"key": f"k{i % 3}", "event_ms": 100 * i, "v": i}, key=f"k{i % 3}")
    upstream.flush()
    with ControlReader(kafka_config, input_topic, run_id=RUN) as reader:  # the offsets and bookkeeping after them
        got = 0
        while got < 10:
            got += len(reader.poll(1.0))
        checkpoint = reader.checkpoint()
    old_windows = TumblingWindows(SIZE, ("v",))
    for i in range(10):
        old_windows.add(f"k{i % 3}", 100 * i, {"v": i})
    old = {"format": 1, "inputTopic": input_topic, "partitions": [0],
           "offsets": {str(p): o for p, o in checkpoint.offsets.items()}, "bookkeeping": checkpoint.bookkeeping,
           "windows": old_windows.snapshot(), "emitted_watermark": None,
           "counters": {"records": 10, "rejected": 0, "windowsEmitted": 0, "commits": 1}}
    producer = Producer(kafka_config)
    producer.produce(topic, orjson.dumps(old), state_key(RUN, 0).encode(), partition=0)
    assert producer.flush(10) == 0
    upstream.send({"key": "k0", "event_ms": 1500, "v": 100}, key="k0")
    upstream.send_end_of_stream()
    upstream.close()
    summary = run_window_task(kafka_config, input_topic=input_topic, partitions=[0], run_id=RUN, output_topic=output,
                              late_topic=late, state_topic=topic, task_index=0, task_count=1, window_ms=SIZE,
                              sums=["v"], commit_interval_s=0.2, timeout_s=30)
    assert summary.resumed and summary.ended and summary.records == 11 and summary.windows_emitted == 4
    log = read_task_state(kafka_config, topic, RUN, 0)
    assert log is not None and log.header is not None and log.header["format"] == 2
    assert log.windows(SIZE, ("v",)).is_ended


def test_a_state_topic_rolls_segments_so_compaction_can_bound_a_restore(kafka_config: dict[str, Any]) -> None:
    """Kafka compacts closed segments only: the state topic is created with ten-minute segments unless the
    run's settings size them, and compacted whatever they say."""
    assert state_topic_config({"cleanup.policy": "delete", "min.insync.replicas": "2"}) == {
        "cleanup.policy": "compact", "min.insync.replicas": "2", "segment.ms": "600000"}
    assert state_topic_config({"segment.bytes": str(64 << 20)}) == {"segment.bytes": str(64 << 20),
                                                                    "cleanup.policy": "compact"}
    name = state_topic(kafka_config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    admin = AdminClient(kafka_config)  # kept until the answer is in: a collected client cancels its requests
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    assert described["cleanup.policy"].value == "compact" and described["segment.ms"].value == "600000"
