"""Cluster storage for real: Spark writes and reads Parquet, and keeps a streaming query's checkpoint, on a
local HDFS (Hadoop's minicluster) and on a local S3 endpoint (moto, through s3a); a two-worker standalone
cluster's executors on both workers write there in ``test_stage_chain_clusters.py``. Real processes
throughout (see ``tests/spark/conftest.py`` for the fixtures, ``storage_checks.py`` for what runs in Spark).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.processes import log_tail

from . import storage_checks
from .helpers import spark_conf_args

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_STREAM_ROWS = [[n * 100 + i, f"file-{n}"] for n in (1, 2, 3) for i in range(storage_checks.ROWS_PER_FILE)]


def run_driver(tmp_path: Path, check: str, master: str, base: str, conf: dict[str, str],
               timeout: float = 420.0) -> Any:
    """Run ``storage_checks`` as a Spark application of its own; its JSON result. Fails with the tail of its
    output when it fails."""
    result, log = tmp_path / "result.json", tmp_path / "driver.log"
    cmd = [sys.executable, "-m", "tests.spark.storage_checks", check, "--master", master, "--base", base,
           *spark_conf_args(conf), "--result", str(result)]
    with log.open("wb") as out:
        code = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                              check=False).returncode
    assert code == 0, f"{check} on {base} failed (exit code {code})" + log_tail(log)
    return json.loads(result.read_text())


def assert_parquet_and_checkpoint(result: dict[str, Any]) -> None:
    assert result["parquet"]["rows"] == 1000 and result["parquet"]["sum_twice"] == 999000
    assert len(result["parquet"]["files"]) == 4  # one per partition, listed on the cluster storage
    # Two input files, one per micro-batch; then a third: the second run knew from the checkpoint it read
    # back that batches 0 and 1 were done, and took the new file alone as batch 2.
    assert result["first_run"] == {"offsets": ["0", "1"], "commits": ["0", "1"]}
    assert result["second_run"] == {"offsets": ["0", "1", "2"], "commits": ["0", "1", "2"]}
    assert result["stream_rows"] == EXPECTED_STREAM_ROWS  # every row once
    assert {"offsets", "commits", "sources", "metadata"} <= set(result["checkpoint"])


def test_parquet_and_a_streaming_checkpoint_on_hdfs(spark: SparkSession, hdfs_dir: str) -> None:
    assert hdfs_dir.startswith("hdfs://127.0.0.1:")
    assert_parquet_and_checkpoint(storage_checks.parquet_and_checkpoint(spark, hdfs_dir))


def test_parquet_and_a_streaming_checkpoint_on_s3(s3a_conf: dict[str, str], s3_dir: str, tmp_path: Path) -> None:
    # spark.jars (hadoop-aws, the AWS SDK bundle) needs a JVM of its own: a driver in a subprocess.
    result = run_driver(tmp_path, "parquet-and-checkpoint", "local[2]", s3_dir, s3a_conf)
    assert_parquet_and_checkpoint(result)
