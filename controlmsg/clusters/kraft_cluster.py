"""A local replicated Apache Kafka cluster: several KRaft nodes on one machine, for tests and demos.

Every node is both a broker and a controller (a controller quorum of all nodes), runs from the same
Maven Central jars as :mod:`controlmsg.clusters.broker`, with the same settings (:mod:`controlmsg.clusters.kraft`),
and listens on ``127.0.0.1`` only. With three
nodes: topics default to replication factor 3 and ``min.insync.replicas`` 2, and so do the internal
topics (consumer offsets, transaction state), so any one node may die without losing a committed write
or a transaction; unclean leader election is off.

Layout on disk (``<data_dir>``, by default :func:`controlmsg.clusters.broker.default_data_dir`):

* ``cluster.json``: the node count, the cluster id, and each node's client and controller port (fixed at
  the first start; the quorum's addresses must not change);
* ``node-<id>/``: one node, laid out like a single broker's directory (``server.properties``,
  ``broker.log``, ``broker.pid``, the storage in ``logs/``).

Node ``i`` (1-based) serves clients on ``port + i - 1``. The functions that stop, kill, pause and resume a
single node are what the fault tests use; :func:`start_kafka_cluster` starts whichever nodes are down, so
it also brings a killed node back. Plaintext only (the secured single broker is
``start_broker(security="sasl-ssl")``). POSIX only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlmsg.clusters import broker as _broker
from controlmsg.clusters import kraft
from controlmsg.clusters.kafka_jars import KAFKA_VERSION, ensure_kafka_libs
from controlmsg.clusters.processes import (
    file_lock,
    free_ports,
    java_executable,
    log_tail,
    make_directory,
    pid_alive,
    port_free,
    write_text_atomic,
)
from controlmsg.errors import BrokerError

__all__ = [
    "ClusterHandle",
    "NodeHandle",
    "cluster_status",
    "is_cluster_dir",
    "kill_node",
    "pause_node",
    "resume_node",
    "start_kafka_cluster",
    "stop_kafka_cluster",
    "stop_node",
]

_HOST = kraft.HOST
_CLUSTER_FILE = "cluster.json"
_LOCK_FILE = ".cluster.lock"

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeHandle:
    """One node of a local cluster.

    Attributes:
        node_id: The KRaft node id (1-based).
        port: Its client port on 127.0.0.1.
        controller_port: Its controller (quorum) port.
        data_dir: The node's directory.
        pid: The JVM's pid, or None when the node is not running.
    """

    node_id: int
    port: int
    controller_port: int
    data_dir: Path
    pid: int | None

    @property
    def log_path(self) -> Path:
        return self.data_dir / kraft.LOG_FILE

    @property
    def address(self) -> str:
        return f"{_HOST}:{self.port}"


@dataclass(frozen=True)
class ClusterHandle:
    """A local cluster: ``bootstrap_servers`` lists every node (``host:port,...``)."""

    data_dir: Path
    cluster_id: str
    nodes: tuple[NodeHandle, ...]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> NodeHandle:
        """The node ``node_id``; raises :class:`ValueError` for an id the cluster does not have."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ValueError(f"the cluster in {self.data_dir} has nodes 1..{len(self.nodes)}, not {node_id}")


# ------------------------------------------------------------------------------------------- public


def is_cluster_dir(data_dir: Path | None = None) -> bool:
    """True if ``data_dir`` (default: the broker directory) holds a multi-node cluster. Does not raise."""
    return (_resolve(data_dir) / _CLUSTER_FILE).is_file()


