"""Where the Kafka cluster is (controlmsg.kafka.settings): the given address, then the environment, then
the caller's fallback (the local broker's, controlmsg.clusters.local_address); a clear error when there is
none. No broker is started here."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.errors import BrokerError, ConfigError
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
    asked: list[str] = []

    def fallback() -> str:
        asked.append("asked")
        return "fallback:1"

    assert resolve_bootstrap_servers(" given:9092 ", default_servers=fallback) == "given:9092"
    assert not asked  # the fallback is asked only when nothing else gives an address


@pytest.mark.parametrize("given", [None, "", "  "])
def test_then_the_environment(monkeypatch: pytest.MonkeyPatch, given: str | None) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", " a:1,b:2 ")
    assert resolve_bootstrap_servers(given) == "a:1,b:2"


def test_then_the_callers_fallback(no_local_broker: Path) -> None:
    assert resolve_bootstrap_servers(None, default_servers=lambda: " local:9092 ") == "local:9092"
    with pytest.raises(BrokerError, match="KAFKA_BOOTSTRAP_SERVERS"):  # a fallback that has none
        resolve_bootstrap_servers(None, default_servers=lambda: None)


def test_no_broker_says_how_to_get_one(no_local_broker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "   ")  # blank counts as unset
    with pytest.raises(BrokerError) as info:
        resolve_bootstrap_servers(default_servers=local_bootstrap_servers)
    message = str(info.value)
    assert "controlmsg broker start" in message
    assert "KAFKA_BOOTSTRAP_SERVERS" in message
    assert str(no_local_broker) in message
    with pytest.raises(BrokerError) as info:  # without a fallback: the Kafka layer knows no local broker
        resolve_bootstrap_servers()
    assert "KAFKA_BOOTSTRAP_SERVERS" in str(info.value)
    assert "controlmsg broker start" not in str(info.value)


def test_the_command_and_the_jobs_fall_back_on_the_local_broker(no_local_broker: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kafka layer knows no local broker: the command and the jobs hand theirs in (no broker runs here:
    its address is faked, and so is a start)."""
    import argparse

    from controlmsg import cli
    from controlmsg.clusters import broker, local_address
    from spark_jobs.common import kafka_config

    args = argparse.Namespace(bootstrap_servers=None, kafka_settings=[], kafka_config=None)
    with pytest.raises(BrokerError, match="controlmsg broker start"):
        cli._bootstrap(args)
    with pytest.raises(BrokerError, match="controlmsg broker start"):
        kafka_config(args)
    monkeypatch.setattr(local_address, "running_bootstrap_servers", lambda: "127.0.0.1:19092")
    assert cli._bootstrap(args)["bootstrap.servers"] == "127.0.0.1:19092"
    assert kafka_config(args)["bootstrap.servers"] == "127.0.0.1:19092"

    class Started:
        bootstrap_servers = "127.0.0.1:29092"

    ports: list[int] = []

    def start_broker(port: int) -> Started:
        ports.append(port)
        return Started()

    monkeypatch.setattr(local_address, "running_bootstrap_servers", lambda: None)
    monkeypatch.setattr(broker, "start_broker", start_broker)
    assert local_bootstrap_servers(start=True, port=29092) == "127.0.0.1:29092"
    assert ports == [29092]


# ------------------------------------------------------------------------------ client settings


def test_properties_file_lines(tmp_path: Path) -> None:
    from controlmsg.kafka.settings import read_properties

    path = tmp_path / "client.properties"
    path.write_text("# a comment\n! another\n\nbootstrap.servers = b1:9092,b2:9092\nsasl.mechanism: SCRAM-SHA-512\n"
                    "sasl.password=p=ss:word\n")
    assert read_properties(path) == {"bootstrap.servers": "b1:9092,b2:9092", "sasl.mechanism": "SCRAM-SHA-512",
                                     "sasl.password": "p=ss:word"}
    path.write_text("bootstrap.servers=b:1\njust a line\n")  # Java's rules: key 'just', value 'a line'
    assert read_properties(path) == {"bootstrap.servers": "b:1", "just": "a line"}
    with pytest.raises(ConfigError, match="cannot read the Kafka client properties file"):
        read_properties(tmp_path / "missing.properties")


