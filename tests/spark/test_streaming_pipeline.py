"""The streaming pipeline through the CLI: three separate Spark applications (long-running stream_ingest
and stream_window tasks, then the sink) over a raw source topic, bounded by --until-source-end, equal to
the oracle over the same events."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from spark_jobs.generate import GeneratorConfig, generate

from .test_pipeline_oracle import assert_matches_oracle


def dump_source(kafka_config: dict[str, Any], topic: str, ends: dict[int, int], path: Path) -> None:
    consumer = Consumer({**kafka_config, "group.id": "dump", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < sum(ends.values()) and time.monotonic() < deadline:
        got += [m.value() for m in consumer.consume(1000, 0.5) if m.error() is None]
    consumer.close()
    path.write_bytes(b"\n".join(got) + b"\n")


def test_streaming_pipeline_until_source_end(spark: SparkSession, kafka_config: dict[str, Any],
                                             bootstrap_servers: str, new_topic: Callable[..., str],
                                             tmp_path: Path) -> None:
    source = new_topic(4, prefix="raw")
    ends = generate(kafka_config, source, GeneratorConfig(events=6000, rate=1e6, keys=40, disorder_ms=5000,
                                                          start_ms=1_767_225_600_000, speedup=600.0, seed=8))
    events = tmp_path / "events.jsonl"
    dump_source(kafka_config, source, ends, events)
    output = tmp_path / "windows.csv"
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--streaming", "--source-topic", source,
         "--until-source-end", "--key", "user", "--event-time", "event_time", "--window", "1m", "--sum", "amount",
         "--allowed-lateness", "10s", "--watermark-interval", "300ms", "--output", str(output),
         "--bootstrap-servers", bootstrap_servers, "--partitions", "3", "--tasks", "2", "--master", "local[2]",
         "--timeout", "240", "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "late records (behind the watermark" in done.stdout and ": 0" in done.stdout
    rows = assert_matches_oracle(spark, str(output), input_path=str(events), key="user", event_time="event_time",
                                 window="1m", sums=["amount"])
    summary = json.loads((tmp_path / "run" / "stream_window.json").read_text())
    assert all(task["ended"] for task in summary["tasks"])
    assert sum(task["windows_emitted"] for task in summary["tasks"]) == rows  # each window written once
