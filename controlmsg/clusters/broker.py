"""A local single-node Apache Kafka broker (KRaft mode) for development and tests.

The broker is the real Apache Kafka server, run from Apache Kafka's own Maven Central artifacts; no Docker and no
Kafka distribution tarball is needed. A Python user needs only ``java`` (17 or newer) and pyspark
(``controlmsg[spark]``): the one-time download goes through the Apache Ivy that pyspark ships, Maven (``mvn``) is
an option, never a requirement. The exact jar set is pinned with SHA-256 checksums in ``kafka-jars.lock`` and
verified before every use (see :mod:`controlmsg.clusters.kafka_jars`).

Layout on disk:

* ``<cache_dir>/kafka-<KAFKA_VERSION>/libs/`` holds exactly the locked jars, shared by all brokers (installed in
  one rename once complete and verified).
* ``<data_dir>/`` belongs to one broker, a KRaft node directory (:mod:`controlmsg.clusters.kraft`):
  ``server.properties``, ``log4j2.properties``, ``broker.log`` (its stdout/stderr; the previous run's log is
  kept as ``broker.log.1``), ``broker.pid``, ``broker.json`` (:mod:`controlmsg.clusters.broker_record`) and
  the Kafka storage in ``logs/`` (formatted once, reused by later starts).

The broker listens on ``127.0.0.1`` only. Topic auto-creation is off (intermediate topics are created on
purpose, with their partition count), and every internal topic uses replication factor 1.

With ``security="sasl-ssl"`` the client port takes SASL/SCRAM-SHA-512 over TLS only, ACLs are enforced, and the
data directory also holds the generated passwords, certificates and one client properties file per user (see
:mod:`controlmsg.clusters.security`).

POSIX only (Linux, macOS): the broker is detached into its own session and stopped with signals.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from controlmsg.clusters import kraft
from controlmsg.clusters import security as sec
from controlmsg.clusters.broker_record import (
    JSON_FILE,
    STORAGE_SECURITY_FILE,
    BrokerHandle,
    record_json,
    recorded_broker,
    remove_record,
    storage_security,
)
from controlmsg.clusters.kafka_jars import KAFKA_VERSION, ensure_kafka_libs
from controlmsg.clusters.processes import (
    file_lock,
    free_ports,
    java_executable,
    log_tail,
    make_directory,
    pid_alive,
    port_free,
    tcp_accepts,
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

_HOST = kraft.HOST

_BROKER_DIR_ENV = "CONTROLMSG_BROKER_DIR"

_OPENSSL_TIMEOUT = 60.0
_ACL_TIMEOUT = 30.0

_LOCK_FILE = ".broker.lock"

_logger = logging.getLogger(__name__)


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

    ``data_dir`` defaults to :func:`default_data_dir` and is created if missing. Its storage is formatted on
    first use and reused afterwards. The controller listens on ``port + 1`` when that port is free, otherwise on
    a free port chosen by the OS. The broker runs detached (own session; it outlives the caller) with
    stdout/stderr in ``<data_dir>/broker.log``; its pid goes to ``<data_dir>/broker.pid`` and
    ``<data_dir>/broker.json`` records ``bootstrap_servers``, ``pid`` and ``port`` (plus ``controller_port``,
    ``kafka_version``, ``security`` and ``client_properties``).

    ``security="sasl-ssl"``: the client port takes SASL_SSL with SCRAM-SHA-512 only and Kafka's
    ``StandardAuthorizer`` denies what no ACL allows. On the first start the passwords of the users ``admin``
    (super user), ``pipeline`` and ``nobody`` are generated into ``<data_dir>/secrets.json`` (0600) and the users
    are created when the storage is formatted; at every start ``openssl`` makes a new CA and broker certificate
    (for ``127.0.0.1`` and ``localhost``), ``<data_dir>/client-<user>.properties`` (0600) are written, and once
    the broker serves, ``pipeline`` is granted what controlmsg needs on every topic, group and transactional id
    (see :mod:`controlmsg.clusters.security`). A storage keeps the mode it was formatted in.

    Idempotent: if the broker recorded in ``data_dir`` is alive on ``port`` with the same ``security``, it is
    waited for until it serves and its handle is returned; nothing is started.

    Blocks: until the broker answers a metadata request (typically a few seconds), or up to ``timeout`` seconds.
    ``timeout`` does not cover the one-time download by :func:`ensure_kafka_libs`, nor waiting for another
    process that is starting or stopping a broker in the same ``data_dir``.

    Raises:
        BrokerError: the broker recorded in ``data_dir`` runs on a different port or in the other security
            mode; the storage was formatted in the other security mode; ``port`` (or the chosen controller port)
            is taken by another process; ``java`` (or, secured, ``openssl``) cannot be found or fails; the Kafka
            jars cannot be fetched and verified against the lock (:func:`ensure_kafka_libs`); formatting the
            storage fails; the broker exits or does not serve within ``timeout``; or (secured) the ACLs cannot
            be created. In the last cases the broker process is killed and the message ends with the last lines
            of ``broker.log``. No message contains a generated password.
        ValueError: ``port`` is not in 1..65534, ``timeout`` is not positive or ``security`` is not one of
            :data:`SECURITY_MODES`.
    """
    _check_arguments(port, timeout, security)
    ddir = make_directory(_resolve_dir(data_dir, default_data_dir()), "the broker directory")
    with file_lock(ddir / _LOCK_FILE):
        existing = recorded_broker(ddir)
        if existing is not None:
            handle, recorded_port = existing
            refused = _refuse_running(handle, recorded_port, port, security)
            if refused is not None:
                raise BrokerError(refused)
            _logger.info("broker already running at %s", handle.bootstrap_servers)
            _serve_or_kill(handle, time.monotonic() + timeout)
            return handle
        _kill_orphan(ddir)
        libs = ensure_kafka_libs()
        java = java_executable()
        deadline = time.monotonic() + timeout
        controller_port = _controller_port(ddir, port)
        formatted = kraft.is_formatted(ddir)
        if formatted and storage_security(ddir) != security:
            raise BrokerError(
                f"the broker storage in {ddir} was formatted for a {storage_security(ddir)} broker, "
                f"not a {security} one; use another data directory (--data-dir)"
            )
        found, client_properties = _write_settings(ddir, port, controller_port, security)
        if not formatted:
            kraft.format_storage(java, libs, ddir, deadline, secrets=found)
            if found is not None:
                write_text_atomic(ddir / STORAGE_SECURITY_FILE, f"{security}\n")
            else:
                (ddir / STORAGE_SECURITY_FILE).unlink(missing_ok=True)
        handle = _spawn(java, libs, ddir, port, controller_port, security, client_properties)
        _serve_or_kill(handle, deadline)
        return handle


