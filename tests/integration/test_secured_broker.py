"""The secured local broker (``controlmsg broker start --security sasl-ssl``) against real clients: the
pipeline user writes and reads the protocol with nothing but its properties file, the ``nobody`` user is
refused in one line that names the topic, a plaintext client gets nowhere, and no password is ever
printed.

The secured broker is the session's (``tests/integration/conftest.py``, shared with ``test_refused``), started
through the CLI in a temporary directory on a free port; if it cannot start, every test here errors.
"""

from __future__ import annotations

import stat
import subprocess
import time
import uuid
from pathlib import Path

import orjson
import pytest

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import StreamEnded
from controlmsg.kafka.admin import create_topic, end_offsets, partition_count
from controlmsg.kafka.data_records import DataRecord
from controlmsg.kafka.reader import ControlReader
from controlmsg.kafka.settings import client_config, read_properties
from controlmsg.kafka.writer import ControlWriter

from .secured import Secured, cli, error_lines

pytestmark = pytest.mark.kafka


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_start_names_the_pipeline_properties_and_writes_private_files(secured: Secured) -> None:
    status = cli("broker", "status", "--data-dir", str(secured.data_dir), secret=secured.passwords)
    assert status.returncode == 0 and status.stdout.strip() == secured.bootstrap_servers
    pipeline = secured.properties["pipeline"]
    assert str(pipeline) in status.stderr
    assert set(secured.properties) == {"admin", "pipeline", "nobody"}
    for user, path in secured.properties.items():
        assert path == secured.data_dir / f"client-{user}.properties"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        settings = read_properties(path)
        assert settings["bootstrap.servers"] == secured.bootstrap_servers
        assert settings["security.protocol"] == "SASL_SSL"
        assert settings["sasl.mechanism"] == "SCRAM-SHA-512"
        assert settings["sasl.username"] == user and settings["sasl.password"] in secured.passwords
        assert Path(settings["ssl.ca.location"]).is_file()
    for private in ("secrets.json", "server.properties", "tls/broker.pem"):
        assert stat.S_IMODE((secured.data_dir / private).stat().st_mode) == 0o600, private


def test_pipeline_user_writes_and_reads_through_the_cli(secured: Secured) -> None:
    topic = _topic("secured-cli")
    props = str(secured.properties["pipeline"])
    created = cli("create-topic", "--kafka-config", props, "--topic", topic, "--partitions", "2",
                   secret=secured.passwords)
    assert created.returncode == 0, created.stderr
    lines = b"".join(orjson.dumps({"user": f"u{i}", "n": i}) + b"\n" for i in range(6))
    produced = cli("produce", "--kafka-config", props, "--topic", topic, "--task-name", "t0", "--task-count", "1",
                    "--run-id", "r1", "--key-field", "user", "--watermark", "100", "--eos", stdin=lines,
                    secret=secured.passwords)
    assert produced.returncode == 0, produced.stderr
    consumed = cli("consume", "--kafka-config", props, "--topic", topic, "--run-id", "r1", "--until-eos",
                    "--timeout", "60", secret=secured.passwords)
    assert consumed.returncode == 0, consumed.stderr
    rows = [orjson.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["value"]["n"] for r in rows if r["kind"] == "data") == list(range(6))
    assert rows[-1] == {"kind": "end_of_stream"}


def test_pipeline_user_writes_transactionally_and_reads_committed(secured: Secured) -> None:
    config = client_config(config_file=secured.properties["pipeline"])
    topic = _topic("secured-api")
    create_topic(config, topic, 2)
    writer = ControlWriter({**config, "transactional.id": f"{topic}-task-0"}, topic, task_name="t",
                           task_count=1, run_id="r1")
    writer.send({"n": 1}, key="a")
    writer.abort()  # a failed attempt: read_committed readers never see it
    writer.send({"n": 2}, key="a")
    writer.send_watermark(500)
    writer.send_end_of_stream()
    writer.close()
    with ControlReader(config, topic) as reader:
        items = list(reader.read_until_end(timeout=60))
    assert [decode_json_payload(i.payload) for i in items if isinstance(i, DataRecord)] == [{"n": 2}]
    assert isinstance(items[-1], StreamEnded)


