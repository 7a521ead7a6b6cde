"""kill -9 of each job of the streaming chain in turn, in the middle of a run, then the same job started
again: it resumes from its checkpoint (ingest: source offsets and watermark state in its consumer group,
committed with its output; window: input offsets, bookkeeping and window state in its state topic,
committed with its output; sink: input offsets, bookkeeping and the length of its output file in a
checkpoint saved after the file is made durable, the file cut back to that length on restart), no
watermark goes back, no end of stream is lost, and the final output equals the oracle: nothing lost,
nothing twice.

Each job runs in its own process group (ingest and window are Spark applications, the sink a plain
process); the kill takes the whole group (driver, JVM and whatever Python workers share the group) with
SIGKILL, as a crashed machine would.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.job_group import JobGroup
from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.kafka import Checkpoint, ControlReader, DataRecord, FileCheckpointStore
from spark_jobs.common import topic_names
from spark_jobs.job_commands import job_args, write_client_config
from spark_jobs.pipeline import build_parser
from spark_jobs.runtime.sink import checkpoint_path

from .jobs import kill9, wait_all_ok
from .test_pipeline_oracle import assert_matches_oracle
from .test_streaming_pipeline import generated_source
from .topic_dump import dump_topic

pytestmark = pytest.mark.beside  # make test runs this module in its second lane (tests/lanes.py)

EVENTS = 6000


class Chain:
    """The three jobs of ``pipeline windowed-count --streaming``, started and killed one by one."""

    def __init__(self, servers: str, source: str, tmp_path: Path) -> None:
        self.run_id = f"restart-{uuid.uuid4().hex[:8]}"
        self.run_dir = tmp_path / "run"
        self.run_dir.mkdir()
        self.output = tmp_path / "windows.csv"
        args = build_parser().parse_args([
            "windowed-count", "--streaming", "--source-topic", source, "--until-source-end", "--key", "user",
            "--event-time", "event_time", "--window", "1m", "--sum", "amount", "--allowed-lateness", "10s",
            "--watermark-interval", "300ms", "--max-rate", "300", "--output", str(self.output),
            "--partitions", "3", "--tasks", "2", "--master", "local[2]", "--timeout", "300"])
        kafka_file = write_client_config({"bootstrap.servers": servers}, self.run_dir)
        self.commands = {job: job_args(job, args, kafka_file, self.run_id, self.run_dir)
                         for job in ("stream_ingest", "stream_window", "stream_sink")}
        self.jobs = JobGroup(self.run_dir)
        self.events_topic, self.windows_topic = topic_names(self.run_id)

    def start(self, job: str) -> None:
        self.jobs.start(job, self.commands[job])

    def kill9(self, job: str) -> None:
        kill9(self.jobs, job)

    def wait(self, timeout: float = 400.0) -> None:
        wait_all_ok(self.jobs, timeout)

    def close(self) -> None:
        self.jobs.close()


def wait_for_records(config: dict[str, Any], topic: str, run_id: str, at_least: int, timeout: float = 240) -> None:
    """Block until ``topic`` holds ``at_least`` committed user records of the run (and has not ended)."""
    deadline = time.monotonic() + timeout
    seen = 0
    with ControlReader(config, topic, run_id=run_id, topic_timeout=timeout) as reader:
        while seen < at_least:
            assert time.monotonic() < deadline, f"{topic}: {seen} records after {timeout} s"
            seen += sum(isinstance(item, DataRecord) for item in reader.poll(0.2))
            assert not reader.tracker.is_ended, f"{topic} ended before {at_least} records: no mid-run kill"


def check_wire(config: dict[str, Any], topic: str, tasks: int, partitions: int = 3) -> None:
    """Per upstream task, on every partition: its watermarks never go back, its end of stream is there
    exactly once (a transaction a killed job left open was aborted, not half-read)."""
    marks: dict[tuple[str, int], list[int]] = {}
    ends: Counter[tuple[str, int]] = Counter()
    for rec in dump_topic(config, topic):
        if rec.kind == "watermark":
            assert isinstance(rec.value, WatermarkMessage)
            marks.setdefault((rec.value.task_name, rec.partition), []).append(rec.value.timestamp)
        elif rec.kind == "eos":
            assert rec.task is not None
            ends[(rec.task, rec.partition)] += 1
    for key, seq in marks.items():
        assert seq == sorted(seq), f"{topic}: watermarks of {key} go back: {seq}"
    assert len(ends) == tasks * partitions and set(ends.values()) == {1}, ends


def test_kill_9_of_each_job_in_turn_mid_run_rescaling_the_ingest_2_4_3(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    """One run of the chain, each job killed in the middle of it and started again: the ingest twice, rescaled
    each time (``--tasks`` 2, killed a quarter through; 4, killed half through; then 3 to the end: docs/PROTOCOL.md,
    "Generations"), then the window job once window results flow, then the sink once it has made rows durable,
    all before the end of stream. The window job learns each new task set from the control messages themselves
    (a higher generation with its own ``taskCount``), so no record is late."""
    source = new_topic(4, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=EVENTS, keys=40, disorder_ms=5000, seed=21)
    chain = Chain(bootstrap_servers, source, tmp_path)
    ingest = chain.commands["stream_ingest"]
    try:
        for job in ("stream_sink", "stream_window"):
            chain.start(job)
        for tasks, through in ((2, EVENTS // 4), (4, EVENTS // 2)):
            chain.commands["stream_ingest"] = _with_tasks(ingest, tasks)
            chain.start("stream_ingest")
            wait_for_records(kafka_config, chain.events_topic, chain.run_id, through)
            chain.kill9("stream_ingest")
        chain.commands["stream_ingest"] = _with_tasks(ingest, 3)
        chain.start("stream_ingest")
        wait_for_records(kafka_config, chain.windows_topic, chain.run_id, 40)
        chain.kill9("stream_window")
        chain.start("stream_window")
        saved = wait_for_sink_checkpoint(chain.output, timeout=120)
        chain.kill9("stream_sink")  # it had made rows durable: the restart resumes there, not from scratch
        assert saved.extra["rows"] > 0 and sum(saved.offsets.values()) > 0
        chain.start("stream_sink")
        chain.wait()
    finally:
        chain.close()
    rows = assert_matches_oracle(spark, str(chain.output), input_path=str(events), key="user",
                                 event_time="event_time", window="1m", sums=["amount"])
    assert rows > 200  # ten minutes of event time, 40 keys
    ingest_summary = json.loads((chain.run_dir / "stream_ingest.json").read_text())
    assert ingest_summary["generation"] == 2 and len(ingest_summary["tasks"]) == 3
    window = json.loads((chain.run_dir / "stream_window.json").read_text())
    assert sum(t["windows_emitted"] for t in window["tasks"]) == rows  # each window written once in all
    assert sum(t["late"] for t in window["tasks"]) == 0  # no window closed early for a task not heard from
    assert all(t["resumed"] for t in window["tasks"])  # from the state topic, not from scratch
    sink = json.loads((chain.run_dir / "stream_sink.json").read_text())
    assert sink["rows"] == rows and sink["ended"] and sink["resumed"]
    check_generations(kafka_config, chain.events_topic)
    check_wire(kafka_config, chain.windows_topic, tasks=3)  # a window task per events partition


def _with_tasks(command: list[str], tasks: int) -> list[str]:
    at = command.index("--tasks")
    return [*command[:at + 1], str(tasks), *command[at + 2:]]


def check_generations(config: dict[str, Any], topic: str) -> None:
    """The events topic's wire after the rescales: three generations, each with its own taskCount, watermarks
    that never go back within a generation, and the stream ended by generation 2's tasks, each once on each of
    the 3 partitions (a task of an older generation may have ended its own stream before a kill, when its
    source partitions reached their end)."""
    counts: dict[int, set[int]] = {}
    marks: dict[tuple[int, str, int], list[int]] = {}
    ended: Counter[tuple[int, str, int]] = Counter()
    for rec in dump_topic(config, topic):
        message = rec.value
        if isinstance(message, WatermarkMessage | EndOfStreamMessage):
            counts.setdefault(message.generation, set()).add(message.task_count)
            key = (message.generation, message.task_name, rec.partition)
            if isinstance(message, WatermarkMessage):
                marks.setdefault(key, []).append(message.timestamp)
            else:
                ended[key] += 1
    assert counts == {0: {2}, 1: {4}, 2: {3}}
    for key, seq in marks.items():
        assert seq == sorted(seq), f"watermarks of {key} go back: {seq}"
    assert set(ended.values()) == {1}, ended
    assert len([k for k in ended if k[0] == 2]) == 3 * 3, ended


def wait_for_sink_checkpoint(output: Path, timeout: float) -> Checkpoint:
    """The sink's saved checkpoint, once it holds rows (it saves after making the file durable)."""
    deadline = time.monotonic() + timeout
    while True:
        saved = FileCheckpointStore(checkpoint_path(output)).load()
        if saved is not None and saved.extra["rows"] > 0:
            return saved
        assert time.monotonic() < deadline, f"no sink checkpoint with rows after {timeout} s"
        time.sleep(0.2)
