"""The pipeline CLI: three separate Spark applications, started downstream first, end by themselves with
the oracle's result; on local Spark, and the streaming chain on a Spark standalone cluster (master and worker
processes from the pyspark installation). The backfill chain on a standalone cluster runs in
``tests/test_docker_compose.py`` (its master and worker in containers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.standalone import Cluster, start_cluster, stop_cluster
from spark_jobs.common import topic_names

from .test_pipeline_oracle import SAMPLE, assert_matches_oracle
from .test_streaming_pipeline import check_late_and_windows, generated_source
from .topic_dump import dump_topic

pytestmark = pytest.mark.beside  # make test runs this module in its second lane (tests/lanes.py)

OPTS = ["--input", str(SAMPLE), "--key", "user", "--event-time", "event_time", "--window", "1h",
        "--sum", "amount", "--sum", "items", "--null-value", "NA"]


def run_cli(bootstrap_servers: str, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", *OPTS, "--output", str(output),
         "--bootstrap-servers", bootstrap_servers, "--partitions", "3", "--tasks", "2", "--timeout", "240",
         "--run-dir", str(output.parent / "run"), *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )


def check_output(spark: SparkSession, output: Path) -> None:
    assert_matches_oracle(spark, str(output), input_path=str(SAMPLE), key="user", event_time="event_time",
                          window="1h", sums=["amount", "items"], null_value="NA")


def test_pipeline_of_three_spark_applications(spark: SparkSession, bootstrap_servers: str, tmp_path: Path) -> None:
    output = tmp_path / "hourly.csv"
    done = run_cli(bootstrap_servers, output, "--master", "local[1]")
    assert done.returncode == 0, done.stderr[-3000:]
    check_output(spark, output)
    assert "rows in: 2400  rejects: 11" in done.stdout
    assert "end of stream reached the sink" in done.stdout
    assert "after the window job's last end of stream was written" in done.stdout
    summary = json.loads((tmp_path / "run" / "pipeline.json").read_text())
    assert summary["eos_last_hop_seconds"] >= 0
    # The downstream jobs one --nice-step (default 12) below ingest: the job the others wait for runs first.
    # The window job ends at 19, below the sink: the pipeline moved it there once its input had ended.
    base = os.nice(0)
    assert [summary["jobs"][job]["niceness"] for job in ("ingest", "window_aggregate", "sink")] \
        == [base, 19, min(19, base + 12)]
    if base + 12 < 19:
        assert "pipeline: window_aggregate's input ended: it goes down to nice 19" in done.stderr
    # Each record names its run in the envelope (runTag's default, wire format 2), and carries no header.
    for topic in topic_names(summary["run_id"]):
        wire = dump_topic({"bootstrap.servers": bootstrap_servers}, topic)
        data = [r for r in wire if r.kind == "data"]
        assert data and {(r.run, r.task, r.headers) for r in data} == {(summary["run_id"], None, ())}, topic
        assert any(r.kind == "eos" and r.task is not None for r in wire), topic  # control messages name theirs
    for job in ("ingest", "window_aggregate", "sink"):
        assert f" {job}: " in done.stderr  # each job's own log lines are echoed
        assert (tmp_path / "run" / f"{job}.log").stat().st_size > 0


def test_pipeline_reports_a_failing_job(bootstrap_servers: str, tmp_path: Path) -> None:
    def pipeline(source: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--input", str(source),
             "--key", "user", "--event-time", "ts", "--window", "1h", "--output", str(tmp_path / "o.csv"),
             "--bootstrap-servers", bootstrap_servers, "--master", "local[1]", "--timeout", "120",
             "--run-dir", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=400, check=False,
        )

    # Found before any Spark application starts: one line, exit 2.
    missing = pipeline(tmp_path / "missing.csv")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"pipeline: --input {tmp_path / 'missing.csv'}: no such file or directory"
    # Found only by the ingest job (a Parquet file that is not one): the others are stopped, exit 1.
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"not parquet at all")
    done = pipeline(corrupt)
    assert done.returncode == 1
    assert "job ingest failed" in done.stderr
    assert "corrupt.parquet" in done.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tmp_path_factory.mktemp("spark-cluster"), cores=6, memory="6g")
    try:
        yield started
    finally:
        stop_cluster(started)


def test_streaming_pipeline_on_standalone_cluster(spark: SparkSession, kafka_config: dict[str, Any],
                                                  bootstrap_servers: str, new_topic: Callable[..., str],
                                                  cluster: Cluster, tmp_path: Path) -> None:
    """The streaming chain (long-running tasks in executors of the cluster's worker), bounded by
    --until-source-end, over ten minutes of event time with 3% of the events ten minutes late: it ends by
    itself, the late events it met behind its watermark are in the late topic, the output equals the oracle
    over the others (:func:`~tests.spark.test_streaming_pipeline.check_late_and_windows`)."""
    source = new_topic(4, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=4000, keys=30, disorder_ms=5000, seed=8,
                              late_fraction=0.03, late_by_ms=600_000)
    output, run_dir, run_id = tmp_path / "windows.csv", tmp_path / "run", f"late-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--streaming", "--source-topic", source,
         "--until-source-end", "--key", "user", "--event-time", "event_time", "--window", "1m", "--sum", "amount",
         "--allowed-lateness", "10s", "--watermark-interval", "300ms", "--output", str(output),
         # paced (about 13 s), so the watermark moves while the input is read and late events meet it
         "--max-rate", "300",
         "--bootstrap-servers", bootstrap_servers, "--partitions", "3", "--tasks", "2",
         "--master", cluster.master_url, "--spark-conf", "spark.cores.max=2",
         "--spark-conf", "spark.executor.memory=1g", "--timeout", "300", "--run-id", run_id,
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = check_late_and_windows(spark, kafka_config, run_id=run_id, events=events, output=output,
                                  run_dir=run_dir, stdout=done.stdout)
    assert rows > 150
