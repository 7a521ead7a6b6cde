"""What makes the local broker of :mod:`controlmsg.clusters.broker` a secured one (``security="sasl-ssl"``).

The secured broker authenticates every client with SASL/SCRAM-SHA-512 over TLS and authorizes it with
Kafka's ``StandardAuthorizer`` (no ACL: no access). Everything it needs lives in its data directory:

* ``secrets.json`` (mode 0600): the generated passwords of the SCRAM users (:data:`USERS`) and of the
  controller's own PLAIN login; made once, kept as long as the storage (the SCRAM users are written into
  the storage when it is formatted);
* ``tls/ca.pem`` (the CA certificate clients trust) and ``tls/broker.pem`` (mode 0600: the broker's key,
  its certificate for ``127.0.0.1`` and ``localhost``, and the CA certificate), made again at every start
  by ``openssl``; the CA's key is deleted once the broker certificate is signed;
* ``client-<user>.properties`` (mode 0600), one per user, in librdkafka's names: what
  ``--kafka-config`` and :func:`controlmsg.kafka.settings.client_config` read.

Users: ``admin`` is the super user (the broker also talks to itself as ``admin``), ``pipeline`` gets
what controlmsg needs (:func:`pipeline_grants`) on every topic, group and transactional id, and
``nobody`` authenticates but may do nothing. The controller listener stays on loopback without TLS but
with SASL/PLAIN, so that no unauthenticated connection is a super user.

This module only builds texts, files and ACL bindings; the broker module runs the tools and the broker.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from controlmsg.errors import BrokerError

if TYPE_CHECKING:
    from confluent_kafka.admin import AclBinding  # type: ignore[attr-defined]

__all__ = [
    "ADMIN_USER",
    "CA_FILE",
    "MODES",
    "NOBODY_USER",
    "PIPELINE_USER",
    "SCRAM_MECHANISM",
    "USERS",
    "BrokerSecrets",
    "Security",
    "client_properties_text",
    "client_settings",
    "load_or_create_secrets",
    "load_secrets",
    "make_certificates",
    "pipeline_acl_bindings",
    "pipeline_grants",
    "redact",
    "scram_format_args",
    "server_listener_properties",
    "tls_dir",
    "write_client_properties",
]

Security = Literal["plaintext", "sasl-ssl"]
MODES: Final[tuple[Security, ...]] = ("plaintext", "sasl-ssl")

ADMIN_USER: Final = "admin"
PIPELINE_USER: Final = "pipeline"
NOBODY_USER: Final = "nobody"
USERS: Final = (ADMIN_USER, PIPELINE_USER, NOBODY_USER)
_CONTROLLER_USER: Final = "controller"

SCRAM_MECHANISM: Final = "SCRAM-SHA-512"
_SECRETS_FILE: Final = "secrets.json"
_TLS_DIR: Final = "tls"
CA_FILE: Final = "ca.pem"
_KEYSTORE_FILE: Final = "broker.pem"
_CERT_DAYS: Final = 365
_CLUSTER: Final = "kafka-cluster"  # the name of Kafka's one cluster resource


@dataclass(frozen=True)
class BrokerSecrets:
    """The generated passwords: ``users`` (SCRAM user -> password) and the controller's PLAIN login."""

    users: Mapping[str, str]
    controller: str

    def all(self) -> tuple[str, ...]:
        """Every password, for :func:`redact`."""
        return (*self.users.values(), self.controller)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by its owner only (0600 from the start)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp creates 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise BrokerError(f"cannot write {path}: {exc}") from exc


