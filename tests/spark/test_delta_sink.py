"""The sink stage writing to Delta (``spark_jobs.stages.sink --format delta``, delta-spark 4.4.0 on pyspark
4.2.0): exactly once across a ``kill -9`` and a restart, and the stage ends by itself at the end of stream.

Upstream tasks write the window results in two parts. The stage is killed (its whole process group) once its
first micro-batch committed, restarted with the same command, and only then do the tasks write the rest and
their end of stream. The oracle reads the table without Spark or Delta: it replays the ``add`` and ``remove``
actions of the ``_delta_log`` JSON commits and reads the live Parquet files with pyarrow.

pyspark 4.2.0 only (marker ``spark42``, run by ``make test-spark42``): Delta's jars for Spark 4.3 do not
exist."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest

from controlmsg.clusters.job_group import JobGroup
from controlmsg.kafka import ControlWriter
from tests.spark.jobs import kill9, wait_all_ok
from tests.spark.spark42_jars import DELTA_JARS, DELTA_SESSION_CONF, spark_jars

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.spark42]

TASKS = 2
WINDOW_MS = 60_000
T0 = 1_767_225_600_000
Row = tuple[str, int, int, int, float]


def window_rows(task: int, part: int) -> list[Row]:
    """What task ``task`` writes in part ``part`` (0 or 1): distinct windows of ``key, start, end, count, sum``."""
    rows = []
    for i in range(40):
        start = T0 + (part * 40 + i) * WINDOW_MS
        rows.append((f"k{task}-{i % 5}", start, start + WINDOW_MS, i + 1, i * 1.5 + task))
    return rows


def delta_rows(table: Path) -> Counter[Row]:
    """The rows of the Delta table at ``table``: its log's live files (``add`` minus ``remove``), read with
    pyarrow. Fails when the log has no commit."""
    commits = sorted((table / "_delta_log").glob("*.json"))
    assert commits, f"no Delta commit in {table}/_delta_log"
    live: set[str] = set()
    for commit in commits:
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(unquote(action["add"]["path"]))
            elif "remove" in action:
                live.discard(unquote(action["remove"]["path"]))
    rows: Counter[Row] = Counter()
    for name in live:
        for r in pq.read_table(table / name).to_pylist():
            rows[(r["key"], r["window_start"], r["window_end"], r["count"], r["sum_amount"])] += 1
    return rows


def test_the_sink_stage_writes_delta_exactly_once_across_a_kill(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    topic = new_topic(2)
    run_id = "delta-r1"
    writers = [ControlWriter(kafka_config, topic, task_name=f"t{t}", task_count=TASKS, run_id=run_id)
               for t in range(TASKS)]
    expected: Counter[Row] = Counter()

    def write_part(part: int) -> None:
        for task, writer in enumerate(writers):
            for row in window_rows(task, part):
                key, start, end, count, total = row
                writer.send({"key": key, "window_start": start, "window_end": end, "count": count,
                             "sum_amount": total}, key=key)
                expected[row] += 1
            writer.send_watermark(T0 + (part + 1) * 40 * WINDOW_MS)
            writer.flush()

    table, checkpoint = tmp_path / "windows.delta", tmp_path / "ckpt-sink"
    # Delta rebuilds a table's state with a shuffle of 50 partitions by default, and after each commit a
    # checksum file with another Spark job: on two cores, seconds each time. Neither changes what is written.
    conf = {"spark.jars": spark_jars(DELTA_JARS), **DELTA_SESSION_CONF,
            "spark.databricks.delta.snapshotPartitions": "2", "spark.sql.shuffle.partitions": "2",
            "spark.databricks.delta.writeChecksumFile.enabled": "false"}
    command = [sys.executable, "-m", "spark_jobs.stages.sink", "--input-topic", topic, "--output", str(table),
               "--format", "delta", "--sum", "amount", "--checkpoint", str(checkpoint), "--run-id", run_id,
               "--master", "local[2]", "--bootstrap-servers", bootstrap_servers,
               *[arg for key, value in conf.items() for arg in ("--spark-conf", f"{key}={value}")]]
    jobs = JobGroup(tmp_path)
    try:
        write_part(0)
        jobs.start("sink", command)
        first = checkpoint / "commits" / "0"
        codes = jobs.wait(240, stop_when=first.exists)
        assert codes == {"sink": None}, f"the sink runs until the end of stream:\n{jobs['sink'].tail()}"
        assert first.exists(), f"no first micro-batch committed in 240 s:\n{jobs['sink'].tail()}"
        assert delta_rows(table), "the first micro-batch is in the table before the kill"
        kill9(jobs, "sink")
        jobs.start("sink", command)
        write_part(1)
        for writer in writers:
            writer.send_end_of_stream()
            writer.flush()
        wait_all_ok(jobs, 240)  # exit 0: it ended by itself at the end of stream
    finally:
        jobs.close()
        for writer in writers:
            writer.close()
    got = delta_rows(table)
    assert max(got.values()) == 1, "every window once, across the kill"
    assert got == expected