def stop_broker(data_dir: Path | None = None, timeout: float = 30.0) -> bool:
    """Stop the broker recorded in ``data_dir`` (default :func:`default_data_dir`).

    Sends SIGTERM (Kafka shuts down cleanly), waits up to ``timeout`` seconds, then SIGKILLs it. Removes
    ``broker.pid`` and ``broker.json`` in every case; the formatted storage is kept, so a later
    :func:`start_broker` on the same ``data_dir`` reuses it. Only a process that is verifiably this data
    directory's broker is signalled (protects against pid reuse).

    Blocks: until the process is gone (usually a few seconds; at most ``timeout`` plus 10 s), or while another
    process is starting or stopping a broker in the same ``data_dir``.

    Returns:
        True if a running broker was stopped, False if none was running.

    Raises:
        BrokerError: the process survived SIGKILL.
    """
    ddir = _resolve_dir(data_dir, default_data_dir())
    if not ddir.is_dir():
        return False
    with file_lock(ddir / _LOCK_FILE):
        pid = kraft.running_pid(ddir)
        if pid is not None:
            _logger.info("stopping broker pid %d", pid)
            _terminate(pid, ddir, timeout)
        remove_record(ddir)
        return pid is not None


def broker_status(data_dir: Path | None = None) -> BrokerHandle | None:
    """Return the broker recorded in ``data_dir`` if its process is alive, else None.

    ``data_dir`` defaults to :func:`default_data_dir`. Only the process is checked (no network round trip), so a
    broker that a concurrent :func:`start_broker` is still starting is reported as well.

    Does not block (beyond reading a few small files) and does not raise.
    """
    ddir = _resolve_dir(data_dir, default_data_dir())
    found = recorded_broker(ddir)
    return None if found is None else found[0]


# ------------------------------------------------------------------- internals