def start_kafka_cluster(brokers: int = 3, port: int = 9092, data_dir: Path | None = None,
                        timeout: float = 120.0) -> ClusterHandle:
    """Start the nodes of a ``brokers``-node KRaft cluster that are not running, and wait until every node
    is registered and serves.

    The first start fixes the layout (node ``i`` on ``port + i - 1``, controller ports chosen free and
    recorded in ``cluster.json``) and formats every node's storage with one cluster id; later starts reuse
    it and must ask for the same ``brokers`` and ``port``. Idempotent: running nodes are left alone, so
    this also restarts a node that was stopped or killed.

    Blocks: until the cluster's metadata lists every node, up to ``timeout`` seconds (not counting the
    one-time download of the Kafka jars).

    Raises:
        BrokerError: the directory holds a single broker or a cluster of another size or port; a client
            or controller port is taken; ``java`` is missing; formatting fails; a node exits or the
            cluster does not serve within ``timeout`` (the message names the node and ends with the tail
            of its log; the nodes started by this call are stopped).
        ValueError: ``brokers`` < 2, or the ports do not fit in 1..65535.
    """
    if brokers < 2:
        raise ValueError(f"a cluster has at least 2 nodes, got {brokers} (one broker: start_broker)")
    if not 1 <= port <= 65535 - brokers:
        raise ValueError(f"port must be in 1..{65535 - brokers}, got {port}")
    ddir = make_directory(_resolve(data_dir), "the cluster directory")
    if kraft.is_formatted(ddir) or _broker.broker_status(ddir) is not None:
        raise BrokerError(f"{ddir} holds a single broker, not a cluster; use another --data-dir")
    with file_lock(ddir / _LOCK_FILE):
        layout = _layout(ddir, brokers, port)
        libs = ensure_kafka_libs()
        java = java_executable()
        deadline = time.monotonic() + timeout
        started: list[int] = []
        nodes = []
        try:
            for node in layout.nodes:
                if node.pid is None:
                    # The pid we spawned: a JVM that is still exec'ing may not show its command line yet.
                    node = replace(node, pid=_start_node(layout, node, java, libs, deadline))
                    started.append(node.node_id)
                nodes.append(node)
            handle = replace(layout, nodes=tuple(nodes))
            _wait_until_serving(handle, deadline)
        except BaseException:
            for node_id in started:
                with contextlib.suppress(BrokerError):
                    _stop(ddir, node_id, 5.0)
            raise
        return handle


def stop_kafka_cluster(data_dir: Path | None = None, timeout: float = 30.0) -> int:
    """Stop every running node of the cluster in ``data_dir`` (SIGTERM to all at once, SIGKILL after
    ``timeout``); the storage is kept. Returns how many nodes were running. Raises :class:`BrokerError`
    if a node survives SIGKILL."""
    ddir = _resolve(data_dir)
    if not (ddir / _CLUSTER_FILE).is_file():
        return 0
    with file_lock(ddir / _LOCK_FILE):
        handle = _handle(ddir)
        running = [n for n in handle.nodes if n.pid is not None]
        for node in running:  # all at once: a node waiting for a quorum that is going away
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.pid or 0, signal.SIGTERM)
        for node in running:
            kraft.terminate_node(node.pid or 0, node.data_dir, timeout, what=f"node {node.node_id} process")
            (node.data_dir / kraft.PID_FILE).unlink(missing_ok=True)
        return len(running)


def cluster_status(data_dir: Path | None = None) -> ClusterHandle | None:
    """The cluster recorded in ``data_dir`` with each node's pid (None: not running), or None when the
    directory holds no cluster. Checks processes only (no network). Does not raise."""
    ddir = _resolve(data_dir)
    try:
        return _handle(ddir)
    except BrokerError:
        return None


def stop_node(data_dir: Path | None, node_id: int, timeout: float = 30.0) -> bool:
    """Stop node ``node_id`` cleanly (SIGTERM, SIGKILL after ``timeout``). False if it was not running."""
    ddir = _resolve(data_dir)
    with file_lock(ddir / _LOCK_FILE):
        return _stop(ddir, node_id, timeout)


def kill_node(data_dir: Path | None, node_id: int) -> bool:
    """``kill -9`` node ``node_id`` (no clean shutdown, as a crashed machine). False if it was not running."""
    return _signal(data_dir, node_id, signal.SIGKILL)


def pause_node(data_dir: Path | None, node_id: int) -> bool:
    """SIGSTOP node ``node_id``: it keeps its connections but answers nothing (a long GC pause, a frozen VM)."""
    return _signal(data_dir, node_id, signal.SIGSTOP)


def resume_node(data_dir: Path | None, node_id: int) -> bool:
    """SIGCONT node ``node_id`` after :func:`pause_node`."""
    return _signal(data_dir, node_id, signal.SIGCONT)


# ---------------------------------------------------------------------------------------- internals


def _resolve(data_dir: Path | None) -> Path:
    return (data_dir if data_dir is not None else _broker.default_data_dir()).expanduser().resolve()


