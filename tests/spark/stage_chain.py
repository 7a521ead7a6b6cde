"""The example streaming chain as three ordinary Structured Streaming queries (``spark_jobs.stages.ingest``,
``stage_window``, ``stage_sink``), each its own Spark application: :class:`Stages` starts and kills them, and
:func:`check_chain` holds their outputs against an oracle of its own. The test that runs them with ``kill -9``
of each stage is ``test_stage_chain_clusters.py`` (a two-worker cluster, HDFS and S3 checkpoints); the compose
test runs them once more, in containers.

Each stage runs in its own process group; the kill takes the whole group (driver, JVM, Python workers).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql import SparkSession

from controlmsg.clusters.job_group import JobGroup
from tests.oracles import duration_ms, event_time_ms, late_problems, multiset, read_run, watermark_problems

from .jobs import kill9, wait_all_ok

WINDOW_MS = 60_000
ALLOWED_LATENESS = "10s"  # the ingest's: its watermark is the largest event time it has read minus this


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
        self.where = where
        self.output = where["output"]
        self.extra = extra or {}
        common = ["--run-id", self.run_id, "--master", master, "--bootstrap-servers", servers]
        self.commands = {
            "stage_ingest": ["--source-topic", source, "--topic", self.events_topic, "--key", "user",
                             "--event-time", "event_time", "--carry", "amount", "--allowed-lateness", ALLOWED_LATENESS,
                             "--partitions", "3", "--until-source-end", "--max-offsets-per-trigger", "1000",
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

    def wait_for_commit(self, spark: SparkSession, job: str, batch: int = 0, timeout: float = 420.0) -> None:
        """Wait until ``job``'s checkpoint holds ``commits/<batch>``: its micro-batch ``batch`` completed.

        A stage killed inside its very first micro-batch can leave an ``offsets/`` directory without a batch
        in it, and Spark then refuses to start on that checkpoint (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``,
        docs/SPARK.md); the kills here are of stages in the middle of their runs, so they wait for this."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(f"{self.where[job].rstrip('/')}/commits/{batch}")
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        deadline = time.monotonic() + timeout
        while not fs.exists(path):
            assert time.monotonic() < deadline, f"{job}: no {path} after {timeout:.0f} s"
            time.sleep(1.0)

    def wait(self, timeout: float = 420.0) -> None:
        wait_all_ok(self.jobs, timeout)

    def close(self) -> None:
        self.jobs.close()


def check_chain(spark: SparkSession, kafka_config: dict[str, Any], stages: Stages,
                events: list[dict[str, Any]]) -> None:
    """The chain's outputs against an oracle of its own (``tests/oracles.py``: every topic read raw, the wire
    format decoded and each partition's watermark followed there, no ``controlmsg`` code):

    * the ingest wrote every source event once (event times parsed by the oracle), ended its stream on every
      partition, and never published a watermark ahead of the events it had written
      (:func:`~tests.oracles.watermark_problems`);
    * the late records are those the window stage's input makes late, each once, each with a watermark
      between its partition's watermark right before it and the highest that partition's watermark had
      been (:func:`~tests.oracles.late_problems`; the one upstream task's watermark never goes back, so the
      two are equal and the late set is exact, whatever the micro-batches);
    * the windows are the input minus the late records: every window once, with its count and sum, on the
      windows topic and in the Parquet output; every topic's run ended, and every stage's summary says so.
    """
    fields = ("key", "event_ms", "amount")
    source = Counter((e["user"], event_time_ms(e["event_time"]), e["amount"]) for e in events)
    assert all(ms is not None for _, ms, _ in source), "the generator writes ISO-8601 event times"
    inputs = read_run(kafka_config, stages.events_topic, stages.run_id)
    assert inputs.ended, "the ingest's end of stream on every partition of its topic"
    assert multiset(inputs.data, fields) == source, "the ingest wrote every source event once"
    assert watermark_problems(inputs.records, duration_ms(ALLOWED_LATENESS)) == []
    late_run = read_run(kafka_config, f"{stages.windows_topic}-late", stages.run_id)
    late = late_run.data
    assert late_run.ended and late, "3% of the events are ten minutes late: some must meet the watermark"
    assert late_problems([r for r in inputs.records if r.kind == "data"], late, fields) == []
    left = source - multiset(late, fields)
    assert sum(left.values()) == len(events) - len(late), "each late record is one of the input's, once"
    want: dict[tuple[str, int], list[float]] = {}
    for (user, ms, amount), n in left.items():
        assert ms is not None
        acc = want.setdefault((user, ms - ms % WINDOW_MS), [0, 0.0])
        acc[0] += n
        acc[1] += amount * n
    windows = read_run(kafka_config, stages.windows_topic, stages.run_id)
    assert windows.ended, "the window stage's end of stream on every partition of its topic"
    topic_windows = Counter((r["key"], r["window_start"]) for r in windows.data)
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
