"""What a local broker's data directory records of it (:mod:`controlmsg.clusters.broker`): its handle, kept in
``broker.json`` beside the KRaft node's ``broker.pid``, and the security mode its storage was formatted in.
A record is only taken for a live broker: one whose pid file and ``broker.json`` name the same running
process. Reads never raise; the files are written by :mod:`controlmsg.clusters.broker`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from controlmsg.clusters import kraft
from controlmsg.clusters.kafka_jars import KAFKA_VERSION
from controlmsg.clusters.security import Security

__all__ = ["BrokerHandle"]

JSON_FILE: Final = "broker.json"
# Written after a secured format: its storage holds SCRAM users, a plain one has none.
STORAGE_SECURITY_FILE: Final = "storage.security"


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


def record_json(handle: BrokerHandle, port: int, controller_port: int) -> dict[str, Any]:
    """What ``broker.json`` holds of a started broker. Pure."""
    return {
        "bootstrap_servers": handle.bootstrap_servers,
        "pid": handle.pid,
        "port": port,
        "controller_port": controller_port,
        "kafka_version": KAFKA_VERSION,
        "security": handle.security,
        "client_properties": {user: str(path) for user, path in handle.client_properties.items()},
    }


def storage_security(data_dir: Path) -> Security:
    """The mode the storage of ``data_dir`` was formatted in (no marker: plaintext, as before markers)."""
    try:
        text = (data_dir / STORAGE_SECURITY_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return "plaintext"
    return "sasl-ssl" if text == "sasl-ssl" else "plaintext"


def recorded_broker(data_dir: Path) -> tuple[BrokerHandle, int] | None:
    """The live broker recorded in ``data_dir`` and its port, if there is one."""
    pid = kraft.running_pid(data_dir)
    try:
        record = json.loads((data_dir / JSON_FILE).read_text(encoding="utf-8"))
        rec_pid, bootstrap, port = record["pid"], record["bootstrap_servers"], record["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(rec_pid, int) and isinstance(bootstrap, str) and isinstance(port, int) and rec_pid == pid):
        return None
    security: Security = "sasl-ssl" if record.get("security") == "sasl-ssl" else "plaintext"
    paths = record.get("client_properties")
    client_properties = (
        {str(user): Path(path) for user, path in paths.items() if isinstance(path, str)}
        if isinstance(paths, dict) else {}
    )
    return BrokerHandle(bootstrap_servers=bootstrap, pid=rec_pid, data_dir=data_dir,
                        log_path=data_dir / kraft.LOG_FILE, security=security,
                        client_properties=client_properties), port


def remove_record(data_dir: Path) -> None:
    """Remove ``broker.pid`` and ``broker.json`` from ``data_dir`` (those that are there)."""
    for name in (kraft.PID_FILE, JSON_FILE):
        (data_dir / name).unlink(missing_ok=True)
