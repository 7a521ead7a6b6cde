"""docker-compose.yml cannot be run here (no Docker engine on our machines). What can be checked is
checked: it parses, has the services the README names, and its ports and addresses agree with the
README and with the settings the protocol needs on a single broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_services_and_ports_agree_with_readme() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "spark-master", "spark-worker"}
    readme = (ROOT / "README.md").read_text()
    assert "9092:9092" in services["kafka"]["ports"] and "localhost:9092" in readme
    assert "7077:7077" in services["spark-master"]["ports"] and "spark://spark-master:7077" in readme
    assert "kafka:19092" in readme
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
