"""A local single-node Apache Kafka broker (KRaft mode) for development and tests.

The broker is the real Apache Kafka server, run from Apache Kafka's own Maven
Central artifacts; no Docker and no Kafka distribution tarball is needed. A
Python user needs only ``java`` (17 or newer) and pyspark (``controlmsg[spark]``):
the one-time download goes through the Apache Ivy that pyspark ships, Maven
(``mvn``) is an option, never a requirement. The exact jar set is pinned with
SHA-256 checksums in ``kafka-jars.lock`` and verified before every use (see
:mod:`controlmsg.clusters.kafka_jars`).

Layout on disk:

* ``<cache_dir>/kafka-<KAFKA_VERSION>/libs/`` holds exactly the locked jars,
  shared by all brokers (installed in one rename once complete and verified).
* ``<data_dir>/`` belongs to one broker: ``server.properties``,
  ``log4j2.properties``, ``broker.log`` (its stdout/stderr; the previous run's
  log is kept as ``broker.log.1``), ``broker.pid``, ``broker.json`` and the
  Kafka storage in ``logs/`` (formatted once, reused by later starts).

The broker listens on ``127.0.0.1`` only.  Topic auto-creation is off
(intermediate topics are created on purpose, with their partition count), and
every internal topic uses replication factor 1.

With ``security="sasl-ssl"`` the client port takes SASL/SCRAM-SHA-512 over TLS
only, ACLs are enforced, and the data directory also holds the generated
passwords, certificates and one client properties file per user (see
:mod:`controlmsg.clusters.security`).

POSIX only (Linux, macOS): the broker is detached into its own session and
stopped with signals.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlmsg.clusters import security as sec
from controlmsg.clusters.kafka_jars import KAFKA_VERSION, ensure_kafka_libs
from controlmsg.clusters.processes import (
    file_lock,
    free_ports,
    is_process_of,
    java_executable,
    log_tail,
    pid_alive,
    port_free,
    run_tool,
    spawn_detached,
    tcp_accepts,
    terminate,
    write_text_atomic,
)
from controlmsg.clusters.security import Security
from controlmsg.errors import BrokerError
from controlmsg.paths import cache_dir

__all__ = [
    "KAFKA_VERSION",
    "SECURITY_MODES",
    "BrokerError",
    "BrokerHandle",
    "Security",
    "broker_status",
    "default_cache_dir",
    "default_data_dir",
    "ensure_kafka_libs",
    "start_broker",
    "stop_broker",
]

SECURITY_MODES = sec.MODES
"""What :func:`start_broker` takes as ``security``: ``"plaintext"`` (the default) or ``"sasl-ssl"``."""

_HOST = "127.0.0.1"
_NODE_ID = 1
_JVM_HEAP = "-Xmx512m"

_BROKER_DIR_ENV = "CONTROLMSG_BROKER_DIR"

_OPENSSL_TIMEOUT = 60.0
_ACL_TIMEOUT = 30.0

_PID_FILE = "broker.pid"
_JSON_FILE = "broker.json"
_LOG_FILE = "broker.log"
_LOCK_FILE = ".broker.lock"
_PROPS_FILE = "server.properties"
_LOG4J_FILE = "log4j2.properties"
_STORAGE_DIR = "logs"
# Written after a secured format: its storage holds SCRAM users, a plain one has none.
_STORAGE_SECURITY_FILE = "storage.security"

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerHandle:
    """A running local broker.

    Attributes:
        bootstrap_servers: ``host:port`` for Kafka clients.
        pid: Process id of the broker JVM.
        data_dir: Absolute directory that holds the broker's state and files.
        log_path: The broker's stdout/stderr log (``<data_dir>/broker.log``).
        security: ``"plaintext"`` or ``"sasl-ssl"``.
        client_properties: Secured only: user (``admin``, ``pipeline``, ``nobody``) -> that user's
            client properties file (librdkafka names, mode 0600), for ``--kafka-config``.
    """

    bootstrap_servers: str
    pid: int
    data_dir: Path
    log_path: Path
    security: Security = "plaintext"
    client_properties: dict[str, Path] = field(default_factory=dict, hash=False)


# --------------------------------------------------------------------------- paths


def default_cache_dir() -> Path:
    """Return the cache directory: ``$CONTROLMSG_CACHE_DIR`` or ``~/.cache/controlmsg``
    (:func:`controlmsg.paths.cache_dir`).

    Does not block, does not create the directory, does not raise.
    """
    return cache_dir()


def default_data_dir() -> Path:
    """Return the broker directory: ``$CONTROLMSG_BROKER_DIR`` or ``<cache>/broker``.

    Does not block, does not create the directory, does not raise.
    """
    env = os.environ.get(_BROKER_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return default_cache_dir() / "broker"


def _resolve_dir(path: Path | None, default: Path) -> Path:
    return (path if path is not None else default).expanduser().resolve()


# ------------------------------------------------------------------ start / stop


def start_broker(port: int = 9092, data_dir: Path | None = None, timeout: float = 90.0, *,
                 security: Security = "plaintext") -> BrokerHandle:
    """Start a single-node KRaft broker on ``127.0.0.1:port`` and wait until it serves.

    ``data_dir`` defaults to :func:`default_data_dir` and is created if
    missing.  Its storage is formatted on first use and reused afterwards.
    The controller listens on ``port + 1`` when that port is free, otherwise
    on a free port chosen by the OS.  The broker runs detached (own session;
    it outlives the caller) with stdout/stderr in ``<data_dir>/broker.log``;
    its pid goes to ``<data_dir>/broker.pid`` and ``<data_dir>/broker.json``
    records ``bootstrap_servers``, ``pid`` and ``port`` (plus
    ``controller_port``, ``kafka_version``, ``security`` and
    ``client_properties``).

    ``security="sasl-ssl"``: the client port takes SASL_SSL with SCRAM-SHA-512
    only and Kafka's ``StandardAuthorizer`` denies what no ACL allows. On the
    first start the passwords of the users ``admin`` (super user), ``pipeline``
    and ``nobody`` are generated into ``<data_dir>/secrets.json`` (0600) and the
    users are created when the storage is formatted; at every start ``openssl``
    makes a new CA and broker certificate (for ``127.0.0.1`` and ``localhost``),
    ``<data_dir>/client-<user>.properties`` (0600) are written, and once the
    broker serves, ``pipeline`` is granted what controlmsg needs on every
    topic, group and transactional id (see
    :mod:`controlmsg.clusters.security`). A storage keeps the mode it was
    formatted in.

    Idempotent: if the broker recorded in ``data_dir`` is alive on ``port``
    with the same ``security``, it is waited for until it serves and its handle
    is returned; nothing is started.

    Blocks: until the broker answers a metadata request (typically a few
    seconds), or up to ``timeout`` seconds.  ``timeout`` does not cover the
    one-time download by :func:`ensure_kafka_libs`, nor waiting for another
    process that is starting or stopping a broker in the same ``data_dir``.

    Raises:
        BrokerError: the broker recorded in ``data_dir`` runs on a different
            port or in the other security mode; the storage was formatted in
            the other security mode; ``port`` (or the chosen controller port)
            is taken by another process; ``java`` (or, secured, ``openssl``)
            cannot be found or fails; the Kafka jars cannot be fetched and verified
            against the lock (:func:`ensure_kafka_libs`);
            formatting the storage fails; the broker exits or does not serve
            within ``timeout``; or (secured) the ACLs cannot be created.  In
            the last cases the broker process is killed and the message ends
            with the last lines of ``broker.log``.  No message contains a
            generated password.
        ValueError: ``port`` is not in 1..65534, ``timeout`` is not positive
            or ``security`` is not one of :data:`SECURITY_MODES`.
    """
    if not 1 <= port <= 65534:
        raise ValueError(f"port must be in 1..65534, got {port}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if security not in SECURITY_MODES:
        raise ValueError(f"security must be one of {', '.join(SECURITY_MODES)}, got {security!r}")
    ddir = _resolve_dir(data_dir, default_data_dir())
    try:
        ddir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create the broker directory {ddir}: {exc}") from exc

    with file_lock(ddir / _LOCK_FILE):
        existing = _recorded_broker(ddir)
        if existing is not None:
            handle, recorded_port = existing
            if recorded_port != port:
                raise BrokerError(
                    f"a broker from {ddir} is already running at "
                    f"{handle.bootstrap_servers} (pid {handle.pid}), not on port "
                    f"{port}; stop it first (`controlmsg broker stop`) or use "
                    f"port {recorded_port}"
                )
            if handle.security != security:
                raise BrokerError(
                    f"a {handle.security} broker from {ddir} is already running at "
                    f"{handle.bootstrap_servers} (pid {handle.pid}), not a {security} one; "
                    "stop it first (`controlmsg broker stop`) or use another data directory"
                )
            _logger.info("broker already running at %s", handle.bootstrap_servers)
            _serve_or_kill(handle, time.monotonic() + timeout)
            return handle
        _kill_orphan(ddir)

        libs = ensure_kafka_libs()
        java = java_executable()
        deadline = time.monotonic() + timeout

        if not port_free(port):
            raise BrokerError(
                f"port {port} on {_HOST} is already in use by another process "
                f"(not a broker recorded in {ddir}); choose another port or stop "
                "whatever is listening there"
            )
        controller_port = _pick_controller_port(port)

        formatted = (ddir / _STORAGE_DIR / "meta.properties").is_file()
        if formatted and _storage_security(ddir) != security:
            raise BrokerError(
                f"the broker storage in {ddir} was formatted for a {_storage_security(ddir)} broker, "
                f"not a {security} one; use another data directory (--data-dir)"
            )
        props = ddir / _PROPS_FILE
        log4j = ddir / _LOG4J_FILE
        log_path = ddir / _LOG_FILE
        bootstrap = f"{_HOST}:{port}"
        listeners = _PLAIN_LISTENERS.format(host=_HOST, port=port, controller_port=controller_port)
        found: sec.BrokerSecrets | None = None
        client_properties: dict[str, Path] = {}
        if security == "sasl-ssl":
            found = sec.load_or_create_secrets(ddir)
            ca = sec.make_certificates(ddir, lambda cmd, what: _run_tool(cmd, what, _OPENSSL_TIMEOUT))
            listeners = sec.server_listener_properties(ddir, port, controller_port, found, _HOST)
            client_properties = sec.write_client_properties(ddir, bootstrap, found, ca)
        write_text_atomic(props, _server_properties(ddir, controller_port, listeners), private=found is not None)
        write_text_atomic(log4j, _LOG4J2_PROPERTIES)
        jvm_opts = [f"-Dlog4j2.configurationFile={log4j}", "-cp", str(libs / "*")]

        if not formatted:
            _format_storage([java, *jvm_opts], props, deadline, found)
            if found is not None:
                write_text_atomic(ddir / _STORAGE_SECURITY_FILE, f"{security}\n")
            else:
                (ddir / _STORAGE_SECURITY_FILE).unlink(missing_ok=True)

        with contextlib.suppress(FileNotFoundError):
            log_path.replace(ddir / (_LOG_FILE + ".1"))  # keep the previous run's log
        argv = [java, _JVM_HEAP, *jvm_opts, "kafka.Kafka", str(props)]
        pid = spawn_detached(argv, log_path)
        handle = BrokerHandle(bootstrap_servers=bootstrap, pid=pid, data_dir=ddir, log_path=log_path,
                              security=security, client_properties=client_properties)
        try:
            write_text_atomic(ddir / _PID_FILE, f"{pid}\n")
            record = {
                "bootstrap_servers": bootstrap,
                "pid": pid,
                "port": port,
                "controller_port": controller_port,
                "kafka_version": KAFKA_VERSION,
                "security": security,
                "client_properties": {user: str(path) for user, path in client_properties.items()},
            }
            write_text_atomic(ddir / _JSON_FILE, json.dumps(record, indent=2) + "\n")
            _logger.info("started broker pid %d at %s", pid, bootstrap)
        except BaseException:
            _terminate(pid, ddir, 5.0)
            _remove_record(ddir)
            raise
        _serve_or_kill(handle, deadline)
        return handle


def stop_broker(data_dir: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the broker recorded in ``data_dir`` (default :func:`default_data_dir`).

    Sends SIGTERM (Kafka shuts down cleanly), waits up to ``timeout`` seconds,
    then SIGKILLs it.  Removes ``broker.pid`` and ``broker.json`` in every
    case; the formatted storage is kept, so a later :func:`start_broker` on
    the same ``data_dir`` reuses it.  Only a process that is verifiably this
    data directory's broker is signalled (protects against pid reuse).

    Blocks: until the process is gone (usually a few seconds; at most
    ``timeout`` plus 10 s), or while another process is starting or stopping
    a broker in the same ``data_dir``.

    Returns:
        True if a running broker was stopped, False if none was running.

    Raises:
        BrokerError: the process survived SIGKILL.
    """
    ddir = _resolve_dir(data_dir, default_data_dir())
    if not ddir.is_dir():
        return False
    with file_lock(ddir / _LOCK_FILE):
        pid = _read_pid(ddir)
        stopped = False
        if pid is not None and _is_our_broker(pid, ddir):
            _logger.info("stopping broker pid %d", pid)
            _terminate(pid, ddir, timeout)
            stopped = True
        _remove_record(ddir)
        return stopped