def load_secrets(data_dir: Path) -> BrokerSecrets:
    """The passwords of ``data_dir/secrets.json``.

    Raises:
        BrokerError: the file is missing, unreadable, or does not hold a password for every user (the
            message names the file, never a password).
    """
    path = data_dir / _SECRETS_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        users = {name: raw["users"][name] for name in USERS}
        controller = raw["controller"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # No chaining: a JSON error would quote the file, passwords and all.
        raise BrokerError(f"{path} is missing, unreadable or incomplete ({type(exc).__name__}); the "
                          "secured broker's storage needs exactly those passwords: use a new data "
                          "directory to start over") from None
    if not all(isinstance(v, str) and v for v in (*users.values(), controller)):
        raise BrokerError(f"{path}: every password must be a non-empty string")
    return BrokerSecrets(users=users, controller=controller)


def load_or_create_secrets(data_dir: Path) -> BrokerSecrets:
    """:func:`load_secrets`; when ``secrets.json`` does not exist, new random (URL-safe) passwords, written
    there 0600 first. Raises :class:`BrokerError` as :func:`load_secrets` does, or when it cannot write."""
    path = data_dir / _SECRETS_FILE
    if path.exists():
        return load_secrets(data_dir)
    made = BrokerSecrets(users={name: secrets.token_urlsafe(24) for name in USERS},
                         controller=secrets.token_urlsafe(24))
    _write_private(path, json.dumps({"users": dict(made.users), "controller": made.controller}, indent=2) + "\n")
    return made


def redact(text: str, known: Sequence[str]) -> str:
    """``text`` with every one of the ``known`` secrets replaced by ``***``."""
    for secret in known:
        if secret:
            text = text.replace(secret, "***")
    return text


def scram_format_args(found: BrokerSecrets) -> list[str]:
    """The ``kafka-storage format`` arguments that create every SCRAM user with its password."""
    args: list[str] = []
    for name, password in found.users.items():
        args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]"]
    return args


# ----------------------------------------------------------------------------------------- certificates


def tls_dir(data_dir: Path) -> Path:
    """Where the CA certificate and the broker's key store are."""
    return data_dir / _TLS_DIR


def make_certificates(data_dir: Path, run: Callable[[Sequence[str], str], object]) -> Path:
    """Make a new CA and a broker certificate for ``127.0.0.1`` and ``localhost`` with ``openssl`` (RSA
    2048, valid for a year); return the CA certificate's path (``tls/ca.pem``). ``run(cmd, what)`` runs one
    command and raises :class:`BrokerError` if it fails. The key store ``tls/broker.pem`` (key, certificate,
    CA certificate) is 0600; the CA key and the request are deleted.

    Blocks: while ``openssl`` runs (well under a second each time).
    """
    tls = tls_dir(data_dir)
    try:
        tls.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create {tls}: {exc}") from exc
    ca_key, ca_pem = tls / "ca.key", tls / CA_FILE
    key, csr, cert, ext = tls / "broker.key", tls / "broker.csr", tls / "broker.crt", tls / "broker.ext"
    try:
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                       "keyUsage=critical,digitalSignature,keyEncipherment\n"
                       "extendedKeyUsage=serverAuth,clientAuth\n", encoding="utf-8")
        old = os.umask(0o077)  # the keys are private from their first byte
        try:
            run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
                 "-out", str(ca_pem), "-days", str(_CERT_DAYS), "-subj", "/CN=controlmsg local broker CA",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign"], "making the local CA")
            run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
                 "-subj", "/CN=localhost"], "making the broker's key")
            run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
                 "-set_serial", "0x" + secrets.token_hex(16), "-days", str(_CERT_DAYS), "-out", str(cert),
                 "-extfile", str(ext)], "signing the broker's certificate")
        finally:
            os.umask(old)
        store = key.read_text(encoding="ascii") + cert.read_text(encoding="ascii") + ca_pem.read_text(encoding="ascii")
        _write_private(tls / _KEYSTORE_FILE, store)
        ca_pem.chmod(0o644)  # public: clients read it
    except OSError as exc:
        raise BrokerError(f"cannot make the broker's certificates in {tls}: {exc}") from exc
    finally:
        for leftover in (ca_key, key, csr, cert, ext):
            leftover.unlink(missing_ok=True)
    return ca_pem


# ------------------------------------------------------------------------------------------- properties


def _jaas_value(value: str) -> str:
    # Passwords are URL-safe base64, but a JAAS string must not end early on a quote or a backslash.
    return value.replace("\\", "\\\\").replace('"', '\\"')


