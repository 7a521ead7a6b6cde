"""Spark fixtures: one local SparkSession for the whole run (starting the JVM takes seconds).

``local[2,3]``: two cores, and up to three attempts per task, so the retry tests can fail a first
attempt; a reader that times out is also tried three times (kept short in the tests). The Kafka
fixtures (``kafka_config``, ``bootstrap_servers``, ``new_topic``) come from ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from controlmsg.spark import spark_session

MASTER = "local[2,3]"
MAX_ATTEMPTS = 3


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session(
        MASTER,
        app_name="controlmsg-tests",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
