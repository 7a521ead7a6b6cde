"""docker-compose.yml, checked and run.

Checked: it parses, has the services docs/DOCKER.md names, its ports and addresses agree with that page, its
brokers' settings are the ones ``controlmsg broker start`` (one node) and ``--brokers 3`` (profile "cluster")
start their brokers with, read from the same code (``controlmsg.clusters.kraft``), and the Spark image's
pyspark is the one the project is tested with.

Run: the images are built by :mod:`controlmsg.clusters.images` (at once when unchanged), testcontainers'
``DockerCompose`` brings up Kafka, the Spark master and the worker under a project name of their own, and the
backfill pipeline runs inside the compose network (driver in the master's container, executors in the
worker's) against the containers' Kafka. It must end by itself with the rows of the oracle (one plain
Spark batch query over the input, on local Spark). No Docker engine, no compose v2 or a failed build is an error
of these tests, never a skip (``.ci/run`` starts an engine first).
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# make test runs this module in its second lane (tests/lanes.py): its work is in the containers, which the
# engine schedules as one group, and its bounds are minutes (PIPELINE_TIMEOUT, the health checks' 120 s).
pytestmark = pytest.mark.beside

SPARK_SERVICES = ("kafka", "spark-master", "spark-worker")


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_services_and_ports_agree_with_the_docker_page() -> None:
    services = compose()["services"]
    page = (ROOT / "docs" / "DOCKER.md").read_text()
    assert "(docs/DOCKER.md)" in (ROOT / "README.md").read_text()  # the README sends Docker users there
    assert set(services) == {"kafka", "kafka-1", "kafka-2", "kafka-3", "spark-master", "spark-worker"}
    assert all(services[f"kafka-{i}"]["profiles"] == ["cluster"] for i in (1, 2, 3))
    assert "docker compose --profile cluster up -d kafka-1 kafka-2 kafka-3" in page
    assert [services[f"kafka-{i}"]["ports"] for i in (1, 2, 3)] == [[f"{p}:{p}"] for p in (9192, 9193, 9194)]
    assert services["kafka"]["ports"] == ["${CONTROLMSG_KAFKA_PORT:-9092}:9092"] and "localhost:9092" in page
    assert "${CONTROLMSG_SPARK_MASTER_PORT:-7077}:7077" in services["spark-master"]["ports"]
    assert "spark://spark-master:7077" in page and "kafka:19092" in page
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    assert "python -m controlmsg.clusters.images" in page  # how the images are made


def test_kafka_is_single_node_kraft_with_host_and_container_listeners() -> None:
    env = compose()["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "HOST://localhost:${CONTROLMSG_KAFKA_PORT:-9092},DOCKER://kafka:19092"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert env[key] == 1, key  # transactions (the Spark writer's) need these on one broker
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_images_are_the_built_ones_and_match_the_clients() -> None:
    import pyspark

    from controlmsg.clusters import images
    from controlmsg.clusters.kafka_jars import KAFKA_VERSION

    services = compose()["services"]
    assert {services[name]["image"] for name in ("kafka", "kafka-1", "kafka-2", "kafka-3")} == {images.KAFKA_IMAGE}
    assert images.KAFKA_IMAGE.endswith(f":{KAFKA_VERSION}")
    for name in ("spark-master", "spark-worker"):
        assert services[name]["image"] == images.SPARK_IMAGE
        assert services[name]["build"]["dockerfile"] == "docker/spark/Dockerfile"
    pinned = (ROOT / "docker" / "spark" / "requirements.txt").read_text().splitlines()
    assert f"pyspark=={pyspark.__version__}" in pinned
    assert images.SPARK_IMAGE.endswith(f":{pyspark.__version__}")


def test_the_spark_image_pins_every_dependency_of_the_project() -> None:
    """The image installs the project with --no-deps: each of its dependencies (and the spark extra's) must be
    pinned in requirements.txt, or the image's Python cannot import it (a dependency added to pyproject.toml
    alone broke the image's build once)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["spark"]]
    names = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in wanted}
    pinned = {line.split("==")[0].lower() for line in
              (ROOT / "docker" / "spark" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert names <= pinned, f"not pinned in docker/spark/requirements.txt: {sorted(names - pinned)}"


# What differs from node to node, or between Docker and a local process, is not compared.
_PER_NODE = {"node.id", "controller.quorum.voters", "listeners", "advertised.listeners", "controller.listener.names",
             "listener.security.protocol.map", "inter.broker.listener.name", "log.dirs"}


def _local_settings(brokers: int, tmp_path: Path) -> dict[str, str]:
    """The settings a local broker of a ``brokers``-node cluster is started with, as Kafka property names."""
    from controlmsg.clusters import kraft

    text = kraft.server_properties(tmp_path, 9093, kraft.plain_listeners(9092, 9093), brokers=brokers)
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs if k not in _PER_NODE}


def _compose_settings(env: dict[str, Any]) -> dict[str, str]:
    """A compose service's KAFKA_* environment as Kafka property names (docker/kafka/start-kafka's rule, the
    apache/kafka image's)."""
    out = {}
    for key, value in env.items():
        if key.startswith("KAFKA_"):
            name = key[len("KAFKA_"):].lower().replace("_", ".")
            if name not in _PER_NODE:
                out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def test_single_broker_settings_are_the_local_brokers(tmp_path: Path) -> None:
    assert _compose_settings(compose()["services"]["kafka"]["environment"]) == _local_settings(1, tmp_path)


def test_cluster_profile_settings_are_the_local_clusters(tmp_path: Path) -> None:
    import base64

    services = compose()["services"]
    want = _local_settings(3, tmp_path)
    assert want["default.replication.factor"] == "3" and want["min.insync.replicas"] == "2"
    voters = "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
    for i in (1, 2, 3):
        env = services[f"kafka-{i}"]["environment"]
        assert _compose_settings(env) == want, f"kafka-{i}"
        assert env["KAFKA_NODE_ID"] == i and env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == voters
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"HOST://localhost:{9191 + i},DOCKER://kafka-{i}:19092"
        cluster_id = env["CLUSTER_ID"]
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16  # what Kafka accepts as a cluster id


# ----------------------------------------------------------------------------------------- run for real

PIPELINE = ["-m", "spark_jobs.pipeline", "windowed-count", "--key", "user", "--event-time", "event_time",
            "--window", "1h", "--sum", "amount", "--sum", "items", "--null-value", "NA",
            "--partitions", "3", "--tasks", "2", "--timeout", "480"]
PIPELINE_TIMEOUT = 540.0  # under a load average of 50 from other suites, the local run alone took over 420 s


class Cluster:
    """The compose cluster of one test module: its ``DockerCompose``, the host directory mounted at ``/data``
    in the Spark containers, and the containers' Kafka as the host reaches it."""

    def __init__(self, compose: Any, data: Path, kafka_port: int) -> None:
        self.compose = compose
        self.data = data
        self.bootstrap_servers = f"localhost:{kafka_port}"  # the HOST listener, published on the host

    def run(self, service: str, *command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """``docker compose exec -T service command``; blocks until it exits, raises on ``timeout``."""
        return subprocess.run(self.exec_command(service, *command), cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def exec_command(self, service: str, *command: str) -> list[str]:
        return [*self.compose.docker_compose_command(), "exec", "-T", service, *command]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from testcontainers.compose import DockerCompose

    from controlmsg.clusters.images import build_images
    from controlmsg.clusters.processes import free_ports

    build_images()  # at once when the images are there and their inputs unchanged
    data = tmp_path_factory.mktemp("compose-data")
    first = free_ports(4)
    ports = [first + i for i in range(4)]
    env_file = tmp_path_factory.mktemp("compose-env") / "compose.env"
    # A project of its own (not the checkout's name, which a user's `docker compose up` uses) on free ports.
    env_file.write_text(
        f"COMPOSE_PROJECT_NAME=controlmsg-test-{uuid.uuid4().hex[:8]}\n"
        f"CONTROLMSG_DATA_DIR={data}\n"
        f"CONTROLMSG_KAFKA_PORT={ports[0]}\nCONTROLMSG_SPARK_MASTER_PORT={ports[1]}\n"
        f"CONTROLMSG_SPARK_UI_PORT={ports[2]}\nCONTROLMSG_SPARK_WORKER_UI_PORT={ports[3]}\n")
    stack = DockerCompose(ROOT, env_file=str(env_file), services=list(SPARK_SERVICES), wait=True)
    started = time.monotonic()
    with stack:
        print(f"compose up --wait: {time.monotonic() - started:.1f} s")
        yield Cluster(stack, data, ports[0])


def test_pipeline_on_the_compose_cluster_equals_the_oracle(cluster: Cluster) -> None:
    """The three Spark applications of the backfill pipeline, on the compose cluster against its Kafka, end by
    themselves with the rows of the oracle every pipeline test compares with: the input read, rejected and
    windowed in plain Python (``tests.oracles.windowed_counts``, no code shared with ``spark_jobs``)."""
    from pyspark import SparkContext

    from controlmsg.spark import spark_session
    from tests.spark.test_pipeline_oracle import assert_matches_oracle

    started = time.monotonic()
    done = cluster.run("spark-master", "python3", *PIPELINE, "--input", "/opt/controlmsg/examples/clicks.csv",
                       "--output", "/data/hourly.csv", "--bootstrap-servers", "kafka:19092",
                       "--master", "spark://spark-master:7077", "--spark-conf", "spark.cores.max=2",
                       "--spark-conf", "spark.executor.memory=1g", "--run-dir", "/data/run", timeout=PIPELINE_TIMEOUT)
    print(f"pipeline on the compose cluster {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "rows in: 2400  rejects: 11" in done.stdout
    assert "end of stream reached the sink" in done.stdout
    # The work ran in executors that the worker container launched, one application per job.
    work = cluster.run("spark-worker", "bash", "-c", "ls -d /opt/spark/work/app-*/*", timeout=60)
    assert work.returncode == 0, work.stderr
    assert len({line.split("/")[4] for line in work.stdout.split()}) == 3, work.stdout
    # The JVMs there ran with the tests' JAVA_TOOL_OPTIONS, passed through by the compose file.
    from tests.conftest import TEST_JVM_OPTIONS

    for service in ("spark-master", "spark-worker"):
        passed = cluster.run(service, "printenv", "JAVA_TOOL_OPTIONS", timeout=60)
        assert TEST_JVM_OPTIONS in passed.stdout, (service, passed.stdout, passed.stderr)

    ours = SparkContext._active_spark_context is None  # else the Spark tests' session, left running
    spark = spark_session("local[2]")
    try:
        # Sums of doubles: the cluster adds in another order than the oracle; the comparison is rounded.
        rows = assert_matches_oracle(spark, str(cluster.data / "hourly.csv"),
                                     input_path=str(ROOT / "examples" / "clicks.csv"), key="user",
                                     event_time="event_time", window="1h", sums=["amount", "items"],
                                     null_value="NA")
    finally:
        if ours:
            spark.stop()
    assert rows > 100


def test_compose_runs_on_this_engine() -> None:
    """The engine the compose test ran on answers, and `docker compose` is v2 (testcontainers needs `up --wait`
    and `ps --format json`)."""
    version = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True,
                             timeout=60, check=False)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip().lstrip("v").split(".")[0] == "2", version.stdout
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert info.returncode == 0 and info.stdout.strip(), info.stderr


STAGE_EVENTS = 3000
STAGE_WINDOW_MS = 60_000


def _source_events(servers: str, topic: str, ends: dict[str, int]) -> list[dict[str, Any]]:
    """Every record of ``topic`` up to the end offsets ``ends`` (partition -> offset), decoded."""
    import orjson
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"dump-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, int(p), 0) for p in ends])
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(got) < sum(ends.values()):
            assert time.monotonic() < deadline, f"{topic}: {len(got)} of {sum(ends.values())} records"
            got += [orjson.loads(m.value() or b"") for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return got


def test_streaming_stages_on_the_compose_cluster_end_by_themselves(cluster: Cluster) -> None:
    """The three Structured Streaming stages (ingest, window, sink), each its own application on the compose
    cluster, with their checkpoints and the sink's Parquet under ``/data`` (the directory the master's and
    the worker's containers share): they end by themselves at the generated source's end, with every window
    of the source's events once (no event is late: the disorder, 5 s, is within the allowed lateness)."""
    import orjson
    import pyarrow.parquet as pq

    run_id = f"compose-{uuid.uuid4().hex[:8]}"
    source, events_topic, windows_topic = f"{run_id}-raw", f"{run_id}-events", f"{run_id}-windows"
    kafka = ["--bootstrap-servers", "kafka:19092"]
    made = cluster.run("spark-master", "python3", "-m", "spark_jobs.generate", "--topic", source, *kafka,
                       "--partitions", "2", "--events", str(STAGE_EVENTS), "--rate", "1000000", "--keys", "30",
                       "--disorder", "5s", "--start", "2026-01-01T00:00:00Z", "--speedup", "100000",
                       "--seed", "7", timeout=120)
    assert made.returncode == 0, made.stderr[-3000:]
    events = _source_events(cluster.bootstrap_servers, source, orjson.loads(made.stdout)["endOffsets"])

    common = [*kafka, "--run-id", run_id, "--master", "spark://spark-master:7077", "--timeout", "300",
              "--spark-conf", "spark.cores.max=2", "--spark-conf", "spark.executor.memory=1g"]
    stages = {
        "stage_sink": ["--input-topic", windows_topic, "--output", "/data/windows.parquet", "--sum", "amount"],
        "stage_window": ["--input-topic", events_topic, "--output-topic", windows_topic, "--window", "1m",
                         "--sum", "amount", "--partitions", "2"],
        "stage_ingest": ["--source-topic", source, "--topic", events_topic, "--key", "user",
                         "--event-time", "event_time", "--carry", "amount", "--allowed-lateness", "10s",
                         "--partitions", "2", "--until-source-end"],
    }
    started = time.monotonic()
    running = {
        job: subprocess.Popen(
            cluster.exec_command("spark-master", "python3", "-m", f"spark_jobs.stages.{job.removeprefix('stage_')}",
                                 *args, *common,
                                 "--checkpoint", f"/data/ckpt-{job}", "--summary", f"/data/{job}.json"),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for job, args in stages.items()  # downstream first: each waits for its upstream
    }
    logs = {}
    try:
        for job, process in running.items():
            logs[job], _ = process.communicate(timeout=max(1.0, PIPELINE_TIMEOUT - (time.monotonic() - started)))
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
    print(f"streaming stages on the compose cluster: {time.monotonic() - started:.1f} s")
    for job, process in running.items():
        assert process.returncode == 0, f"{job}:\n{logs[job][-3000:]}"

    want: dict[tuple[str, int], list[float]] = {}
    for event in events:
        ms = int(datetime.fromisoformat(event["event_time"].replace("Z", "+00:00")).timestamp() * 1000)
        acc = want.setdefault((event["user"], ms - ms % STAGE_WINDOW_MS), [0, 0.0])
        acc[0] += 1
        acc[1] += event["amount"]
    rows = pq.read_table(cluster.data / "windows.parquet").to_pylist()
    got = {(r["key"], r["window_start"]): r for r in rows}
    assert len(got) == len(rows), "every window once"
    assert set(got) == set(want)
    for window, (count, total) in want.items():
        assert got[window]["count"] == count, window
        assert abs(got[window]["sum_amount"] - total) <= 1e-9 * max(1.0, abs(total)), window
    # The queries' progress is in the shared checkpoints; each stage says it ended.
    assert any((cluster.data / "ckpt-stage_window" / "windows" / "commits").iterdir())
    assert orjson.loads((cluster.data / "stage_ingest.json").read_bytes())["ended"]
    window_summary = orjson.loads((cluster.data / "stage_window.json").read_bytes())
    assert window_summary["windows"]["ended"] and window_summary["late"]["ended"]
