"""Option ``--group-id`` of the readers outside Spark (``controlmsg consume``, the streaming window job's tasks,
the streaming sink): what they have read and checkpointed is also committed to a consumer group, and Kafka's own
``kafka-consumer-groups --describe`` (run from Kafka's jars) shows their lag: the records written since, then 0
at the end of stream, past the transaction markers that no record follows. The group has no member."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlmsg.clusters.kafka_tools import consumer_groups
from controlmsg.kafka import ControlWriter, create_topic
from controlmsg.streaming.state_topic import state_topic_config
from controlmsg.streaming.window import TaskSummary, run_window_task
from spark_jobs.runtime.sink import run_stream_sink

pytestmark = pytest.mark.kafka

RUN = "run-g"


def described(servers: str, group: str) -> tuple[dict[int, tuple[int, int, int]], str]:
    """``kafka-consumer-groups --describe --group <group>``: partition -> (current offset, log end offset, lag),
    as the tool prints them (one topic per group here), and its whole output."""
    text = consumer_groups(servers, "--describe", "--group", group)
    rows: dict[int, tuple[int, int, int]] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == group and cells[2].isdigit():
            rows[int(cells[2])] = (int(cells[3]), int(cells[4]), int(cells[5]))
    return rows, text


def transactional_writers(config: dict[str, Any], topic: str) -> list[ControlWriter]:
    """Two upstream tasks whose records end in transaction markers (as every Spark and runtime writer's do)."""
    return [ControlWriter({**config, "transactional.id": f"tx-{topic}-{t}"}, topic, task_name=f"t{t}", task_count=2,
                          run_id=RUN) for t in range(2)]


def send(writers: list[ControlWriter], records: int, *, end: bool = False) -> None:
    for t, writer in enumerate(writers):
        for i in range(records):
            writer.send({"key": f"k{i % 5}", "event_ms": 1000 * i + t, "amount": i}, key=f"k{i % 5}")
        writer.send_watermark(1000 * records)
        if end:
            writer.send_end_of_stream()
        writer.commit()


def consume(servers: str, topic: str, checkpoint: Path, group: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlmsg", "consume", "--bootstrap-servers", servers, "--topic",
                           topic, "--checkpoint", str(checkpoint), "--group-id", group, "--run-id", RUN, *args],
                          capture_output=True, text=True, timeout=120)


def test_consume_reports_its_lag_to_the_group_down_to_0_at_the_end_of_stream(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic, group = new_topic(2), f"lag-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "consume.json"
    writers = transactional_writers(kafka_config, topic)
    try:
        send(writers, 20)
        first = consume(bootstrap_servers, topic, checkpoint, group, "--timeout", "4")
        assert first.returncode == 3, first.stderr  # no end of stream yet
        read, text = described(bootstrap_servers, group)
        # All there is was read: each partition's offset stands at its end, past the transactions' markers.
        assert sorted(read) == [0, 1], text
        assert all(current == end and lag == 0 for current, end, lag in read.values()), text
        send(writers, 10, end=True)  # 10 records a task and a watermark, split over the partitions
        behind, text = described(bootstrap_servers, group)
        assert {p: current for p, (current, _, _) in behind.items()} == \
            {p: current for p, (current, _, _) in read.items()}, text  # nothing moved it meanwhile
        assert sum(lag for _, _, lag in behind.values()) >= 2 * 10, text
        second = consume(bootstrap_servers, topic, checkpoint, group, "--until-eos", "--timeout", "60")
        assert second.returncode == 0, second.stderr
        assert second.stdout.count('"kind":"data"') == 2 * 10, second.stdout[-2000:]  # resumed at the checkpoint
    finally:
        for writer in writers:
            writer.close()
    done, text = described(bootstrap_servers, group)
    assert sorted(done) == [0, 1] and all(lag == 0 and current == end for current, end, lag in done.values()), text
    # A report only: no consumer is a member of the group (CONSUMER-ID "-").
    assert all(line.split()[6] == "-" for line in text.splitlines() if line.startswith(group)), text


def test_window_tasks_and_the_sink_report_their_lag_to_groups(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    source, windows = new_topic(2, "gw-in"), new_topic(2, "gw-out")
    late, state = new_topic(1, "gw-late"), f"gw-state-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_config, state, 1, topic_config=state_topic_config({}))
    window_group, sink_group = f"lag-w-{uuid.uuid4().hex[:8]}", f"lag-s-{uuid.uuid4().hex[:8]}"
    writers = transactional_writers(kafka_config, source)
    try:
        send(writers, 30, end=True)
    finally:
        for writer in writers:
            writer.close()

    # Two tasks, one per input partition, as the window job runs them; each commits its own partition.
    summaries: list[TaskSummary] = []
    errors: list[BaseException] = []

    def task(i: int) -> None:
        try:
            summaries.append(run_window_task(
                kafka_config, input_topic=source, partitions=[i], run_id=RUN, output_topic=windows,
                late_topic=late, state_topic=state, task_index=i, task_count=2, window_ms=5000, sums=["amount"],
                commit_interval_s=0.2, timeout_s=60, group_id=window_group))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(i,), daemon=True) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not errors, errors
    assert len(summaries) == 2 and all(s.ended for s in summaries), summaries
    done, text = described(bootstrap_servers, window_group)
    assert sorted(done) == [0, 1] and all(lag == 0 and current == end for current, end, lag in done.values()), text

    output = tmp_path / "windows.csv"
    summary = run_stream_sink(kafka_config, input_topic=windows, output=str(output), run_id=RUN, sums=["amount"],
                              timeout_s=60, group_id=sink_group)
    assert summary["ended"] and summary["rows"] == output.read_text().count("\n") - 1 > 0, summary
    done, text = described(bootstrap_servers, sink_group)
    assert sorted(done) == [0, 1] and all(lag == 0 and current == end for current, end, lag in done.values()), text
