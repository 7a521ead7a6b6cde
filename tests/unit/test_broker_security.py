"""The pure parts of the secured local broker: passwords on disk, the properties it writes, the ACLs it
grants, and that the plaintext broker's configuration did not change."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from controlmsg.cli import build_parser
from controlmsg.clusters import kraft
from controlmsg.clusters import security as sec
from controlmsg.errors import BrokerError
from controlmsg.kafka.settings import read_properties


def test_secrets_are_made_once_private_and_reused(tmp_path: Path) -> None:
    made = sec.load_or_create_secrets(tmp_path)
    path = tmp_path / "secrets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(made.users) == {"admin", "pipeline", "nobody"}
    assert len(set(made.all())) == 4 and all(len(p) >= 24 for p in made.all())
    assert sec.load_or_create_secrets(tmp_path) == made


def test_broken_secrets_fail_without_quoting_them(tmp_path: Path) -> None:
    (tmp_path / "secrets.json").write_text('{"users": {"admin": "s3cret-value"}, "controller": "x"}')
    with pytest.raises(BrokerError) as info:
        sec.load_secrets(tmp_path)
    assert "secrets.json" in str(info.value) and "s3cret-value" not in str(info.value)
    with pytest.raises(BrokerError, match="missing"):
        sec.load_secrets(tmp_path / "nowhere")


def test_client_properties_read_back_as_librdkafka_settings(tmp_path: Path) -> None:
    found = sec.BrokerSecrets(users={"admin": "a-pw", "pipeline": "p-pw", "nobody": "n-pw"}, controller="c-pw")
    ca = tmp_path / "tls" / "ca.pem"
    paths = sec.write_client_properties(tmp_path, "127.0.0.1:9093", found, ca)
    assert set(paths) == {"admin", "pipeline", "nobody"}
    settings = read_properties(paths["pipeline"])
    assert settings == {
        "bootstrap.servers": "127.0.0.1:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "pipeline",
        "sasl.password": "p-pw",
        "ssl.ca.location": str(ca),
    }
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths.values())


def test_pipeline_grants_cover_what_controlmsg_does_and_nothing_more() -> None:
    grants = set(sec.pipeline_grants())
    assert grants == {
        *(("TOPIC", "*", op) for op in ("CREATE", "DESCRIBE", "READ", "WRITE", "DESCRIBE_CONFIGS")),
        *(("GROUP", "*", op) for op in ("READ", "DESCRIBE", "DELETE")),
        *(("TRANSACTIONAL_ID", "*", op) for op in ("WRITE", "DESCRIBE")),
        *(("CLUSTER", "kafka-cluster", op) for op in ("IDEMPOTENT_WRITE", "CREATE", "DESCRIBE")),
    }
    bindings = sec.pipeline_acl_bindings()
    assert len(bindings) == len(grants)
    assert {b.principal for b in bindings} == {"User:pipeline"} and {b.host for b in bindings} == {"*"}
    assert {getattr(b.permission_type, "name", None) for b in bindings} == {"ALLOW"}  # enums, once bound
    assert {getattr(b.restype, "name", None) for b in bindings} == {"TOPIC", "GROUP", "TRANSACTIONAL_ID", "BROKER"}


def test_secured_server_properties(tmp_path: Path) -> None:
    found = sec.BrokerSecrets(users={"admin": "a-pw", "pipeline": "p-pw", "nobody": "n-pw"}, controller="c-pw")
    text = kraft.server_properties(
        tmp_path, 9094, sec.server_listener_properties(tmp_path, 9093, 9094, found, "127.0.0.1"))
    lines = dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert lines["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert lines["controller.quorum.voters"] == "1@127.0.0.1:9094"
    assert lines["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert lines["allow.everyone.if.no.acl.found"] == "false"
    assert lines["super.users"] == "User:admin;User:controller"  # no User:ANONYMOUS
    assert lines["ssl.keystore.type"] == lines["ssl.truststore.type"] == "PEM"
    assert "p-pw" not in text and "n-pw" not in text  # only the broker's own logins are in it


def test_plaintext_server_properties_are_unchanged(tmp_path: Path) -> None:
    text = kraft.server_properties(tmp_path, 9093, kraft.plain_listeners(9092, 9093))
    assert "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\n" in text
    assert "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n" in text
    assert "sasl" not in text and "authorizer" not in text


def test_passwords_are_redacted_from_tool_errors() -> None:
    found = sec.BrokerSecrets(users={"admin": "a-pw", "pipeline": "p-pw", "nobody": "n-pw"}, controller="c-pw")
    args = sec.scram_format_args(found)
    assert args[:2] == ["--add-scram", "SCRAM-SHA-512=[name=admin,password=a-pw]"]
    with pytest.raises(BrokerError) as info:
        kraft.run_tool_redacted(["false", *args], "formatting", 10, hidden=found.all())
    assert "formatting failed" in str(info.value) and "pw" not in str(info.value)


def test_cli_broker_security_defaults_to_plaintext() -> None:
    parser = build_parser()
    assert parser.parse_args(["broker", "start"]).security == "plaintext"
    assert parser.parse_args(["broker", "start", "--security", "sasl-ssl"]).security == "sasl-ssl"
    with pytest.raises(SystemExit):
        parser.parse_args(["broker", "start", "--security", "ssl"])


def test_certificates_are_for_loopback_and_the_ca_key_is_gone(tmp_path: Path) -> None:
    import subprocess

    ca = sec.make_certificates(tmp_path, lambda cmd, what: kraft.run_tool_redacted(cmd, what, 60))
    tls = tmp_path / "tls"
    assert sorted(p.name for p in tls.iterdir()) == ["broker.pem", "ca.pem"]
    assert stat.S_IMODE((tls / "broker.pem").stat().st_mode) == 0o600
    store = (tls / "broker.pem").read_text()
    assert store.count("BEGIN CERTIFICATE") == 2 and "BEGIN PRIVATE KEY" in store
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(tls / "broker.pem")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    san = subprocess.run(["openssl", "x509", "-in", str(tls / "broker.pem"), "-noout", "-ext", "subjectAltName"],
                         capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in san and "DNS:localhost" in san