def test_nobody_is_refused_in_one_line_and_writes_nothing(secured: Secured) -> None:
    pipeline = client_config(config_file=secured.properties["pipeline"])
    nobody = str(secured.properties["nobody"])

    missing = _topic("secured-nobody-create")
    create = cli("create-topic", "--kafka-config", nobody, "--topic", missing, "--partitions", "1",
                  secret=secured.passwords)
    assert create.returncode == 1
    [line] = error_lines(create.stderr)
    assert "not authorized to create topic" in line and repr(missing) in line and "User:nobody" in line
    assert "Traceback" not in create.stderr
    assert partition_count(pipeline, missing) is None  # nothing was created

    topic = _topic("secured-nobody-write")
    create_topic(pipeline, topic, 2)
    produce = cli("produce", "--kafka-config", nobody, "--topic", topic, "--task-name", "t0", "--task-count", "1",
                   "--eos", stdin=b'{"n": 1}\n', secret=secured.passwords)
    assert produce.returncode == 1
    [line] = error_lines(produce.stderr)
    assert "not authorized to" in line and repr(topic) in line and "User:nobody" in line
    assert end_offsets(pipeline, topic) == {0: 0, 1: 0}  # nothing was written

    consume = cli("consume", "--kafka-config", nobody, "--topic", topic, "--until-eos", "--timeout", "10",
                   secret=secured.passwords)
    assert consume.returncode == 1
    [line] = error_lines(consume.stderr)
    assert "not authorized to describe topic" in line and repr(topic) in line


def test_a_plaintext_client_gets_nowhere(secured: Secured) -> None:
    pipeline = client_config(config_file=secured.properties["pipeline"])
    topic = _topic("secured-plain")
    create_topic(pipeline, topic, 1)
    started = time.monotonic()
    plain = cli("consume", "-X", f"bootstrap.servers={secured.bootstrap_servers}", "--topic", topic,
                 "--until-eos", "--timeout", "3", secret=secured.passwords)
    took = time.monotonic() - started
    assert plain.returncode == 1 and plain.stdout == ""
    [line] = error_lines(plain.stderr)
    assert line.startswith("error: security protocol mismatch")  # told by asking the listener (test_refused)
    assert "the listener speaks SASL_SSL, the client PLAINTEXT" in line
    assert took < 60, f"a plaintext client waited {took:.0f} s"


# ------------------------------------------------------------------------------ the Java client's settings

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _truststore(secured: Secured, directory: Path, kind: str, password: str) -> Path:
    """The secured broker's CA in a truststore of ``kind`` (JKS or PKCS12), made by keytool as a Java user
    makes one."""
    store = directory / f"truststore.{kind.lower()}"
    subprocess.run(["keytool", "-importcert", "-noprompt", "-alias", "broker-ca", "-file",
                    str(secured.data_dir / "tls" / "ca.pem"), "-keystore", str(store), "-storetype", kind,
                    "-storepass", password], check=True, capture_output=True, timeout=120)
    return store


def _pipeline_password(secured: Secured) -> str:
    return str(read_properties(secured.properties["pipeline"])["sasl.password"])


