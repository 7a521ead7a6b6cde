"""docker-compose.yml cannot be run here (no Docker engine on our machines). What can be checked is
checked: it parses, has the services docs/DOCKER.md names, its ports and addresses agree with that page, and
its brokers' settings are the ones ``controlmsg broker start`` (one node) and ``--brokers 3`` (profile
"cluster") start their brokers with, read from the same code (``controlmsg.clusters.broker``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


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
    assert "9092:9092" in services["kafka"]["ports"] and "localhost:9092" in page
    assert "7077:7077" in services["spark-master"]["ports"] and "spark://spark-master:7077" in page
    assert "kafka:19092" in page
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]


def test_kafka_is_single_node_kraft_with_host_and_container_listeners() -> None:
    env = compose()["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "HOST://localhost:9092,DOCKER://kafka:19092"
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"):
        assert env[key] == 1, key  # transactions (the Spark writer's) need these on one broker
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_spark_images_match_the_pyspark_client() -> None:
    import pyspark

    major_minor = ".".join(pyspark.__version__.split(".")[:2])
    for name in ("spark-master", "spark-worker"):
        image = compose()["services"][name]["image"]
        assert f":-{major_minor}." in image, (image, pyspark.__version__)


# What differs from node to node, or between Docker and a local process, is not compared.
_PER_NODE = {"node.id", "controller.quorum.voters", "listeners", "advertised.listeners", "controller.listener.names",
             "listener.security.protocol.map", "inter.broker.listener.name", "log.dirs"}


def _local_settings(brokers: int, tmp_path: Path) -> dict[str, str]:
    """The settings a local broker of a ``brokers``-node cluster is started with, as Kafka property names."""
    from controlmsg.clusters import broker

    listeners = broker._PLAIN_LISTENERS.format(host="127.0.0.1", port=9092, controller_port=9093)
    text = broker._server_properties(tmp_path, 9093, listeners, brokers=brokers)
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs if k not in _PER_NODE}


def _compose_settings(env: dict[str, Any]) -> dict[str, str]:
    """A compose service's KAFKA_* environment as Kafka property names (the apache/kafka image's rule)."""
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
