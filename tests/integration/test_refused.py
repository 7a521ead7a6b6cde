"""A cluster that refuses the client, on the project's secured broker (SASL_SSL, SCRAM-SHA-512, ACLs): every
refusal fails within seconds, in one line that says what was refused, by which broker, for which principal
and what to check, never a secret (issue 25, item 1; :mod:`controlmsg.kafka.refusals`).

Before, each of these waited for the command's timeout (``consume --timeout 60``: a minute) and then said
"timed out ... no answer from ...: check both". What shows that a refusal is told, not waited out, is what
it says: the line of the refusal (a :class:`ClusterRefused`, which only the connection watch raises), not
the timeout's, and the exit code 1 (``consume`` exits 3 at its timeout). The only wall-clock bound is each
call's own timeout: a call that waited for it took at least that long. How soon a refusal is told (about a
second when definitive, after the 10 s grace for an address that does not answer) is printed, not asserted.

The secured broker is the session's (``tests/integration/conftest.py``), shared with ``test_secured_broker``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from controlmsg.clusters.processes import free_ports
from controlmsg.errors import ClusterRefused, DeliveryError
from controlmsg.kafka.admin import create_topic
from controlmsg.kafka.refusals import GRACE_ENV
from controlmsg.kafka.settings import client_config, for_client, read_properties
from controlmsg.kafka.writer import ControlWriter

from .secured import Secured, cli, error_lines

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.kafka

CONSUME_TIMEOUT_S = 60.0  # consume --timeout: the end-of-stream and topic timeout of the command
OWN_TIMEOUT_S = {"consume": CONSUME_TIMEOUT_S, "create-topic": 30.0, "produce": 30.0}
"""Each command's own timeout: consume's --timeout; create-topic and produce wait for the cluster as long as
create_topic and ControlWriter do by default (30 s)."""
CALL_TIMEOUT_S = 60.0  # the timeouts the library calls below are given


def _topic(secured: Secured) -> str:
    name = f"refused-{uuid.uuid4().hex[:8]}"
    create_topic(client_config(config_file=secured.properties["pipeline"]), name, 2)
    return name


def _refused(secured: Secured, *settings: str, command: str = "consume") -> str:
    """Run ``controlmsg <command>`` as the pipeline user with ``-X`` ``settings`` on top; return its one error
    line, having checked that it failed with exit code 1 before its own timeout, printed no trace and no
    password."""
    topic = _topic(secured)
    args = ["--kafka-config", str(secured.properties["pipeline"]), *(a for s in settings for a in ("-X", s)),
            "--topic", topic]
    if command == "consume":
        args += ["--until-eos", "--timeout", f"{CONSUME_TIMEOUT_S:g}"]
    elif command == "create-topic":
        args = [*args[:-1], f"{topic}-new", "--partitions", "1"]
    elif command == "produce":
        args += ["--task-name", "t0", "--task-count", "1", "--eos"]
    started = time.monotonic()
    proc = cli(command, *args, secret=(*secured.passwords, "not-the-password"), stdin=b'{"n": 1}\n')
    took = time.monotonic() - started
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    [line] = error_lines(proc.stderr)
    assert "timed out" not in line and took < OWN_TIMEOUT_S[command], f"{command} waited its timeout ({took:.0f} s)"
    print(f"{took:.1f} s: {line}", file=sys.stderr)
    return line


def _waited(line: str, before: str) -> int:
    """The seconds a refusal line says the client waited, the number after ``before``."""
    return int(line.split(before, 1)[1].split()[0])


def _broker(secured: Secured) -> str:
    return secured.bootstrap_servers


def test_wrong_password(secured: Secured) -> None:
    line = _refused(secured, "sasl.password=not-the-password")
    assert line.startswith("error: SASL authentication refused")
    assert f"broker {_broker(secured)}" in line and "principal User:pipeline" in line
    assert "wrong user name or password" in line and "check sasl.username and sasl.password" in line


def test_a_user_that_does_not_exist(secured: Secured) -> None:
    line = _refused(secured, "sasl.username=ghost", command="create-topic")
    assert line.startswith("error: SASL authentication refused")
    assert f"broker {_broker(secured)}" in line and "principal User:ghost" in line
    assert "check sasl.username and sasl.password" in line


def test_a_mechanism_the_broker_does_not_offer(secured: Secured) -> None:
    line = _refused(secured, "sasl.mechanism=SCRAM-SHA-256", command="produce")
    assert line.startswith("error: SASL mechanism refused")
    assert f"broker {_broker(secured)}" in line and "principal User:pipeline" in line
    assert "does not offer SCRAM-SHA-256 (it offers SCRAM-SHA-512)" in line and "check sasl.mechanism" in line


def test_a_ca_that_did_not_sign_the_broker_certificate(secured: Secured, tmp_path: Path) -> None:
    other = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(other), "-days", "1", "-subj", "/CN=another CA"], check=True, capture_output=True)
    line = _refused(secured, f"ssl.ca.location={other}")
    assert line.startswith("error: TLS certificate not trusted")
    assert f"broker {_broker(secured)}" in line and "principal User:pipeline" in line
    assert f"not signed by a CA of ssl.ca.location '{other}'" in line and "check ssl.ca.location" in line


def test_a_missing_ca_file(secured: Secured, tmp_path: Path) -> None:
    # No ssl.ca.location at all: the system's CAs, none of which signed the broker's certificate.
    settings = read_properties(secured.properties["pipeline"])
    props = tmp_path / "no-ca.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in settings.items() if k != "ssl.ca.location"))
    props.chmod(0o600)
    topic = _topic(secured)
    started = time.monotonic()
    proc = cli("consume", "--kafka-config", str(props), "--topic", topic, "--until-eos", "--timeout",
                f"{CONSUME_TIMEOUT_S:g}", secret=secured.passwords)
    assert proc.returncode == 1 and time.monotonic() - started < CONSUME_TIMEOUT_S, proc.stderr[-2000:]
    [line] = error_lines(proc.stderr)
    assert line.startswith("error: TLS certificate not trusted") and "the system's CA store" in line


def test_a_host_name_the_broker_certificate_does_not_hold(secured: Secured) -> None:
    # The certificate holds IP 127.0.0.1 and DNS localhost. "127.1" reaches the same address (inet_aton's
    # short form), but is no IP literal to TLS, so it is checked as a host name, which the certificate lacks.
    port = secured.bootstrap_servers.rsplit(":", 1)[1]
    line = _refused(secured, f"bootstrap.servers=127.1:{port}")
    assert line.startswith("error: TLS hostname mismatch")
    assert f"broker 127.1:{port}" in line and "principal User:pipeline" in line
    assert "127.0.0.1" in line and "localhost" in line and "not '127.1'" in line and "check bootstrap.servers" in line


def test_an_unknown_host(secured: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the grace of CONTROLMSG_UNREACHABLE_GRACE_S (3 s here; 10 s by default, docs/FAULTS.md)."""
    monkeypatch.setenv(GRACE_ENV, "3")
    port = secured.bootstrap_servers.rsplit(":", 1)[1]
    line = _refused(secured, f"bootstrap.servers=no-such-host.invalid:{port}")
    assert line.startswith("error: unknown host")
    assert f"broker no-such-host.invalid:{port}" in line and "principal User:pipeline" in line
    assert "'no-such-host.invalid' did not resolve for" in line and "check bootstrap.servers" in line
    assert _waited(line, "did not resolve for") >= 3


