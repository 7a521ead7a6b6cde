"""Cluster storage for real: Spark writes and reads Parquet, and keeps a streaming query's checkpoint, on a
local HDFS (Hadoop's minicluster) and on a local S3 endpoint (moto, through s3a); a two-worker standalone
cluster writes to that HDFS from both workers. Real processes throughout (see ``tests/spark/conftest.py``
for the fixtures, ``storage_checks.py`` for what runs in Spark).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.hdfs import HdfsCluster
from controlmsg.clusters.processes import log_tail
from controlmsg.clusters.standalone import start_cluster, stop_cluster

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


def _master_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/json/", timeout=10) as response:
        found: dict[str, Any] = json.loads(response.read())
    return found


def test_a_two_worker_standalone_cluster_writes_to_hdfs(
        hdfs: HdfsCluster, hdfs_dir: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path_factory.mktemp("spark-2-workers"), cores=1, memory="1g", workers=2)
    try:
        assert _master_json(cluster.master_web_url)["aliveworkers"] == 2
        conf = {"spark.cores.max": "2", "spark.executor.cores": "1", "spark.executor.memory": "512m",
                # Start no task before both executors are there, so each worker's executor gets some.
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s"}
        result = run_driver(tmp_path, "executor-dirs", cluster.master_url, hdfs_dir, conf)
        app_id = result["app_id"]
        # Each Python worker ran in its executor's directory, <worker work dir>/<app id>/<executor id>.
        dirs = [Path(d) for d in result["dirs"]]
        assert len(dirs) == 2, f"the tasks ran in {dirs}, not in one executor on each worker"
        assert {d.parent.name for d in dirs} == {app_id}
        assert sorted(d.parent.parent for d in dirs) == sorted(cluster.worker_dirs)
        deadline = time.monotonic() + 30
        while app_id not in {app["id"] for app in _master_json(cluster.master_web_url)["completedapps"]}:
            assert time.monotonic() < deadline, f"the master does not list {app_id} as completed"
            time.sleep(0.5)
    finally:
        stop_cluster(cluster)