def broker_status(data_dir: Path | None = None) -> BrokerHandle | None:
    """Return the broker recorded in ``data_dir`` if its process is alive, else None.

    ``data_dir`` defaults to :func:`default_data_dir`.  Only the process is
    checked (no network round trip), so a broker that a concurrent
    :func:`start_broker` is still starting is reported as well.

    Does not block (beyond reading a few small files) and does not raise.
    """
    ddir = _resolve_dir(data_dir, default_data_dir())
    found = _recorded_broker(ddir)
    return None if found is None else found[0]


# ------------------------------------------------------------------- internals

_LOG4J2_PROPERTIES = """\
# Generated by controlmsg.clusters.broker (rewritten at every start).
status = error
name = controlmsg-broker
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.target = SYSTEM_OUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d{ISO8601}] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.brokerserver.name = kafka.server.BrokerServer
logger.brokerserver.level = INFO
logger.controllerserver.name = kafka.server.ControllerServer
logger.controllerserver.level = INFO
"""


def _properties_value(value: str) -> str:
    return value.replace("\\", "\\\\")


_PLAIN_LISTENERS = """\
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
"""


def _server_properties(data_dir: Path, controller_port: int, listeners: str, *, node_id: int = _NODE_ID,
                       voters: str | None = None, brokers: int = 1) -> str:
    """``server.properties`` with ``listeners``: the listener lines (and, secured, TLS, SASL and ACLs).

    ``voters`` (``id@host:port,...``): the controller quorum, default this node alone. ``brokers``: the size of
    the cluster; topics and the internal topics get ``min(3, brokers)`` replicas and need ``min(2, brokers)``
    in sync (so on one broker everything stays at 1)."""
    storage = _properties_value(str(data_dir / _STORAGE_DIR))
    replicas, in_sync = min(3, brokers), min(2, brokers)
    return f"""\
# Generated by controlmsg.clusters (rewritten at every start).
process.roles=broker,controller
node.id={node_id}
controller.quorum.voters={voters or f"{node_id}@{_HOST}:{controller_port}"}
{listeners.rstrip()}
log.dirs={storage}
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={in_sync}
offsets.topic.replication.factor={replicas}
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={in_sync}
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={in_sync}
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
# Intermediate topics are created on purpose, with their partition count; a typo must not create one.
auto.create.topics.enable=false
"""