@pytest.mark.parametrize("kind", ["JKS", "PKCS12"])
def test_connector_style_options_reach_the_secured_broker(secured: Secured, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The options a ``format("kafka")`` user has (the Java client's names, a keytool truststore) work
    unchanged for the data source's settings, and every client made from them writes and reads."""
    from controlmsg.spark.options import ReadOptions, WriteOptions

    monkeypatch.setenv("CONTROLMSG_CACHE_DIR", str(tmp_path / "cache"))
    store = _truststore(secured, tmp_path, kind, "store-pass")
    topic = _topic(f"secured-java-{kind.lower()}")
    options = {
        "topic": topic, "runId": "r1",
        "kafka.bootstrap.servers": secured.bootstrap_servers,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM_MODULE} required username="pipeline" '
                                  f'password="{_pipeline_password(secured)}";',
        "kafka.ssl.truststore.location": str(store),
        "kafka.ssl.truststore.password": "store-pass",
        "kafka.ssl.truststore.type": kind,
        "kafka.ssl.endpoint.identification.algorithm": "https",
    }
    write = dict(WriteOptions.parse(options).config)
    assert write["sasl.jaas.config"] == options["kafka.sasl.jaas.config"]  # translated where each client runs
    create_topic(write, topic, 2)
    with ControlWriter(write, topic, task_name="t0", task_count=1, run_id="r1") as writer:
        for n in range(4):
            writer.send({"n": n}, key=f"k{n}")
        writer.send_watermark(100)
        writer.send_end_of_stream()
    with ControlReader(dict(ReadOptions.parse(options).config), topic, run_id="r1") as reader:
        items = list(reader.read_until_end(timeout=60))
    assert sorted(decode_json_payload(i.payload)["n"] for i in items if isinstance(i, DataRecord)) == [0, 1, 2, 3]
    assert isinstance(items[-1], StreamEnded)
    converted = list((tmp_path / "cache" / "kafka-stores").glob("truststore-*.pem"))
    assert len(converted) == 1 and stat.S_IMODE(converted[0].stat().st_mode) == 0o600


def test_a_java_client_properties_file_works_through_the_cli(secured: Secured, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A Java application's client properties file, with Java's syntax (``:`` and whitespace separators,
    a JAAS line continued over three lines, ``\\`` escapes, ``!`` comments), given to ``--kafka-config``
    as it is; and the same settings as ``-X`` (a JKS truststore this time)."""
    monkeypatch.setenv("CONTROLMSG_CACHE_DIR", str(tmp_path / "cache"))
    password = _pipeline_password(secured)
    p12 = _truststore(secured, tmp_path, "PKCS12", "p12 pass")
    props = tmp_path / "client.properties"
    props.write_text(
        "# the Java client's settings, as a Java application has them\n"
        f"bootstrap.servers : {secured.bootstrap_servers}\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism   SCRAM-SHA-512\n"
        f"sasl.jaas.config={SCRAM_MODULE} required \\\n"
        "    username=\"pip\\u0065line\" \\\n"
        f"    password=\"{password}\";\n"
        "! the truststore keytool made\n"
        f"ssl.truststore.location={p12}\n"
        "ssl.truststore.password=p12\\ pass\n"
        "ssl.truststore.type=PKCS12\n"
        "ssl.endpoint.identification.algorithm=https\n")
    topic = _topic("secured-java-cli")
    created = cli("create-topic", "--kafka-config", str(props), "--topic", topic, "--partitions", "2",
                   secret=secured.passwords)
    assert created.returncode == 0, created.stderr
    lines = b"".join(orjson.dumps({"user": f"u{i}", "n": i}) + b"\n" for i in range(5))
    produced = cli("produce", "--kafka-config", str(props), "--topic", topic, "--task-name", "t0", "--task-count",
                    "1", "--run-id", "r1", "--key-field", "user", "--eos", stdin=lines, secret=secured.passwords)
    assert produced.returncode == 0, produced.stderr
    jks = _truststore(secured, tmp_path, "JKS", "jks-pass")
    consumed = cli("consume", "-X", f"bootstrap.servers={secured.bootstrap_servers}",
                    "-X", "security.protocol=SASL_SSL", "-X", "sasl.mechanism=SCRAM-SHA-512",
                    "-X", f'sasl.jaas.config={SCRAM_MODULE} required username="pipeline" password="{password}";',
                    "-X", f"ssl.truststore.location={jks}", "-X", "ssl.truststore.password=jks-pass",
                    "--topic", topic, "--run-id", "r1", "--until-eos", "--timeout", "60", secret=secured.passwords)
    assert consumed.returncode == 0, consumed.stderr
    rows = [orjson.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["value"]["n"] for r in rows if r["kind"] == "data") == [0, 1, 2, 3, 4]
    assert rows[-1] == {"kind": "end_of_stream"}
    refused = cli("consume", "--kafka-config", str(props), "-X", "isolation.level=read_uncommitted", "--topic", topic,
                   "--until-eos", "--timeout", "10", secret=secured.passwords)
    assert refused.returncode == 1
    [line] = error_lines(refused.stderr)
    assert line.startswith("error: Kafka client setting 'isolation.level' (from -X) refused: controlmsg reads "
                           "read_committed only")
