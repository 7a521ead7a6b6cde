"""Client settings reach the clients the way Kafka users give them: ``--kafka-config`` (a properties file)
and ``-X key=value``, against a real broker; a setting librdkafka does not know fails the command in one
line that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.kafka


def cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": ""}  # the settings must come from the options alone
    return subprocess.run([sys.executable, "-m", "controlmsg", *args], input=stdin, capture_output=True,
                          timeout=120, check=False, env=env)


def test_properties_file_and_x_settings_reach_the_clients(bootstrap_servers: str, new_topic: Callable[..., str],
                                                           tmp_path: Path) -> None:
    topic = new_topic(2)
    props = tmp_path / "client.properties"
    props.write_text(f"# as Kafka's tools read it\nbootstrap.servers = {bootstrap_servers}\nclient.id=from-file\n")
    lines = b"".join(orjson.dumps({"user": f"u{i}", "n": i}) + b"\n" for i in range(5))
    produced = cli("produce", "--kafka-config", str(props), "-X", "linger.ms=1", "-X", "isolation.level=read_committed",
                   "--topic", topic, "--task-name", "t0", "--task-count", "1", "--run-id", "r1",
                   "--key-field", "user", "--eos", stdin=lines)
    assert produced.returncode == 0, produced.stderr.decode()
    assert b"ignored" not in produced.stderr  # a consumer setting given to all is left out of the producer
    consumed = cli("consume", "-X", f"bootstrap.servers={bootstrap_servers}", "-X", "linger.ms=1",
                   "--topic", topic, "--run-id", "r1", "--until-eos", "--timeout", "60")
    assert consumed.returncode == 0, consumed.stderr.decode()
    rows = [orjson.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["value"]["n"] for r in rows if r["kind"] == "data") == [0, 1, 2, 3, 4]
    assert rows[-1] == {"kind": "end_of_stream"}


def test_an_unknown_setting_fails_in_one_line(bootstrap_servers: str, new_topic: Callable[..., str],
                                              tmp_path: Path) -> None:
    topic = new_topic(1)
    bad = cli("inspect", "--bootstrap-servers", bootstrap_servers, "-X", "sasl.passwrd=secret", "--topic", topic)
    assert bad.returncode == 1
    message = bad.stderr.decode().strip()
    assert message.count("\n") == 0 and "Traceback" not in message
    assert "'sasl.passwrd' (from -X)" in message and "No such configuration property" in message
    missing = cli("inspect", "--kafka-config", str(tmp_path / "nope.properties"), "--topic", topic)
    assert missing.returncode == 1 and "nope.properties" in missing.stderr.decode()