def _storage_security(data_dir: Path) -> Security:
    """The mode the storage of ``data_dir`` was formatted in (no marker: plaintext, as before markers)."""
    try:
        text = (data_dir / _STORAGE_SECURITY_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return "plaintext"
    return "sasl-ssl" if text == "sasl-ssl" else "plaintext"


def _pick_controller_port(port: int) -> int:
    if port_free(port + 1):
        return port + 1
    return free_ports(exclude={port})


def _new_cluster_id() -> str:
    """A random Kafka cluster id, as ``kafka-storage.sh random-uuid`` makes them."""
    while True:
        raw = base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")
        if not raw.startswith("-"):  # Kafka avoids ids that look like options
            return raw


def _format_storage(java_cmd: Sequence[str], props: Path, deadline: float,
                    found: sec.BrokerSecrets | None = None, cluster_id: str | None = None) -> None:
    """Format the storage (of a new cluster, or of the cluster ``cluster_id``); with ``found``, create its
    SCRAM users (their passwords never reach a log or an error message, only the tool's command line)."""
    cluster_id = cluster_id or _new_cluster_id()
    cmd = [
        *java_cmd,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(props),
    ]
    hidden: tuple[str, ...] = ()
    if found is not None:
        cmd += sec.scram_format_args(found)
        hidden = found.all()
    remaining = max(1.0, deadline - time.monotonic())
    _logger.info("formatting Kafka storage: %s", sec.redact(shlex.join(cmd), hidden))
    _run_tool(cmd, "formatting the broker storage", remaining, hidden=hidden)


def _run_tool(cmd: Sequence[str], what: str, timeout: float, cwd: Path | None = None,
              hidden: Sequence[str] = ()) -> str:
    """Run a helper tool to completion; return its output. Raises :class:`BrokerError` naming the command
    and the tail of its output when it cannot run, times out or fails; the ``hidden`` strings (passwords)
    appear as ``***`` in the message."""
    try:
        return run_tool(cmd, what, timeout, cwd)
    except BrokerError as exc:
        if not hidden:
            raise
        raise BrokerError(sec.redact(str(exc), hidden)) from None


def _is_our_broker(pid: int, data_dir: Path) -> bool:
    """True if ``pid`` is alive and (as far as can be told) runs this dir's broker."""
    return is_process_of(pid, "kafka.Kafka", str(data_dir / _PROPS_FILE))


def _read_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / _PID_FILE).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _recorded_broker(data_dir: Path) -> tuple[BrokerHandle, int] | None:
    """The live broker recorded in ``data_dir`` and its port, if there is one."""
    pid = _read_pid(data_dir)
    if pid is None:
        return None
    try:
        record = json.loads((data_dir / _JSON_FILE).read_text(encoding="utf-8"))
        rec_pid = record["pid"]
        bootstrap = record["bootstrap_servers"]
        port = record["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(rec_pid, int) and isinstance(bootstrap, str) and isinstance(port, int) and rec_pid == pid):
        return None
    if not _is_our_broker(pid, data_dir):
        return None
    security: Security = "sasl-ssl" if record.get("security") == "sasl-ssl" else "plaintext"
    paths = record.get("client_properties")
    client_properties = (
        {str(user): Path(path) for user, path in paths.items() if isinstance(path, str)}
        if isinstance(paths, dict) else {}
    )
    handle = BrokerHandle(
        bootstrap_servers=bootstrap,
        pid=pid,
        data_dir=data_dir,
        log_path=data_dir / _LOG_FILE,
        security=security,
        client_properties=client_properties,
    )
    return handle, port


def _kill_orphan(data_dir: Path) -> None:
    """Stop a broker of ``data_dir`` whose record is incomplete; clear stale files."""
    pid = _read_pid(data_dir)
    if pid is not None and _is_our_broker(pid, data_dir):
        _logger.warning("stopping unrecorded broker pid %d from %s", pid, data_dir)
        _terminate(pid, data_dir, 10.0)
    _remove_record(data_dir)


def _remove_record(data_dir: Path) -> None:
    for name in (_PID_FILE, _JSON_FILE):
        (data_dir / name).unlink(missing_ok=True)


def _terminate(pid: int, data_dir: Path, timeout: float) -> None:
    """SIGTERM ``data_dir``'s broker ``pid``, wait ``timeout`` s, then SIGKILL it (only while ``pid`` still
    is that broker). Raises BrokerError if it survives SIGKILL."""
    terminate(pid, ("kafka.Kafka", str(data_dir / _PROPS_FILE)), timeout, what="broker process")


def _serve_or_kill(handle: BrokerHandle, deadline: float) -> None:
    """Wait until ``handle`` serves (secured: and grant the pipeline user its ACLs); otherwise kill it,
    clear its record and raise."""
    try:
        _wait_until_serving(handle, deadline)
        if handle.security == "sasl-ssl":
            _grant_pipeline_acls(handle)
    except BaseException:
        with contextlib.suppress(BrokerError):
            _terminate(handle.pid, handle.data_dir, 5.0)
        _remove_record(handle.data_dir)
        raise


def _wait_until_serving(handle: BrokerHandle, deadline: float) -> None:
    host, _, port_text = handle.bootstrap_servers.rpartition(":")
    port = int(port_text)
    while True:
        if not pid_alive(handle.pid):
            raise BrokerError(f"the Kafka broker (pid {handle.pid}) exited during startup" + log_tail(handle.log_path))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(
                f"the Kafka broker at {handle.bootstrap_servers} (pid {handle.pid}) "
                "did not serve in time; it was killed" + log_tail(handle.log_path)
            )
        if tcp_accepts(host, port) and _answers_metadata(handle, min(5.0, remaining)):
            return
        time.sleep(0.2)


def _admin_settings(handle: BrokerHandle) -> dict[str, Any]:
    """librdkafka settings of an admin client for ``handle``: secured, the ``admin`` super user's."""
    if handle.security != "sasl-ssl":
        return {"bootstrap.servers": handle.bootstrap_servers}
    found = sec.load_secrets(handle.data_dir)
    return sec.client_settings(handle.bootstrap_servers, sec.ADMIN_USER, found.users[sec.ADMIN_USER],
                               sec.tls_dir(handle.data_dir) / sec.CA_FILE)


def _grant_pipeline_acls(handle: BrokerHandle) -> None:
    """Allow the pipeline user what controlmsg needs (idempotent: an existing ACL is kept as it is).
    Raises :class:`BrokerError` naming the ACL the broker refused, with the broker log's tail."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_admin_settings(handle), logger=_logger)
    futures = admin.create_acls(sec.pipeline_acl_bindings(), request_timeout=_ACL_TIMEOUT)
    for binding, future in futures.items():
        try:
            future.result(timeout=_ACL_TIMEOUT)
        except (KafkaException, TimeoutError) as exc:
            reason = exc.args[0] if isinstance(exc, KafkaException) else f"no answer within {_ACL_TIMEOUT:.0f} s"
            raise BrokerError(
                f"the broker at {handle.bootstrap_servers} did not create the ACL {binding}: {reason}"
                + log_tail(handle.log_path)
            ) from exc


def _answers_metadata(handle: BrokerHandle, timeout: float) -> bool:
    """True once the broker returns cluster metadata that lists a broker (secured: to the admin user)."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # pragma: no cover - confluent_kafka is a dependency
        try:
            log = handle.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        return "Kafka Server started" in log
    # logger=: keep librdkafka's connection chatter out of the caller's stderr.
    admin = AdminClient(_admin_settings(handle), logger=_logger)
    try:
        metadata = admin.list_topics(timeout=max(0.5, timeout))
    except Exception:  # KafkaException while the broker is still starting
        return False
    return bool(metadata.brokers)
