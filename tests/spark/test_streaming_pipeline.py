"""The streaming pipeline through the CLI: three separate Spark applications (long-running stream_ingest
and stream_window tasks, then the sink) over a raw source topic, bounded by --until-source-end, equal to
the oracle over the same events; more upstream tasks than cores here, late data on a standalone cluster in
``test_pipeline_apps.py`` (:func:`check_late_and_windows`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from controlmsg.streaming.window import LATE_REASON
from spark_jobs.common import topic_names
from spark_jobs.generate import GeneratorConfig, generate
from tests.oracles import event_time_ms

from .test_pipeline_oracle import assert_matches_oracle


def generated_source(kafka_config: dict[str, Any], topic: str, tmp_path: Path, **generator: Any) -> Path:
    """Generate click events into ``topic`` (``GeneratorConfig(**generator)``, all at once, event times
    from 2026-01-01 at 1e5x) and write them to ``tmp_path / "events.jsonl"`` for the oracle; its path."""
    settings = {"rate": 1e6, "start_ms": 1_767_225_600_000, "speedup": 1e5, **generator}
    ends = generate(kafka_config, topic, GeneratorConfig(**settings))
    events = tmp_path / "events.jsonl"
    dump_source(kafka_config, topic, ends, events)
    return events


def dump_source(kafka_config: dict[str, Any], topic: str, ends: dict[int, int], path: Path) -> None:
    consumer = Consumer({**kafka_config, "group.id": "dump", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < sum(ends.values()) and time.monotonic() < deadline:
        got += [m.value() or b"" for m in consumer.consume(1000, 0.5) if m.error() is None]
    consumer.close()
    path.write_bytes(b"\n".join(got) + b"\n")


def check_late_and_windows(spark: SparkSession, kafka_config: dict[str, Any], *, run_id: str, events: Path,
                           output: Path, run_dir: Path, stdout: str) -> int:
    """A streaming run over events of which some were late: the late ones the window job met behind its
    watermark are in the late topic, counted, naming their upstream task; the output equals the oracle over
    the other events; every event is in exactly one of the two. Returns the output's rows."""
    late_topic = f"{topic_names(run_id)[1]}-late"
    late = read_late(kafka_config, late_topic)
    summary = json.loads((run_dir / "stream_window.json").read_text())
    assert sum(task["late"] for task in summary["tasks"]) == len(late) > 0
    assert f"late records (behind the watermark, in {late_topic}): {len(late)}" in stdout
    assert all(v["event_ms"] < v["watermark"] and v["upstream_task"].startswith(f"ingest-{run_id}-p") for v in late)
    # The oracle over the events that were not late; each late event is one of the input's.
    on_time = output.parent / "on_time.jsonl"
    left = Counter((v["key"], v["event_ms"], v["amount"]) for v in late)
    kept = []
    for line in events.read_bytes().splitlines():
        e = orjson.loads(line)
        mark = (e["user"], event_time_ms(e["event_time"]), e["amount"])
        if left[mark] > 0:
            left[mark] -= 1
        else:
            kept.append(line)
    assert +left == Counter(), f"late records that are not input events: {+left}"
    on_time.write_bytes(b"\n".join(kept) + b"\n")
    rows = assert_matches_oracle(spark, str(output), input_path=str(on_time), key="user", event_time="event_time",
                                 window="1m", sums=["amount"])
    assert all(task["ended"] for task in summary["tasks"])
    assert sum(task["windows_emitted"] for task in summary["tasks"]) == rows  # each window written once
    return rows


def read_late(kafka_config: dict[str, Any], topic: str) -> list[dict[str, Any]]:
    """Every late record (JSON body) of the side topic; malformed ones would fail the test."""
    consumer = Consumer({**kafka_config, "group.id": "late", "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msgs = consumer.consume(1000, 0.5)
        if any(m.error() is not None for m in msgs):
            got += [orjson.loads(m.value() or b"null") for m in msgs if m.error() is None]
            break
        got += [orjson.loads(m.value() or b"null") for m in msgs]
    consumer.close()
    assert all(v["reason"] == LATE_REASON for v in got)
    return got


def test_more_upstream_tasks_than_cores(spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
                                        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """``--tasks 8`` on ``local[2]`` (issue #10, item 1): eight logical ingest tasks and eight window tasks,
    each two Spark task slots run four of them; the output equals the oracle, and every one of the eight
    upstream tasks of each intermediate topic keeps its own name, watermark and end of stream on every
    partition."""
    from .test_streaming_restarts import check_wire

    source = new_topic(8, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=4000, keys=40, disorder_ms=2000, seed=81)
    output = tmp_path / "windows.csv"
    run_id = f"wide-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--streaming", "--source-topic", source,
         "--until-source-end", "--key", "user", "--event-time", "event_time", "--window", "1m", "--sum", "amount",
         "--allowed-lateness", "1h", "--watermark-interval", "300ms", "--output", str(output),
         "--bootstrap-servers", bootstrap_servers, "--partitions", "8", "--tasks", "8", "--master", "local[2]",
         "--timeout", "300", "--run-id", run_id, "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = assert_matches_oracle(spark, str(output), input_path=str(events), key="user", event_time="event_time",
                                 window="1m", sums=["amount"])
    assert rows > 20
    for job in ("stream_ingest", "stream_window"):
        summary = json.loads((tmp_path / "run" / f"{job}.json").read_text())
        assert len(summary["tasks"]) == 8 and all(task["ended"] for task in summary["tasks"])
        log = (tmp_path / "run" / f"{job}.log").read_text(errors="replace")
        assert "8 logical tasks on 2 task slots" in log, log[-2000:]
    events_topic, windows_topic = topic_names(run_id)
    check_wire(kafka_config, events_topic, tasks=8, partitions=8)
    check_wire(kafka_config, windows_topic, tasks=8, partitions=8)
