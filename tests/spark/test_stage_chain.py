"""The example streaming chain as three ordinary Structured Streaming queries (``spark_jobs.stages.ingest``,
``stage_window``, ``stage_sink``), each its own Spark application, on a real broker: equal to the oracle
with late data, more write tasks than cores, ``kill -9`` of each stage in the middle of its run and the
same command again (the ingest with fewer tasks: rescaled between runs), every window once, and the
chain ends by itself at the source's end.

Each stage runs in its own process group; the kill takes the whole group (driver, JVM, Python workers).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.jobs import JobGroup
from controlmsg.kafka import ControlReader, DataRecord

from .jobs import kill9, wait_all_ok
from .test_streaming_pipeline import generated_source
from .test_streaming_restarts import wait_for_records

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

EVENTS = 6000
WINDOW_MS = 60_000


class Stages:
    """The three stages of one run, started and killed one by one."""

    def __init__(self, servers: str, source: str, tmp_path: Path, *, storage: Mapping[str, str] | None = None,
                 master: str = "local[2]", extra: Mapping[str, Sequence[str]] | None = None) -> None:
        """``storage``: where each stage keeps its checkpoint (``stage_ingest``...) and where the sink writes
        (``output``); default: directories under ``tmp_path``. ``extra``: more arguments of a stage."""
        self.run_id = f"stages-{uuid.uuid4().hex[:8]}"
        self.dir = tmp_path
        self.events_topic, self.windows_topic = f"{self.run_id}-events", f"{self.run_id}-windows"
        where = {"stage_ingest": str(tmp_path / "ckpt-ingest"), "stage_window": str(tmp_path / "ckpt-window"),
                 "stage_sink": str(tmp_path / "ckpt-sink"), "output": str(tmp_path / "windows.parquet"),
                 **(storage or {})}
        self.output = where["output"]
        self.extra = extra or {}
        common = ["--run-id", self.run_id, "--master", master, "--bootstrap-servers", servers]
        self.commands = {
            "stage_ingest": ["--source-topic", source, "--topic", self.events_topic, "--key", "user",
                             "--event-time", "event_time", "--carry", "amount", "--allowed-lateness", "10s",
                             "--partitions", "3", "--until-source-end", "--max-offsets-per-trigger", "400",
                             "--checkpoint", where["stage_ingest"]],
            "stage_window": ["--input-topic", self.events_topic, "--output-topic", self.windows_topic,
                             "--window", "1m", "--sum", "amount", "--partitions", "3",
                             "--checkpoint", where["stage_window"]],
            "stage_sink": ["--input-topic", self.windows_topic, "--output", self.output, "--sum", "amount",
                           "--checkpoint", where["stage_sink"]],
        }
        self.common = common
        self.jobs = JobGroup(tmp_path)

    def start(self, job: str, *extra: str) -> None:
        module = f"spark_jobs.stages.{job.removeprefix('stage_')}"  # the job stage_ingest is stages/ingest.py
        self.jobs.start(job, [sys.executable, "-m", module, *self.commands[job], *self.common,
                              *self.extra.get(job, ()), *extra, "--summary", str(self.dir / f"{job}.json")])

    def kill9(self, job: str) -> None:
        kill9(self.jobs, job)

    def wait(self, timeout: float = 420.0) -> None:
        wait_all_ok(self.jobs, timeout)

    def close(self) -> None:
        self.jobs.close()


def read_all(config: dict[str, Any], topic: str, run_id: str) -> list[dict[str, Any]]:
    """Every user record of the run, to its end of stream."""
    with ControlReader(config, topic, run_id=run_id, stop_at_end=True, topic_timeout=60) as reader:
        records = []
        deadline = time.monotonic() + 120
        while not reader.tracker.is_ended:
            assert time.monotonic() < deadline, f"{topic}: no end of stream"
            records += [orjson.loads(i.payload) for i in reader.poll(0.2) if isinstance(i, DataRecord)]
    return records


def event_ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def test_three_queries_kill_9_each_rescale_and_the_oracle(spark: SparkSession, kafka_config: dict[str, Any],
                                                         bootstrap_servers: str, new_topic: Callable[..., str],
                                                         tmp_path: Path) -> None:
    source = new_topic(6, prefix="raw")
    path = generated_source(kafka_config, source, tmp_path, events=EVENTS, keys=40, disorder_ms=5000, seed=23,
                            late_fraction=0.03, late_by_ms=600_000)
    events = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    stages = Stages(bootstrap_servers, source, tmp_path)
    try:
        stages.start("stage_sink")
        stages.start("stage_window")
        stages.start("stage_ingest", "--tasks", "6")  # six write tasks on two cores
        wait_for_records(kafka_config, stages.events_topic, stages.run_id, EVENTS // 4, timeout=300)
        stages.kill9("stage_ingest")
        stages.start("stage_ingest", "--tasks", "3")  # rescaled: the driver is the one upstream task
        wait_for_records(kafka_config, stages.windows_topic, stages.run_id, 40, timeout=300)
        stages.kill9("stage_window")
        stages.start("stage_window")
        stages.kill9("stage_sink")
        stages.start("stage_sink")
        stages.wait()
    finally:
        stages.close()

    check_chain(spark, kafka_config, stages, events)


def check_chain(spark: SparkSession, kafka_config: dict[str, Any], stages: Stages,
                events: list[dict[str, Any]]) -> None:
    """The chain's outputs against the oracle: every late record once on the late topic, every other record
    in its window, every window once on the windows topic and in the Parquet output, and every stage ended."""
    late = read_all(kafka_config, f"{stages.windows_topic}-late", stages.run_id)
    assert late, "3% of the events are ten minutes late: some must meet the watermark"
    assert all(v["event_ms"] < v["watermark"] for v in late)
    inputs = Counter((e["user"], event_ms(e["event_time"]), e["amount"]) for e in events)
    left = inputs - Counter((v["key"], v["event_ms"], v["amount"]) for v in late)
    assert sum(left.values()) == len(events) - len(late), "each late record is one of the input's, once"
    want: dict[tuple[str, int], list[float]] = {}
    for (user, ms, amount), n in left.items():
        acc = want.setdefault((user, ms - ms % WINDOW_MS), [0, 0.0])
        acc[0] += n
        acc[1] += amount * n
    results = read_all(kafka_config, stages.windows_topic, stages.run_id)
    topic_windows = Counter((r["key"], r["window_start"]) for r in results)
    assert max(topic_windows.values()) == 1, "every window once on the windows topic"
    assert set(topic_windows) == set(want), "the window stage's results"
    rows = spark.read.parquet(stages.output).collect()
    got = Counter((r["key"], r["window_start"]) for r in rows)
    assert max(got.values()) == 1, "every window once, across the kills"
    assert set(got) == set(want)
    for r in rows:
        count, total = want[(r["key"], r["window_start"])]
        assert r["count"] == count and r["window_end"] == r["window_start"] + WINDOW_MS
        assert abs(r["sum_amount"] - total) <= 1e-9 * max(1.0, abs(total))
    ingest = orjson.loads((stages.dir / "stage_ingest.json").read_bytes())
    assert ingest["ended"] and ingest["run"]["ended"]
    window = orjson.loads((stages.dir / "stage_window.json").read_bytes())
    assert window["windows"]["ended"] and window["late"]["ended"]
