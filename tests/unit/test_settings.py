"""Where the Kafka cluster is (controlmsg.kafka.settings): the given address, then the environment, then
the local broker; a clear error when there is none. No broker is started here."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlmsg.errors import BrokerError
from controlmsg.kafka import resolve_bootstrap_servers


@pytest.fixture
def no_local_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $KAFKA_BOOTSTRAP_SERVERS, and the local broker's directory is an empty one."""
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.setenv("CONTROLMSG_BROKER_DIR", str(tmp_path))
    return tmp_path


def test_the_given_address_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    assert resolve_bootstrap_servers("given:9092") == "given:9092"
    assert resolve_bootstrap_servers(" given:9092 ", start_local=True) == "given:9092"


@pytest.mark.parametrize("given", [None, "", "  "])
def test_then_the_environment(monkeypatch: pytest.MonkeyPatch, given: str | None) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", " a:1,b:2 ")
    assert resolve_bootstrap_servers(given) == "a:1,b:2"


def test_no_broker_says_how_to_get_one(no_local_broker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "   ")  # blank counts as unset
    with pytest.raises(BrokerError) as info:
        resolve_bootstrap_servers()
    message = str(info.value)
    assert "controlmsg broker start" in message
    assert "KAFKA_BOOTSTRAP_SERVERS" in message
    assert str(no_local_broker) in message