def _check_arguments(port: int, timeout: float, security: Security) -> None:
    if not 1 <= port <= 65534:
        raise ValueError(f"port must be in 1..65534, got {port}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if security not in SECURITY_MODES:
        raise ValueError(f"security must be one of {', '.join(SECURITY_MODES)}, got {security!r}")


def _refuse_running(handle: BrokerHandle, recorded_port: int, port: int, security: Security) -> str | None:
    """Why a start on ``port`` in ``security`` mode cannot return the broker already running from its
    directory (``handle``, on ``recorded_port``), or None when it can. Pure."""
    if recorded_port != port:
        return (f"a broker from {handle.data_dir} is already running at {handle.bootstrap_servers} (pid "
                f"{handle.pid}), not on port {port}; stop it first (`controlmsg broker stop`) or use port "
                f"{recorded_port}")
    if handle.security != security:
        return (f"a {handle.security} broker from {handle.data_dir} is already running at "
                f"{handle.bootstrap_servers} (pid {handle.pid}), not a {security} one; stop it first "
                "(`controlmsg broker stop`) or use another data directory")
    return None


def _settings(ddir: Path, port: int, controller_port: int, found: sec.BrokerSecrets | None) -> str:
    """The broker's ``server.properties``: plaintext, or (``found``: its passwords) secured. Pure."""
    if found is None:
        listeners = kraft.plain_listeners(port, controller_port)
    else:
        listeners = sec.server_listener_properties(ddir, port, controller_port, found, _HOST)
    return kraft.server_properties(ddir, controller_port, listeners)


def _write_settings(ddir: Path, port: int, controller_port: int,
                    security: Security) -> tuple[sec.BrokerSecrets | None, dict[str, Path]]:
    """Write the broker's settings into ``ddir``; secured, also its passwords (made once), a new CA and
    certificate, and the clients' properties files. Returns the passwords (None: plaintext) and user ->
    client properties file."""
    found: sec.BrokerSecrets | None = None
    client_properties: dict[str, Path] = {}
    if security == "sasl-ssl":
        found = sec.load_or_create_secrets(ddir)
        ca = sec.make_certificates(ddir, lambda cmd, what: kraft.run_tool_redacted(cmd, what, _OPENSSL_TIMEOUT))
        client_properties = sec.write_client_properties(ddir, f"{_HOST}:{port}", found, ca)
    kraft.write_node_settings(ddir, _settings(ddir, port, controller_port, found), private=found is not None)
    return found, client_properties


def _spawn(java: str, libs: Path, ddir: Path, port: int, controller_port: int, security: Security,
           client_properties: dict[str, Path]) -> BrokerHandle:
    """Start the broker JVM and record it (``broker.pid``, ``broker.json``); no wait. If it cannot be recorded,
    it is stopped and the error raised."""
    pid = kraft.spawn_node(java, libs, ddir)
    handle = BrokerHandle(bootstrap_servers=f"{_HOST}:{port}", pid=pid, data_dir=ddir,
                          log_path=ddir / kraft.LOG_FILE, security=security, client_properties=client_properties)
    try:
        write_text_atomic(ddir / kraft.PID_FILE, f"{pid}\n")
        write_text_atomic(ddir / JSON_FILE, json.dumps(record_json(handle, port, controller_port), indent=2) + "\n")
        _logger.info("started broker pid %d at %s", pid, handle.bootstrap_servers)
    except BaseException:
        _terminate(pid, ddir, 5.0)
        remove_record(ddir)
        raise
    return handle


def _controller_port(ddir: Path, port: int) -> int:
    """``port + 1`` when it is free, else a free port. Raises :class:`BrokerError` when ``port`` is taken."""
    if not port_free(port):
        raise BrokerError(
            f"port {port} on {_HOST} is already in use by another process "
            f"(not a broker recorded in {ddir}); choose another port or stop "
            "whatever is listening there"
        )
    if port_free(port + 1):
        return port + 1
    return free_ports(exclude={port})


def _kill_orphan(data_dir: Path) -> None:
    """Stop a broker of ``data_dir`` whose record is incomplete; clear stale files."""
    pid = kraft.running_pid(data_dir)
    if pid is not None:
        _logger.warning("stopping unrecorded broker pid %d from %s", pid, data_dir)
        _terminate(pid, data_dir, 10.0)
    remove_record(data_dir)


def _terminate(pid: int, data_dir: Path, timeout: float) -> None:
    """SIGTERM ``data_dir``'s broker ``pid``, wait ``timeout`` s, then SIGKILL it (only while ``pid`` still
    is that broker). Raises BrokerError if it survives SIGKILL."""
    kraft.terminate_node(pid, data_dir, timeout, what="broker process")


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
        remove_record(handle.data_dir)
        raise


def _wait_until_serving(handle: BrokerHandle, deadline: float) -> None:
    """Until the broker returns cluster metadata that lists a broker (secured: to the admin user)."""
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
        if tcp_accepts(host, port) and kraft.registered_nodes(_admin_settings(handle), min(5.0, remaining)):
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