def test_a_closed_port(secured: Secured, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the grace of CONTROLMSG_UNREACHABLE_GRACE_S (3 s here; 10 s by default, docs/FAULTS.md)."""
    monkeypatch.setenv(GRACE_ENV, "3")
    closed = free_ports()  # nothing listens there
    line = _refused(secured, f"bootstrap.servers=127.0.0.1:{closed}")
    assert line.startswith("error: connection refused")
    assert f"broker 127.0.0.1:{closed}" in line and "every connection refused for" in line
    assert _waited(line, "every connection refused for") >= 3
    assert "check bootstrap.servers and that the broker is up" in line


@pytest.mark.parametrize(("protocol", "command"), [("PLAINTEXT", "consume"), ("SSL", "create-topic"),
                                                   ("SASL_PLAINTEXT", "produce")])
def test_a_security_protocol_the_listener_does_not_speak(secured: Secured, protocol: str, command: str) -> None:
    """librdkafka says only "1/1 brokers are down" (the listener closes the connection); the probe asks the
    listener what it speaks (controlmsg.kafka.probe)."""
    line = _refused(secured, f"security.protocol={protocol}", command=command)
    assert line.startswith("error: security protocol mismatch")
    assert f"broker {_broker(secured)}" in line and "principal User:pipeline" in line
    assert f"the listener speaks SASL_SSL, the client {protocol}" in line
    assert "check security.protocol (and the settings it needs)" in line


def test_tls_to_a_plaintext_listener(secured: Secured, bootstrap_servers: str) -> None:
    line = _refused(secured, f"bootstrap.servers={bootstrap_servers}")  # the pipeline's SASL_SSL settings
    assert line.startswith("error: security protocol mismatch")
    assert f"broker {bootstrap_servers}" in line
    assert "the listener speaks PLAINTEXT, the client SASL_SSL" in line


def test_a_topic_the_principal_may_not_touch(secured: Secured) -> None:
    topic = _topic(secured)
    started = time.monotonic()
    proc = cli("consume", "--kafka-config", str(secured.properties["nobody"]), "--topic", topic, "--until-eos",
                "--timeout", f"{CONSUME_TIMEOUT_S:g}", secret=secured.passwords)
    assert proc.returncode == 1 and time.monotonic() - started < CONSUME_TIMEOUT_S, proc.stderr[-2000:]
    [line] = error_lines(proc.stderr)
    assert f"not authorized to describe topic {topic!r} (principal User:nobody)" in line
    assert f"check the ACLs of User:nobody on topic {topic!r}" in line


def _bad_password(secured: Secured) -> dict[str, Any]:
    return {**client_config(config_file=secured.properties["pipeline"]), "sasl.password": "not-the-password"}


def _raises_refusal(call: Callable[[], object]) -> ClusterRefused:
    """``call()`` (given :data:`CALL_TIMEOUT_S`) raises the refusal: at its timeout it would have raised
    something else (a writer's or flush's :class:`DeliveryError`), or nothing (the read loop below)."""
    started = time.monotonic()
    with pytest.raises(ClusterRefused) as info:
        call()
    assert time.monotonic() - started < CALL_TIMEOUT_S  # its own timeout: it did not wait for it
    assert "not-the-password" not in str(info.value)
    return info.value


def test_every_client_kind_raises_the_refusal(secured: Secured) -> None:
    """The calls that wait without an admin request first: a transactional writer that knows its partitions
    (a Spark write task), a plain writer's flush, a consumer's poll (a Spark read task)."""
    topic = _topic(secured)
    config = _bad_password(secured)
    refusal = _raises_refusal(lambda: ControlWriter({**config, "transactional.id": f"{topic}-t"}, topic,
                                                    task_name="t", task_count=1, partitions=2,
                                                    topic_timeout=CALL_TIMEOUT_S))
    assert refusal.what == "SASL authentication refused" and refusal.principal == "User:pipeline"

    writer = ControlWriter(config, topic, task_name="t", task_count=1, partitions=2)
    writer.send({"n": 1})
    _raises_refusal(lambda: writer.flush(CALL_TIMEOUT_S))

    consumer = Consumer({**for_client(config, "consumer"), "group.id": "refused"})
    consumer.assign([TopicPartition(topic, 0, 0)])

    def read() -> None:
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            consumer.consume(100, 0.5)

    try:
        _raises_refusal(read)
    finally:
        consumer.close()


def test_a_transactional_id_or_a_write_the_principal_may_not_use(secured: Secured) -> None:
    """ACL refusals that come back from the call: named with the principal and the resource."""
    admin = client_config(config_file=secured.properties["admin"])
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    topic, read_only = _topic(secured), _topic(secured)
    grants = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:nobody", "*", op,
                         AclPermissionType.ALLOW) for op in (AclOperation.DESCRIBE, AclOperation.WRITE)]
    grants.append(AclBinding(ResourceType.TOPIC, read_only, ResourcePatternType.LITERAL, "User:nobody", "*",
                             AclOperation.DESCRIBE, AclPermissionType.ALLOW))
    client = AdminClient(for_client(admin, "admin"))
    for future in client.create_acls(grants).values():
        future.result(30)
    nobody = client_config(config_file=secured.properties["nobody"])
    tid = f"{topic}-t0"
    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        ControlWriter({**nobody, "transactional.id": tid}, topic, task_name="t0", task_count=1,
                      topic_timeout=CALL_TIMEOUT_S)
    assert time.monotonic() - started < CALL_TIMEOUT_S  # its own timeout: refused, not timed out
    line = str(info.value)
    print(line, file=sys.stderr)
    assert f"as transactional id {tid!r} (principal User:nobody)" in line, line
    assert f"check the ACLs of User:nobody on transactional id {tid!r}" in line, line

    writer = ControlWriter(nobody, read_only, task_name="t0", task_count=1)  # may describe it, not write
    writer.send({"n": 1})
    started = time.monotonic()
    with pytest.raises(DeliveryError) as info:
        writer.flush(CALL_TIMEOUT_S)
    assert time.monotonic() - started < CALL_TIMEOUT_S  # at its timeout it says "still undelivered" instead
    assert (f"not authorized to write to topic {read_only!r} (principal User:nobody): Broker: Topic authorization "
            f"failed; check the ACLs of User:nobody on topic {read_only!r}") in str(info.value)


@pytest.mark.spark
def test_spark_data_source_fails_with_the_same_line(secured: Secured, spark: SparkSession) -> None:
    from pyspark.errors import PySparkException

    topic = _topic(secured)
    options = {f"kafka.{k}": str(v) for k, v in _bad_password(secured).items()}
    frame = spark.createDataFrame([("a", 1)], "k string, n int")
    started = time.monotonic()
    with pytest.raises(PySparkException) as info:
        (frame.write.format("controlmsg").mode("append").options(**options)
         .option("topic", topic).option("runId", "r1").option("timeout", f"{CALL_TIMEOUT_S:g}").save())
    took = time.monotonic() - started
    plain = {**options, "kafka.security.protocol": "PLAINTEXT"}  # a read, on a listener it does not speak
    read_started = time.monotonic()
    with pytest.raises(PySparkException) as read_info:
        spark.read.format("controlmsg").options(**plain, topic=topic, runId="r1",
                                                timeout=f"{CALL_TIMEOUT_S:g}").load().count()
    read_took = time.monotonic() - read_started
    read_text = str(read_info.value)
    assert (f"security protocol mismatch (broker {secured.bootstrap_servers}, principal User:pipeline): the listener "
            f"speaks SASL_SSL, the client PLAINTEXT") in read_text, read_text[-3000:]
    assert "not-the-password" not in read_text and read_took < CALL_TIMEOUT_S, f"the read waited {read_took:.0f} s"
    text = str(info.value)
    print(f"{took:.1f} s: " + next((line for line in text.splitlines() if "ClusterRefused" in line), text[:300]),
          file=sys.stderr)
    assert "not-the-password" not in text
    expected = (f"SASL authentication refused (broker {secured.bootstrap_servers}, principal User:pipeline): wrong "
                f"user name or password (SCRAM-SHA-512); check sasl.username and sasl.password")
    assert expected in text, text[-3000:]
    assert took < CALL_TIMEOUT_S, f"the write waited {took:.0f} s: its timeout, not the refusal"