def _read_record(ddir: Path) -> dict[str, Any]:
    try:
        record = json.loads((ddir / _CLUSTER_FILE).read_text(encoding="utf-8"))
        _ = [(int(n["node_id"]), int(n["port"]), int(n["controller_port"])) for n in record["nodes"]]
        str(record["cluster_id"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BrokerError(f"{ddir / _CLUSTER_FILE} is missing or unreadable: {exc}") from exc
    return dict(record)


def _handle(ddir: Path) -> ClusterHandle:
    record = _read_record(ddir)
    nodes = []
    for n in record["nodes"]:
        node_dir = ddir / f"node-{int(n['node_id'])}"
        nodes.append(NodeHandle(node_id=int(n["node_id"]), port=int(n["port"]),
                                controller_port=int(n["controller_port"]), data_dir=node_dir,
                                pid=kraft.running_pid(node_dir)))
    return ClusterHandle(data_dir=ddir, cluster_id=str(record["cluster_id"]), nodes=tuple(nodes))


def _layout(ddir: Path, brokers: int, port: int) -> ClusterHandle:
    """The recorded layout (checked against the request), or a new one written to ``cluster.json``."""
    if (ddir / _CLUSTER_FILE).is_file():
        handle = _handle(ddir)
        if len(handle.nodes) != brokers or handle.nodes[0].port != port:
            raise BrokerError(
                f"{ddir} holds a {len(handle.nodes)}-node cluster on port {handle.nodes[0].port}, not "
                f"{brokers} nodes on port {port}; use those values or another --data-dir"
            )
        return handle
    client_ports = [port + i for i in range(brokers)]
    taken = [p for p in client_ports if not port_free(p)]
    if taken:
        raise BrokerError(f"port(s) {', '.join(map(str, taken))} on {_HOST} are in use; choose another --port")
    controller_ports: list[int] = []
    for _ in range(brokers):
        controller_ports.append(free_ports(exclude={*client_ports, *controller_ports}))
    record = {
        "cluster_id": kraft.new_cluster_id(),
        "kafka_version": KAFKA_VERSION,
        "nodes": [{"node_id": i + 1, "port": client_ports[i], "controller_port": controller_ports[i]}
                  for i in range(brokers)],
    }
    write_text_atomic(ddir / _CLUSTER_FILE, json.dumps(record, indent=2) + "\n")
    return _handle(ddir)


_PORT_WAIT_S = 70.0
"""How long a node's start waits for its ports to come free: a minute of TIME_WAIT, and some."""


def _start_node(cluster: ClusterHandle, node: NodeHandle, java: str, libs: Path, deadline: float) -> int:
    ndir = node.data_dir
    ndir.mkdir(parents=True, exist_ok=True)
    for p in (node.port, node.controller_port):
        # A node just killed leaves its ports held for a moment (connections closing, TIME_WAIT).
        waited = time.monotonic()
        while not port_free(p):
            if time.monotonic() >= min(deadline, waited + _PORT_WAIT_S):
                raise BrokerError(f"node {node.node_id}: port {p} on {_HOST} is in use by another process "
                                  f"(waited {time.monotonic() - waited:.0f} s)")
            time.sleep(0.5)
    voters = ",".join(f"{n.node_id}@{_HOST}:{n.controller_port}" for n in cluster.nodes)
    listeners = kraft.plain_listeners(node.port, node.controller_port)
    kraft.write_node_settings(ndir, kraft.server_properties(ndir, node.controller_port, listeners, node_id=node.node_id,
                                                            voters=voters, brokers=len(cluster.nodes)))
    if not kraft.is_formatted(ndir):
        kraft.format_storage(java, libs, ndir, deadline, cluster_id=cluster.cluster_id)
    pid = kraft.spawn_node(java, libs, ndir)
    write_text_atomic(ndir / kraft.PID_FILE, f"{pid}\n")
    _logger.info("started node %d (pid %d) at %s", node.node_id, pid, node.address)
    return pid


def _stop(ddir: Path, node_id: int, timeout: float) -> bool:
    node = _handle(ddir).node(node_id)
    if node.pid is None:
        return False
    kraft.terminate_node(node.pid, node.data_dir, timeout, what=f"node {node_id} process")
    (node.data_dir / kraft.PID_FILE).unlink(missing_ok=True)
    return True


def _signal(data_dir: Path | None, node_id: int, sig: signal.Signals) -> bool:
    node = _handle(_resolve(data_dir)).node(node_id)
    if node.pid is None:
        return False
    os.kill(node.pid, sig)
    if sig == signal.SIGKILL:
        while pid_alive(node.pid):
            time.sleep(0.05)
    return True


def _wait_until_serving(handle: ClusterHandle, deadline: float) -> None:
    """Until the metadata that any node returns lists every node; a node that exits fails at once."""
    want = {n.node_id for n in handle.nodes}
    seen: set[int] = set()
    while True:
        for node in handle.nodes:
            if node.pid is None or not pid_alive(node.pid):
                raise BrokerError(f"node {node.node_id} of the cluster in {handle.data_dir} exited during startup"
                                  + log_tail(node.log_path))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(want - seen)
            tails = "".join(log_tail(handle.node(i).log_path) for i in missing[:1])
            raise BrokerError(f"the cluster in {handle.data_dir} did not serve in time: nodes {missing} are not "
                              f"registered" + tails)
        seen = kraft.registered_nodes({"bootstrap.servers": handle.bootstrap_servers}, min(5.0, remaining)) or seen
        if want <= seen:
            return
        time.sleep(0.3)
