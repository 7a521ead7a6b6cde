"""Spark fixtures. The session's one local SparkSession (``spark``, ``local[2,3]``) and the Kafka
fixtures (``kafka_config``, ``bootstrap_servers``, ``new_topic``) come from ``tests/conftest.py``.

Cluster storage, for checkpoints that live where a cluster's would: ``hdfs`` (a session's local HDFS) and
``hdfs_dir`` (a fresh ``hdfs://`` directory per test); ``s3`` (a session's moto endpoint with the bucket
``S3_BUCKET``), ``s3_dir`` (a fresh ``s3a://`` directory per test) and ``s3a_conf`` (the Spark settings a
new application needs for it; ``helpers.spark_conf_args`` turns them into a ``spark_jobs`` command's
``--spark-conf`` arguments).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from controlmsg.clusters.hdfs import HdfsCluster, start_hdfs, stop_hdfs
from controlmsg.clusters.s3 import S3Endpoint, create_bucket, s3a_spark_conf, start_s3, stop_s3

S3_BUCKET = "controlmsg-tests"


# ------------------------------------------------------------------------------------- cluster storage
# A stage's checkpoint on a cluster lives on HDFS or S3, never on the driver's disk. One HDFS and one S3
# endpoint per test session, started when a test first asks; if one cannot start, every test that uses it
# errors with the tail of its log (nothing is skipped).


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    """A local HDFS for the session (:mod:`controlmsg.clusters.hdfs`): ``hdfs.uri`` is
    ``hdfs://127.0.0.1:PORT``; any Spark session reaches it without settings."""
    directory = tmp_path_factory.mktemp("hdfs")
    cluster = start_hdfs(directory)
    try:
        yield cluster
    finally:
        stop_hdfs(directory)


@pytest.fixture
def hdfs_dir(hdfs: HdfsCluster, request: pytest.FixtureRequest) -> str:
    """A fresh directory URI on the session's HDFS, named after the test (not created): for a checkpoint
    location, ``f"{hdfs_dir}/checkpoint"``, or a table."""
    return hdfs.path("tests", _unique(request.node.name))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """A local S3 endpoint (moto's server) for the session, with the bucket :data:`S3_BUCKET`."""
    directory = tmp_path_factory.mktemp("s3")
    endpoint = start_s3(directory)
    try:
        create_bucket(endpoint, S3_BUCKET)
        yield endpoint
    finally:
        stop_s3(directory)


@pytest.fixture(scope="session")
def s3a_conf(s3: S3Endpoint) -> dict[str, str]:
    """The Spark settings for ``s3a://`` on the session's endpoint (``spark.jars`` with hadoop-aws and the
    AWS SDK bundle, fetched once into the cache, and ``spark.hadoop.fs.s3a.*``). They need a Spark
    application of their own: give them to a driver started in a subprocess, not to :func:`spark`."""
    return s3a_spark_conf(s3)


@pytest.fixture
def s3_dir(s3: S3Endpoint, request: pytest.FixtureRequest) -> str:
    """A fresh directory URI in the session's bucket, ``s3a://<bucket>/tests/<test>-<random>``."""
    return f"s3a://{S3_BUCKET}/tests/{_unique(request.node.name)}"


def _unique(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:80]
    return f"{safe}-{uuid.uuid4().hex[:8]}"