def test_precedence_file_then_x_then_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from controlmsg.kafka.settings import client_config

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    path = tmp_path / "client.properties"
    path.write_text("bootstrap.servers=file:9092\nclient.id=from-file\nlinger.ms=7\n")
    config = client_config(config_file=path, settings=["client.id=from-x", "client.id=later-x"])
    assert config == {"bootstrap.servers": "file:9092", "client.id": "later-x", "linger.ms": "7"}
    assert client_config(config_file=path, settings=["bootstrap.servers=x:9092"])["bootstrap.servers"] == "x:9092"
    flagged = client_config(config_file=path, settings=["bootstrap.servers=x:9092"], bootstrap_servers="flag:1")
    assert flagged["bootstrap.servers"] == "flag:1"
    assert client_config(settings=["client.id=c"])["bootstrap.servers"] == "env:9092"  # none given: the environment
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS")  # nor the environment: the caller's fallback
    assert client_config(settings=["client.id=c"], default_servers=lambda: "local:1")["bootstrap.servers"] == "local:1"


def test_unknown_or_refused_settings_are_named(tmp_path: Path) -> None:
    from controlmsg.kafka.settings import client_config

    with pytest.raises(ConfigError, match=r"'no\.such\.setting' \(from -X\).*No such configuration property"):
        client_config(bootstrap_servers="b:1", settings=["no.such.setting=1"])
    path = tmp_path / "java.properties"
    path.write_text("sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;\n")
    with pytest.raises(ConfigError, match=r"'sasl\.jaas\.config' \(from .*java\.properties:1\): .*sasl\.mechanism"):
        client_config(bootstrap_servers="b:1", config_file=path)
    with pytest.raises(ConfigError, match=r"'isolation\.level'"):  # a consumer setting with a refused value
        client_config(bootstrap_servers="b:1", settings=["isolation.level=sometimes"])
    with pytest.raises(ConfigError, match="expected key=value"):
        client_config(bootstrap_servers="b:1", settings=["linger.ms"])
    # A CA file that is missing: librdkafka names the setting without quotes ("ssl.ca.location failed: ...").
    with pytest.raises(ConfigError, match=r"'ssl\.ca\.location' \(from -X\).*ssl\.ca\.location failed"):
        client_config(bootstrap_servers="b:1", settings=["security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512",
                                                         "sasl.username=u", "sasl.password=p",
                                                         f"ssl.ca.location={tmp_path / 'no-such-ca.pem'}"])


def test_each_client_gets_everything_but_the_other_kinds_settings() -> None:
    from controlmsg.kafka.refusals import ConnectionWatch
    from controlmsg.kafka.settings import CLIENT_LOGGER, for_client

    config = {"bootstrap.servers": "b:1", "sasl.password": "s", "enable.ssl.certificate.verification": "false",
              "oauthbearer_token_refresh_cb": "cb", "linger.ms": "5", "isolation.level": "read_committed"}
    log = {"logger": CLIENT_LOGGER, "enable.sparse.connections": False}

    def made(kind: Literal["producer", "consumer", "admin"]) -> dict[str, Any]:
        conf = for_client(config, kind)
        assert isinstance(conf.pop("error_cb"), ConnectionWatch)  # each client's own (test_refusals.py)
        return conf

    assert made("producer") == {**{k: v for k, v in config.items() if k != "isolation.level"}, **log}
    assert made("consumer") == {**{k: v for k, v in config.items() if k != "linger.ms"}, **log}
    assert made("admin") == {**{k: v for k, v in config.items() if k not in ("linger.ms", "isolation.level")}, **log}
    own = logging.getLogger("mine")
    assert for_client({**config, "logger": own}, "consumer")["logger"] is own
    sparse = {**config, "enable.sparse.connections": "true"}  # the user's value wins
    assert for_client(sparse, "producer")["enable.sparse.connections"] == "true"


