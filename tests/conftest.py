"""Shared fixtures. Integration tests talk to a real Kafka broker:

* ``KAFKA_BOOTSTRAP_SERVERS`` set: that cluster;
* otherwise: a single-node KRaft broker from Apache Kafka's Maven Central artifacts, started once for the
  test session on a free port in a temporary directory, and stopped at the end.

If the broker cannot start, every test that needs it **errors** (the fixture raises); nothing is skipped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from controlmsg.clusters.processes import free_ports

pytest_plugins = ["tests.machine_load"]

TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""What every JVM the tests start gets (the brokers, HDFS, Spark's drivers, masters, workers and executors, the
Connect server): they inherit ``JAVA_TOOL_OPTIONS`` from this process. The suite's JVMs live seconds to
minutes on two cores, where the C2 compiler's and G1's threads cost more than they return: measured on the
stage chain of two workers, 358 s with Java's defaults, 200 s with these (docs/DEVELOPMENT.md). Only the
compiler and the collector change, never what the code does; the benchmarks run with Java's defaults."""
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # .ci/run sets them for its broker too
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()

os.environ["CONTROLMSG_TEST_PYSPARK_FROM_PACKAGE"] = "1"
"""Read by ``tests/pyspark_from_package.pth``, which ``make setup`` puts into the venv: every Python process the
tests start (Spark's Python daemons and workers above all, which Spark starts with ``pyspark.zip`` first on
their path) imports pyspark from the installed package, whose bytecode is cached, instead of compiling it
from the zip again (zipimport keeps no bytecode): 0.19 s of CPU instead of 0.92-1.06 s for each of the
half-dozen daemons of every Spark driver and executor (docs/DEVELOPMENT.md). The same code either way: pip's
pyspark builds the zip from the package's sources. The benchmarks run without it."""

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def bootstrap_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a real broker for this test session."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    from controlmsg.clusters.broker import start_broker, stop_broker

    data_dir: Path = tmp_path_factory.mktemp("kafka")
    handle = start_broker(port=free_ports(), data_dir=data_dir)
    try:
        yield handle.bootstrap_servers
    finally:
        stop_broker(data_dir)


@pytest.fixture(scope="session")
def kafka_config(bootstrap_servers: str) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap_servers}


@pytest.fixture
def new_topic(kafka_config: dict[str, Any], request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory: ``new_topic(partitions)`` creates a fresh topic named after the test and returns its name."""
    from controlmsg.kafka.admin import create_topic

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        base = prefix or request.node.name
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in base)[:80]
        name = f"{safe}-{uuid.uuid4().hex[:8]}"
        create_topic(kafka_config, name, partitions)
        return name

    return make


MASTER = "local[2,3]"
MAX_ATTEMPTS = 3


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """One local SparkSession for the whole run (starting a JVM takes seconds), made when a test first asks.

    ``local[2,3]``: two cores, and up to three attempts per task, so the retry tests can fail a first attempt; a
    reader that times out is also tried three times (kept short in the tests). Its ``spark.jars`` are the jar
    sets that the ``spark42(...)`` markers of the selected tests name (``tests/spark/spark42_jars.py``),
    fetched once into the cache; none in the main suite, which deselects those tests."""
    from controlmsg.spark import spark_session

    conf = {
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
    }
    wanted = sorted({name for item in request.session.items for mark in item.iter_markers("spark42")
                     for name in mark.args})
    if wanted:
        from tests.spark.spark42_jars import SETS, spark_jars

        unknown = [name for name in wanted if name not in SETS]
        assert not unknown, f"spark42 markers name unknown jar sets {unknown}: expected some of {sorted(SETS)}"
        conf["spark.jars"] = spark_jars(*(SETS[name] for name in wanted))
    session = spark_session(MASTER, app_name="controlmsg-tests", conf=conf)
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