def server_listener_properties(data_dir: Path, port: int, controller_port: int, found: BrokerSecrets,
                               host: str) -> str:
    """The listener, TLS, SASL and authorizer lines of the secured broker's ``server.properties``.

    Clients and the broker itself (inter-broker, e.g. transaction markers) use SASL_SSL on ``port``; the
    broker logs in as ``admin``. The controller listener is SASL_PLAINTEXT with PLAIN and one user, so
    that no unauthenticated connection gets the controller's rights.
    """
    tls = tls_dir(data_dir)
    admin = _jaas_value(found.users[ADMIN_USER])
    ctl = _jaas_value(found.controller)
    keystore = str(tls / _KEYSTORE_FILE).replace("\\", "\\\\")
    ca = str(tls / CA_FILE).replace("\\", "\\\\")
    return f"""\
listeners=SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=SASL_SSL://{host}:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT
inter.broker.listener.name=SASL_SSL
sasl.enabled.mechanisms={SCRAM_MECHANISM}
sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}
listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config=\
org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" password="{admin}";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \
required username="{_CONTROLLER_USER}" password="{ctl}" user_{_CONTROLLER_USER}="{ctl}";
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
ssl.truststore.type=PEM
ssl.truststore.location={ca}
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{ADMIN_USER};User:{_CONTROLLER_USER}
"""


def client_settings(bootstrap_servers: str, user: str, password: str, ca_location: Path) -> dict[str, str]:
    """librdkafka settings with which ``user`` reaches the secured broker."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca_location),
    }


def client_properties_text(settings: Mapping[str, str]) -> str:
    """A client properties file (``key=value`` lines) of ``settings``, as ``--kafka-config`` reads it."""
    user = settings.get("sasl.username", "?")
    lines = [f"# Generated by controlmsg.clusters.broker for user {user} (rewritten at every start). Secret: "
             "keep it 0600."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def write_client_properties(data_dir: Path, bootstrap_servers: str, found: BrokerSecrets,
                            ca_location: Path) -> dict[str, Path]:
    """Write ``client-<user>.properties`` (0600) for every user; return user -> path."""
    paths: dict[str, Path] = {}
    for user, password in found.users.items():
        path = data_dir / f"client-{user}.properties"
        _write_private(path, client_properties_text(client_settings(bootstrap_servers, user, password,
                                                                    ca_location)))
        paths[user] = path
    return paths


# ------------------------------------------------------------------------------------------------- ACLs

# (resource type, resource name, operations): ``*`` is Kafka's wildcard (every resource of the type).
_PIPELINE_GRANTS: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("TOPIC", "*", ("CREATE", "DESCRIBE", "READ", "WRITE", "DESCRIBE_CONFIGS")),
    ("GROUP", "*", ("READ", "DESCRIBE", "DELETE")),
    ("TRANSACTIONAL_ID", "*", ("WRITE", "DESCRIBE")),
    ("CLUSTER", _CLUSTER, ("IDEMPOTENT_WRITE", "CREATE", "DESCRIBE")),
)


def pipeline_grants() -> tuple[tuple[str, str, str], ...]:
    """What the ``pipeline`` user may do, as (resource type, resource name, operation) triples: create,
    read and write every topic, read and delete every consumer group, write transactionally under every
    transactional id, and write idempotently."""
    return tuple((rtype, name, op) for rtype, name, ops in _PIPELINE_GRANTS for op in ops)


def pipeline_acl_bindings(user: str = PIPELINE_USER) -> list[AclBinding]:
    """:func:`pipeline_grants` as confluent-kafka ACL bindings that allow ``User:<user>`` from any host."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    bindings = []
    for rtype, name, op in pipeline_grants():
        # confluent-kafka calls the cluster resource BROKER (the same wire value, 4).
        resource = ResourceType.BROKER if rtype == "CLUSTER" else ResourceType[rtype]
        bindings.append(AclBinding(resource, name, ResourcePatternType.LITERAL, f"User:{user}", "*",
                                   AclOperation[op], AclPermissionType.ALLOW))
    return bindings