def test_librdkafka_log_lines_go_through_python_logging(caplog: pytest.LogCaptureFixture,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """A client of nothing (a closed port) makes librdkafka log ``FAIL``: it reaches the logger, not
    stderr. Every client kind controlmsg makes takes its settings from :func:`for_client`."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    from controlmsg.kafka.settings import for_client

    kinds = ("producer", "consumer", "admin")
    sockets = [socket.socket() for _ in kinds]
    with contextlib.ExitStack() as stack:
        for s in sockets:
            stack.enter_context(s)
            s.bind(("127.0.0.1", 0))
        with caplog.at_level(logging.DEBUG, logger="controlmsg.kafka.client"):
            for kind, s in zip(kinds, sockets, strict=True):
                # A port of its own per client, bound and never listening (connections are refused): the
                # same refused connection to the same address is logged once per 10 s (RepeatFilter).
                config = {"bootstrap.servers": f"127.0.0.1:{s.getsockname()[1]}", "reconnect.backoff.max.ms": "100"}
                caplog.clear()
                deadline = time.monotonic() + 10
                if kind == "producer":
                    producer = Producer(for_client(config, "producer"))
                    while not caplog.records and time.monotonic() < deadline:
                        producer.poll(0.2)
                elif kind == "consumer":
                    consumer = Consumer({**for_client(config, "consumer"), "group.id": "g"})
                    while not caplog.records and time.monotonic() < deadline:
                        consumer.poll(0.2)
                    consumer.close()
                else:
                    admin = AdminClient(for_client(config, "admin"))
                    while not caplog.records and time.monotonic() < deadline:
                        admin.poll(0.2)
                assert any("Connection refused" in r.getMessage() for r in caplog.records), kind
    assert "|FAIL|" not in capfd.readouterr().err


def test_written_properties_read_back_and_stay_private(tmp_path: Path) -> None:
    import stat

    from controlmsg.kafka.settings import read_properties, write_properties

    config = {"bootstrap.servers": "b:1", "sasl.password": "p=ss:w#rd"}
    path = write_properties(config, tmp_path / "k.properties", "a run's settings")
    assert read_properties(path) == config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_properties({"bootstrap.servers": "c:2"}, path)  # written anew
    assert read_properties(path) == {"bootstrap.servers": "c:2"}


def test_repeated_client_log_lines_pass_once_per_interval_with_a_count() -> None:
    import logging

    from controlmsg.kafka.settings import RepeatFilter

    def line(ms: int, broker: str = "127.0.0.1:1") -> logging.LogRecord:
        text = (f"FAIL [rdkafka#producer-{ms % 3}] [thrd:{broker}/bootstrap]: {broker}/bootstrap: Connect to "
                f"{broker} failed: Connection refused (after {ms}ms in state CONNECT)")
        return logging.LogRecord("controlmsg.kafka.client", logging.ERROR, __file__, 1, text, None, None)

    repeat = RepeatFilter(every=0.2)
    assert repeat.filter(line(0))
    assert not any(repeat.filter(line(i)) for i in range(1, 50))  # the same line, other numbers
    assert repeat.filter(line(7, broker="10.0.0.2:9092"))  # another broker's line is another kind
    time.sleep(0.25)
    last = line(99)
    assert repeat.filter(last)
    assert last.getMessage().endswith("(49 like it in the last 0 s)")


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), (False, False), ("true", True), ("TRUE", True), ("t", True), ("1", True), (1, True),
    ("false", False), ("False", False), ("f", False), ("0", False), (0, False), (" false ", False)])
def test_a_boolean_setting_is_read_as_librdkafka_reads_it(value: Any, expected: bool) -> None:
    from controlmsg.kafka.settings import flag

    assert flag({"enable.partition.eof": value}, "enable.partition.eof") is expected


def test_an_absent_boolean_setting_is_false_and_a_bad_one_is_named() -> None:
    from controlmsg.kafka.settings import flag

    assert flag({}, "enable.partition.eof") is False
    with pytest.raises(ConfigError, match=r"enable.partition.eof='yes please': expected true or false"):
        flag({"enable.partition.eof": "yes please"}, "enable.partition.eof")
