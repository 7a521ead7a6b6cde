"""The Structured Streaming stage chain where teams deploy it: a Spark standalone cluster of two workers,
its checkpoints on cluster storage (HDFS, and S3 for the window stage), its Parquet output on HDFS. Each
stage's ``controlmsg`` sink runs with ``stageProgress driver`` (the jobs choose it for a checkpoint that is
not a local path): the driver program writes the stage's watermark and end of stream from the query's
progress. ``kill -9`` of the ingest (checkpoint on HDFS; rescaled from 4 write tasks, more than its cores, to 2),
of the window stage (checkpoint on S3) and of the sink (HDFS) in the middle of their runs, each followed by the
same command again: the output equals the oracle, every window once, and the chain ends by itself. This is the
one run of the stage chain under kill -9 (the compose test runs it once more, in containers, without kills)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.hdfs import HdfsCluster
from controlmsg.clusters.standalone import start_cluster, stop_cluster

from .helpers import spark_conf_args
from .stage_chain import Stages, check_chain
from .test_streaming_pipeline import generated_source
from .test_streaming_restarts import wait_for_records

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

EVENTS = 4000


def test_the_stage_chain_on_a_two_worker_cluster_with_hdfs_and_s3_checkpoints_after_kill_9(
        spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str],
        hdfs: HdfsCluster, hdfs_dir: str, s3_dir: str, s3a_conf: dict[str, str], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    source = new_topic(4, prefix="raw")
    path = generated_source(kafka_config, source, tmp_path, events=EVENTS, keys=30, disorder_ms=5000, seed=31,
                            late_fraction=0.03, late_by_ms=600_000)
    events = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    # Three applications at once, one executor of two cores each (an executor JVM is most of an application's
    # start: two of one core each cost 12 executor starts over the test's six starts of an application): the
    # workers offer four cores each (two physical in all), so the third application fits beside the others.
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"), cores=4, memory="2g", workers=2)
    per_app = spark_conf_args({"spark.cores.max": "2", "spark.executor.cores": "2",
                               "spark.executor.memory": "768m"})
    # The S3A jars (690 MB) on the class path of the driver and of the executors, which read and write the
    # window stage's state there: as spark.jars, every executor would fetch its own copy from the driver.
    s3a = {key: value for key, value in s3a_conf.items() if key != "spark.jars"}
    s3a["spark.driver.extraClassPath"] = s3a["spark.executor.extraClassPath"] = s3a_conf["spark.jars"].replace(",", ":")
    storage = {"stage_ingest": f"{hdfs_dir}/ckpt-ingest", "stage_window": f"{s3_dir}/ckpt-window",
               "stage_sink": f"{hdfs_dir}/ckpt-sink", "output": f"{hdfs_dir}/windows.parquet"}
    stages = Stages(bootstrap_servers, source, tmp_path, storage=storage, master=cluster.master_url,
                    extra={"stage_ingest": per_app, "stage_sink": per_app,
                           "stage_window": per_app + spark_conf_args(s3a)})
    try:
        stages.start("stage_sink")
        stages.start("stage_window")
        stages.start("stage_ingest", "--tasks", "4")
        wait_for_records(kafka_config, stages.events_topic, stages.run_id, EVENTS // 4, timeout=420)
        stages.kill9("stage_ingest")
        stages.start("stage_ingest", "--tasks", "2")
        wait_for_records(kafka_config, stages.windows_topic, stages.run_id, 30, timeout=420)
        stages.kill9("stage_window")
        stages.start("stage_window")
        stages.wait_for_commit(spark, "stage_sink")
        stages.kill9("stage_sink")  # its checkpoint on HDFS, its output file too
        stages.start("stage_sink")
        stages.wait(900)
        # Executors ran on both workers: three applications of one two-core executor on two workers of four cores.
        assert all(list(Path(d).glob("app-*/*/stderr")) for d in cluster.worker_dirs), cluster.worker_dirs
    finally:
        stages.close()
        stop_cluster(cluster)
    check_chain(spark, kafka_config, stages, events)
    assert stages.output.startswith(hdfs.uri)
