"""The first run on a freshly started broker: its group and transaction coordinators are still loading
(NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) when the first marker lookup and transaction come. These
are retried, not failures. The broker is this test's own, started here, so it is fresh every time."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from controlmsg.clusters.processes import free_ports
from controlmsg.core.messages import EndOfStreamMessage
from controlmsg.kafka import ControlReader, create_topic
from controlmsg.kafka.markers import MarkerStore, write_control_round

pytestmark = pytest.mark.kafka


def test_markers_and_transactions_right_after_the_broker_starts(tmp_path: Path) -> None:
    from controlmsg.clusters.broker import start_broker, stop_broker

    handle = start_broker(port=free_ports(), data_dir=tmp_path / "kafka")
    try:
        config = {"bootstrap.servers": handle.bootstrap_servers}
        create_topic(config, "fresh", 2)
        # Records stamped in the past stay: Kafka's 7-day default deleted a test's 2026-01-01 records mid-run.
        topic = ConfigResource(ConfigResource.Type.TOPIC, "fresh")
        admin = AdminClient(dict(config))
        described = admin.describe_configs([topic])[topic].result(timeout=30)
        assert described["retention.ms"].value == "-1"
        with MarkerStore(config, "controlmsg-fresh-group", "fresh") as store:
            assert store.load() is None  # the first lookup of a group: the coordinator is still loading
        ends = [EndOfStreamMessage(f"t-r-p{i}", 2, "r") for i in range(2)]
        assert write_control_round(config, "fresh", 2, lambda committed: (ends, {"ended": True}),
                                   transactional_id="controlmsg-fresh-driver") is None
        with MarkerStore(config, "controlmsg-fresh-driver", "fresh") as store:
            assert store.load() == {"ended": True}
        with ControlReader(config, "fresh", run_id="r") as reader:
            list(reader.read_until_end(timeout=30))
            assert reader.tracker.is_ended
    finally:
        stop_broker(tmp_path / "kafka")
