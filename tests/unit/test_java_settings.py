"""The Java client's settings, made librdkafka's (controlmsg.kafka.java_settings, jaas, keystores,
properties) and the settings refused because they would break the guarantees (controlmsg.kafka.settings).
No broker: the secured broker takes these settings in tests/integration/test_secured_broker.py."""

from __future__ import annotations

import datetime
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from controlmsg.errors import ConfigError
from controlmsg.kafka.jaas import JaasFlag, parse_jaas
from controlmsg.kafka.java_settings import translate
from controlmsg.kafka.keystores import key_store_pkcs12, trust_store_pem
from controlmsg.kafka.properties import read_properties, read_properties_lines, write_properties
from controlmsg.kafka.settings import client_config, normalise

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("CONTROLMSG_CACHE_DIR", str(cache))
    return cache


# ------------------------------------------------------------------------------ properties files


def test_properties_are_read_by_javas_rules(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text(
        "# comment\n"
        "   ! another comment, indented\n"
        "bootstrap.servers = b1:9092,\\\n"
        "                    b2:9092\n"
        "sasl.mechanism: SCRAM-SHA-512\n"
        "client.id   spaced\\ id\n"
        "key\\=with\\:seps=v\n"
        "unicode=caf\\u00e9 \\t\\\\end\n"
        "trailing=keeps\\ \n"
        "empty\n"
        "sasl.password=p=ss:w#rd\n"
        "client.id=later wins\n",
        encoding="utf-8",
    )
    settings, lines = read_properties_lines(path)
    assert settings == {
        "bootstrap.servers": "b1:9092,b2:9092", "sasl.mechanism": "SCRAM-SHA-512", "client.id": "later wins",
        "key=with:seps": "v", "unicode": "café \t\\end", "trailing": "keeps ", "empty": "",
        "sasl.password": "p=ss:w#rd",
    }
    assert lines["bootstrap.servers"] == 3 and lines["sasl.mechanism"] == 5 and lines["client.id"] == 12


def test_a_bad_unicode_escape_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("a=1\nb=\\u12g4\n")
    with pytest.raises(ConfigError, match=r"bad\.properties:2: .*\\uXXXX"):
        read_properties(path)
    latin = tmp_path / "latin1.properties"
    latin.write_bytes("sasl.password=caf\xe9\n".encode("iso-8859-1"))  # not UTF-8: Java's own encoding
    assert read_properties(latin) == {"sasl.password": "café"}


def test_written_properties_escape_what_java_would_misread(tmp_path: Path) -> None:
    config = {"sasl.password": " lead\\back=sl:ash #not a comment\u00e9\n", "key with space": "v", "!bang": "x"}
    path = write_properties(config, tmp_path / "out.properties", "a comment\nover two lines")
    assert read_properties(path) == config
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().isascii()


# ------------------------------------------------------------------------------ JAAS


def test_jaas_quoted_values_flags_and_comments() -> None:
    entry = parse_jaas(f'  {SCRAM} Required /* a comment */ username="al\\"ice" // to the end of the line\n'
                       '  password="p;a\\\\ss w=d" tokenauth=false ;  ')
    assert entry.login_module == SCRAM and entry.module_name == "ScramLoginModule"
    assert entry.flag is JaasFlag.REQUIRED
    assert entry.options == {"username": 'al"ice', "password": "p;a\\ss w=d", "tokenauth": "false"}
    assert parse_jaas(f"{PLAIN} optional;").flag is JaasFlag.OPTIONAL
    assert parse_jaas(f'{PLAIN} sufficient a="\\101\\tb";').options == {"a": "A\tb"}


@pytest.mark.parametrize(("text", "error"), [
    ("", "is empty"),
    (f'{SCRAM} username="u";', "a control flag"),
    (f'{SCRAM} required username="u"', "no ';' at the end"),
    (f'{SCRAM} required username;', "without '='"),
    (f'{SCRAM} required username=;', "without a value"),
    (f'{SCRAM} required username="u;', "does not end"),
    (f'{SCRAM} required; {PLAIN} required;', "more than one login module"),
    (f'{SCRAM} required /* open', "does not end"),
])
def test_jaas_errors_say_what_and_where(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error) as info:
        parse_jaas(text)
    assert "secret" not in str(info.value)


def test_a_jaas_error_never_shows_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        normalise({"sasl.mechanism": "SCRAM-SHA-512",
                   "sasl.jaas.config": f'{SCRAM} required username="u" password="hunter2" extra;'})
    assert "hunter2" not in str(info.value) and "'sasl.jaas.config'" in str(info.value)


# ------------------------------------------------------------------------------ translation


def test_scram_and_plain_logins_become_username_and_password() -> None:
    config, origin = normalise({"sasl.mechanism": "SCRAM-SHA-256", "security.protocol": "SASL_SSL",
                                "sasl.jaas.config": f'{SCRAM} required username="pipe" password="s3cr=t";'},
                               {"sasl.jaas.config": "client.properties:4"})
    assert config == {"sasl.mechanism": "SCRAM-SHA-256", "security.protocol": "SASL_SSL", "sasl.username": "pipe",
                      "sasl.password": "s3cr=t"}
    assert origin["sasl.password"] == "client.properties:4"
    plain, _ = translate({"sasl.jaas.config": f'{PLAIN} required username="u" password="p";'})
    assert plain == {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    assert translate(plain)[0] == plain  # a translated config comes back equal (for_client runs it again)


@pytest.mark.parametrize(("config", "error"), [
    ({"sasl.jaas.config": f'{SCRAM} required username="u" password="p";'}, "needs sasl.mechanism=SCRAM-SHA-256"),
    ({"sasl.mechanism": "PLAIN", "sasl.jaas.config": f'{SCRAM} required username="u" password="p";'},
     "not PLAIN"),
    ({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": f'{SCRAM} required username="u";'},
     "without password"),
    ({"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "other",
      "sasl.jaas.config": f'{SCRAM} required username="u" password="p";'}, "give one of them"),
    ({"sasl.mechanism": "SCRAM-SHA-512",
      "sasl.jaas.config": f'{SCRAM} required username="u" password="p" tokenauth="true";'}, "delegation tokens"),
    ({"sasl.jaas.config": 'com.example.MyLoginModule required;'}, "no login module com.example.MyLoginModule"),
    ({"sasl.jaas.config": f'{OAUTH} required clientId="c" clientSecret="s";'},
     "give sasl.oauthbearer.token.endpoint.url"),
    ({"sasl.login.callback.handler.class": "com.example.Handler"}, "a Java class"),
    ({"value.serializer": "org.apache.kafka.common.serialization.StringSerializer"}, "its own envelope"),
    ({"ssl.protocol": "TLSv1.3"}, "OpenSSL's defaults"),
    ({"buffer.memory": "lots"}, "number of bytes"),
])
def test_what_has_no_equivalent_is_refused_in_one_line(config: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error) as info:
        normalise(config, dict.fromkeys(config, "-X"))
    assert str(info.value).count("\n") == 0 and "(from -X)" in str(info.value)


def test_oauthbearer_oidc_and_unsecured_tokens() -> None:
    oidc, _ = translate({
        "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.login.callback.handler.class":
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
        "sasl.jaas.config": f'{OAUTH} required clientId="app" clientSecret="s" scope="kafka" extension_tenant="t1";',
    })
    assert oidc == {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                    "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": "s",
                    "sasl.oauthbearer.scope": "kafka", "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.extensions": "tenant=t1"}
    unsecured, _ = translate({"sasl.jaas.config": f'{OAUTH} required unsecuredLoginStringClaim_sub="alice" '
                                                  'unsecuredLoginLifetimeSeconds="600";'})
    assert unsecured == {"sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": "true",
                         "sasl.oauthbearer.config": "principal=alice lifeSeconds=600"}
    endpoint_only, _ = translate({"sasl.mechanism": "OAUTHBEARER",
                                  "sasl.oauthbearer.token.endpoint.url": "https://idp/token"})
    assert endpoint_only["sasl.oauthbearer.method"] == "oidc"


def test_kerberos_renamed_settings_and_host_name_checks() -> None:
    krb, _ = translate({"sasl.jaas.config": 'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true '
                                            'storeKey=true keyTab="/etc/k.keytab" principal="svc@EXAMPLE.COM";',
                        "sasl.kerberos.service.name": "kafka"})
    assert krb == {"sasl.mechanism": "GSSAPI", "sasl.kerberos.principal": "svc@EXAMPLE.COM",
                   "sasl.kerberos.keytab": "/etc/k.keytab", "sasl.kerberos.service.name": "kafka"}
    renamed, _ = translate({"fetch.max.wait.ms": "50", "max.request.size": "2000000", "buffer.memory": "1048577",
                            "send.buffer.bytes": "-1", "receive.buffer.bytes": "65536",
                            "ssl.endpoint.identification.algorithm": ""})
    assert renamed == {"fetch.wait.max.ms": "50", "message.max.bytes": "2000000",
                       "queue.buffering.max.kbytes": "1025", "socket.send.buffer.bytes": "0",
                       "socket.receive.buffer.bytes": "65536", "ssl.endpoint.identification.algorithm": "none"}
    assert translate({"ssl.endpoint.identification.algorithm": "HTTPS"})[0] == {
        "ssl.endpoint.identification.algorithm": "https"}


# ------------------------------------------------------------------------------ guarantees


@pytest.mark.parametrize(("setting", "value", "error"), [
    ("isolation.level", "read_uncommitted", "reads read_committed only"),
    ("enable.auto.commit", "true", "never commits a reader's offsets"),
    ("auto.commit.enable", "true", "never commits a reader's offsets"),
    ("transactional.id", "my-app", "a transactional id of its own"),
    ("enable.idempotence", "false", "need idempotence"),
])
def test_settings_that_break_the_guarantees_are_refused(tmp_path: Path, setting: str, value: str,
                                                        error: str) -> None:
    path = tmp_path / "java.properties"
    path.write_text(f"bootstrap.servers=b:1\n{setting}={value}\n")
    with pytest.raises(ConfigError, match=rf"'{setting}' \(from .*java\.properties:2\) refused: .*{error}"):
        client_config(config_file=path, check=False)
    with pytest.raises(ConfigError, match=rf"'{setting}' \(from -X\) refused"):
        client_config(bootstrap_servers="b:1", settings=[f"{setting}={value}"], check=False)
    from controlmsg.spark.options import ReadOptions

    with pytest.raises(ConfigError, match=rf"'{setting}' \(from option kafka\.{setting}\) refused"):
        ReadOptions.parse({"topic": "t", "runId": "r", "kafka.bootstrap.servers": "b:1", f"kafka.{setting}": value})


def test_values_that_say_what_controlmsg_does_anyway_pass() -> None:
    given = {"isolation.level": "read_committed", "enable.auto.commit": "false", "enable.idempotence": "true"}
    assert normalise(given)[0] == given


# ------------------------------------------------------------------------------ stores


@dataclass(frozen=True)
class Stores:
    ca_pem: bytes
    jks: Path
    p12: Path
    key_jks: Path
    password: str


def _keytool(*args: str) -> None:
    subprocess.run(["keytool", *args], check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    work = tmp_path_factory.mktemp("stores")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controlmsg test CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    ca_pem = cert.public_bytes(serialization.Encoding.PEM)
    (work / "ca.pem").write_bytes(ca_pem)
    password = "store pass"
    for kind, path in (("JKS", work / "trust.jks"), ("PKCS12", work / "trust.p12")):
        _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(work / "ca.pem"), "-keystore", str(path),
                 "-storetype", kind, "-storepass", password)
    client = pkcs12.serialize_key_and_certificates(b"client", key, cert, None,
                                                   serialization.BestAvailableEncryption(password.encode()))
    (work / "client.p12").write_bytes(client)
    _keytool("-importkeystore", "-noprompt", "-srckeystore", str(work / "client.p12"), "-srcstoretype", "PKCS12",
             "-srcstorepass", password, "-destkeystore", str(work / "client.jks"), "-deststoretype", "JKS",
             "-deststorepass", password, "-destkeypass", password)
    _keytool("-importkeystore", "-noprompt", "-srckeystore", str(work / "client.p12"), "-srcstoretype", "PKCS12",
             "-srcstorepass", password, "-srcalias", "client", "-destkeystore", str(work / "client-keypass.jks"),
             "-deststoretype", "JKS", "-deststorepass", password, "-destkeypass", "another key pass")
    yield Stores(ca_pem, work / "trust.jks", work / "trust.p12", work / "client.jks", password)


@pytest.mark.parametrize("kind", ["jks", "p12"])
def test_a_truststore_becomes_a_private_pem_file(stores: Stores, kind: str, private_cache: Path) -> None:
    location = stores.jks if kind == "jks" else stores.p12
    config, origin = normalise({"bootstrap.servers": "b:1", "security.protocol": "SSL",
                                "ssl.truststore.location": str(location), "ssl.truststore.password": stores.password,
                                "ssl.truststore.type": kind.upper().replace("P12", "PKCS12")},
                               {"ssl.truststore.location": "-X"})
    pem = Path(config.pop("ssl.ca.location"))
    assert config == {"bootstrap.servers": "b:1", "security.protocol": "SSL"}
    assert origin["ssl.ca.location"] == "-X"
    assert x509.load_pem_x509_certificates(pem.read_bytes()) == x509.load_pem_x509_certificates(stores.ca_pem)
    assert pem.parent == private_cache / "kafka-stores"
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600 and stat.S_IMODE(pem.parent.stat().st_mode) == 0o700
    assert trust_store_pem(str(location), stores.password) == pem  # once per store: the same file again
    # librdkafka reads it (a client is built from the settings: check_settings)
    client_config(bootstrap_servers="b:1", settings=["security.protocol=SSL", f"ssl.truststore.location={location}",
                                                     f"ssl.truststore.password={stores.password}"])


def test_a_wrong_truststore_password_is_named_without_the_password(stores: Stores) -> None:
    for location in (stores.jks, stores.p12):
        with pytest.raises(ConfigError, match=r"ssl\.truststore\.location .*password") as info:
            trust_store_pem(str(location), "wrong-pass-123")
        assert "wrong-pass-123" not in str(info.value)
    with pytest.raises(ConfigError, match="is a JKS file"):
        trust_store_pem(str(stores.jks), stores.password, declared="PEM")


@pytest.mark.parametrize("key_password", ["same", "another key pass"])
def test_a_jks_keystore_becomes_a_private_pkcs12_store(stores: Stores, key_password: str) -> None:
    location = stores.key_jks if key_password == "same" else stores.key_jks.with_name("client-keypass.jks")
    config, _ = normalise({"ssl.keystore.location": str(location), "ssl.keystore.password": stores.password,
                           "ssl.keystore.type": "JKS",
                           "ssl.key.password": stores.password if key_password == "same" else key_password})
    made = Path(config["ssl.keystore.location"])
    assert made != location and "ssl.key.password" not in config and "ssl.keystore.type" not in config
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    loaded = pkcs12.load_pkcs12(made.read_bytes(), stores.password.encode())
    assert loaded.key is not None and loaded.cert is not None
    assert key_store_pkcs12(str(made), stores.password, None)[0] == made  # PKCS12: read as it is
