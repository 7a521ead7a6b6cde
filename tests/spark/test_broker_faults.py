"""Broker faults in the middle of a run, on real brokers: the run rides through and equals its oracle.

* One broker of its own (not the session's): paused with SIGSTOP for 12 s, stopped and started again,
  killed with ``kill -9`` and restarted, one after the other, as soon as the backfill's first intermediate
  topic holds records. The windowed-count pipeline (its three jobs in the test's Spark session) must complete and equal
  the oracle: nothing lost, nothing twice, end of stream once.
* A three-node cluster (replication factor 3, ``min.insync.replicas`` 2): the node leading partition 0 of
  the events topic is killed with ``kill -9`` mid-backfill and stays dead. (The same fault in a streaming
  pipeline stalled the streaming ingest in 2 of 8 runs; that test is on branch ``wip/stream-fault`` until
  the cause is found, see issue #11.)

The figures (how long the fault lasted, how long the run took) are printed, for ``pytest -s``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from pyspark.sql import SparkSession

from controlmsg.clusters.broker import BrokerHandle, start_broker, stop_broker
from controlmsg.clusters.kraft_cluster import (
    ClusterHandle,
    cluster_status,
    kill_node,
    start_kafka_cluster,
    stop_kafka_cluster,
)
from controlmsg.clusters.processes import free_ports
from controlmsg.errors import TopicError
from controlmsg.kafka import ControlReader
from controlmsg.kafka.admin import _AdminSession, _describe, create_topic, partition_count, wait_for_topic
from controlmsg.kafka.refusals import DEFAULT_GRACE_S
from spark_jobs.common import topic_names

from .helpers import read, write
from .test_pipeline_oracle import assert_matches_oracle, run_pipeline_in_session, write_events
from .test_streaming_pipeline import generated_source

# beside: a paused broker, restarts, and a dead node's leadership moving on (35-60% of the machine busy in CI):
# make test runs them in its second lane (tests/lanes.py).
pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.beside]

PAUSE_S = 12.0  # longer than librdkafka's 10 s request timeout: requests time out and are retried (docs/FAULTS.md)
EVENTS = 15_000


class Fault(threading.Thread):
    """Runs ``action`` once ``topic`` exists and holds a record (the run is writing it), in the background;
    keeps when it fired, how long it took, and what it raised. It waits as long as the run goes on (a
    loaded machine may take minutes to start the jobs): :meth:`run_ended` ends the wait without firing."""

    WAIT_S = 600.0

    def __init__(self, config: dict[str, Any], topic: str, action: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.config, self.topic, self.action = config, topic, action
        self.fired_at: float | None = None
        self.took = 0.0
        self.error: BaseException | None = None
        self._ended = threading.Event()

    def run_ended(self, timeout: float = 120.0) -> None:
        """The run is over: stop waiting (a fault that has not fired never will), and wait for the thread."""
        self._ended.set()
        self.join(timeout)

    def _waiting(self, deadline: float, what: str) -> bool:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {self.WAIT_S:.0f} s")
        return not self._ended.is_set()

    def run(self) -> None:
        try:
            if not self._wait_for_records():
                return
            self.fired_at = time.monotonic()
            self.action()
            self.took = time.monotonic() - self.fired_at
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _exists(self) -> bool:
        """Whether the topic exists; a cluster too busy to answer within 5 s counts as not yet (the probe
        asks again: it must not fail the test for the cluster's slowness, only the run may)."""
        try:
            return partition_count(self.config, self.topic, timeout=5) is not None
        except TopicError:
            return False

    def _wait_for_records(self) -> bool:
        """True once the topic holds a record; False if the run ended first."""
        deadline = time.monotonic() + self.WAIT_S
        while not self._exists():
            if not self._waiting(deadline, f"topic {self.topic} did not appear"):
                return False
            time.sleep(0.02)
        consumer = Consumer({**self.config, "group.id": "fault-probe"})
        try:
            while self._waiting(deadline, f"topic {self.topic} held no record"):
                with contextlib.suppress(KafkaException):
                    if any(consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2)[1] > 0
                           for p in range(2)):
                        return True
                time.sleep(0.01)
        finally:
            consumer.close()
        return False


def _backfill_under_fault(spark: SparkSession, servers: str, tmp_path: Path, action: Callable[[str], None], *,
                          partitions: int = 2, on_records: bool = True) -> tuple[Fault, float]:
    """The windowed-count backfill over :data:`EVENTS` events, with ``action(events_topic)`` fired once its events
    topic holds records; asserts that it struck mid-run and that the output equals the oracle. Returns the
    fault and the run's duration."""
    src = tmp_path / "events.jsonl"
    write_events(src, EVENTS, days=20, keys=50, seed=11)
    output = str(tmp_path / "out.csv")
    opts: dict[str, Any] = dict(input_path=str(src), key="key", event_time="ts", window="1d", sums=["x"])
    fault = _FaultOnNewTopic({"bootstrap.servers": servers}, action, on_records=on_records)
    fault.start()
    started = time.monotonic()
    try:
        summary = run_pipeline_in_session(spark, servers, output=output, partitions=partitions, tasks=2, **opts)
    finally:
        took = time.monotonic() - started
        fault.run_ended()
    assert fault.error is None, f"the fault itself failed: {fault.error!r}"
    assert fault.fired_at is not None, "the run ended before the fault could strike"
    assert fault.fired_at - started < took  # it struck mid-run
    rows = assert_matches_oracle(spark, output, **opts)
    assert rows > 20 * 5 and summary["sink"]["rows_out"] == rows
    assert summary["ingest"]["rows_in"] == EVENTS
    print(f"\nfault fired {fault.fired_at - started:.1f} s into the run, lasted {fault.took:.1f} s; "
          f"the run took {took:.1f} s")
    return fault, took


class _FaultOnNewTopic(Fault):
    """A :class:`Fault` on the first ``t-*-events`` topic created after it starts (the in-session pipeline
    names its topics after a run id of its own); ``action`` gets that topic. ``on_records`` false: it
    strikes once the topic exists, without waiting for records (on three nodes a leader may not answer
    for a new topic's offsets until the run, 15k events, is over: seen once in CI)."""

    def __init__(self, config: dict[str, Any], action: Callable[[str], None], *, on_records: bool = True) -> None:
        super().__init__(config, "", lambda: action(self.topic))
        self._before = set(AdminClient(config).list_topics(timeout=30).topics)
        self.on_records = on_records

    def _wait_for_records(self) -> bool:
        admin = AdminClient(self.config)
        deadline = time.monotonic() + self.WAIT_S
        while not self.topic:
            new: list[str] = []
            with contextlib.suppress(KafkaException):  # a busy cluster: ask again
                new = [t for t in admin.list_topics(timeout=10).topics
                       if t not in self._before and t.startswith("t-") and t.endswith("-events")]
            if new:
                self.topic = new[0]
            elif not self._waiting(deadline, "no events topic appeared"):
                return False
            else:
                time.sleep(0.02)
        return super()._wait_for_records() if self.on_records else not self._ended.is_set()


# ------------------------------------------------------------------------------------ a single broker


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    data_dir = tmp_path_factory.mktemp("fault-broker")
    handle = start_broker(port=free_ports(2), data_dir=data_dir)
    try:
        yield handle
    finally:
        stop_broker(data_dir)


def _port(handle: BrokerHandle) -> int:
    return int(handle.bootstrap_servers.rpartition(":")[2])


def _pause(handle: BrokerHandle) -> Callable[[str], None]:
    def act(_topic: str) -> None:
        os.kill(handle.pid, signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)
        finally:
            os.kill(handle.pid, signal.SIGCONT)
    return act


def _stop_start(handle: BrokerHandle) -> Callable[[str], None]:
    def act(_topic: str) -> None:
        stop_broker(handle.data_dir)
        start_broker(port=_port(handle), data_dir=handle.data_dir)
    return act


def _kill_restart(handle: BrokerHandle) -> Callable[[str], None]:
    def act(_topic: str) -> None:
        current = start_broker(port=_port(handle), data_dir=handle.data_dir)  # the live one (pid may have changed)
        os.kill(current.pid, signal.SIGKILL)
        time.sleep(2.0)
        start_broker(port=_port(handle), data_dir=handle.data_dir)
    return act


def test_backfill_rides_through_a_pause_a_restart_and_a_kill_9_of_its_only_broker(
        own_broker: BrokerHandle, spark: SparkSession, tmp_path: Path) -> None:
    """One backfill; once its events topic holds records, its only broker is paused for 12 s, then stopped
    and started again, then killed with ``kill -9`` and restarted, one fault right after the other (one run
    for the three, where each had a run of its own until 2026-11-27)."""
    faults = [_pause(own_broker), _stop_start(own_broker), _kill_restart(own_broker)]

    def in_a_row(topic: str) -> None:
        for fault in faults:
            fault(topic)

    struck, took = _backfill_under_fault(spark, own_broker.bootstrap_servers, tmp_path, in_a_row)
    assert struck.took >= PAUSE_S and took > PAUSE_S  # the run waited for the broker, not around it


def test_a_read_planned_while_its_broker_restarts_waits_when_its_application_wrote_to_it(
        own_broker: BrokerHandle, spark: SparkSession) -> None:
    """The CI failure of 2026-11-29, made certain: a job's first read plans in a Python worker that never
    reached the cluster (the application's writes planned and ran in other workers), while the broker is
    down for longer than the first-contact grace. The read waits for the broker, as the write's steps would
    (controlmsg.kafka.reached), instead of raising "connection refused" after 10 s."""
    servers = f"localhost:{_port(own_broker)}"  # a name no worker of this session has used for this broker
    topic = f"reached-{uuid.uuid4().hex[:8]}"
    create_topic({"bootstrap.servers": servers}, topic, 2)
    write(spark.range(100, numPartitions=2).selectExpr("id AS n"), topic, servers)
    stop_broker(own_broker.data_dir)
    outcome: dict[str, Any] = {}

    def read_back() -> None:
        try:
            outcome["rows"] = sorted(r.n for r in read(spark, topic, servers, schema="n long").collect())
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    reader = threading.Thread(target=read_back, daemon=True)
    reader.start()
    try:
        time.sleep(DEFAULT_GRACE_S + 5)  # refused connections at the read's planning, past the grace
        assert reader.is_alive(), f"the read ended while its broker was down: {outcome}"
    finally:
        start_broker(port=_port(own_broker), data_dir=own_broker.data_dir)
    reader.join(120)
    assert "error" not in outcome, f"the read failed: {outcome['error']!r}"
    assert outcome["rows"] == list(range(100))


# ------------------------------------------------------------------------------------ three nodes


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlmsg.cli", *args], capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    """Three nodes, started as a user would: ``controlmsg broker start --brokers 3``."""
    data_dir = tmp_path_factory.mktemp("kraft3")
    port = free_ports(3)
    started = _cli("broker", "start", "--brokers", "3", "--port", str(port), "--data-dir", str(data_dir))
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert started.stdout.strip() == ",".join(f"127.0.0.1:{port + i}" for i in range(3))
        handle = cluster_status(data_dir)
        assert handle is not None and all(n.pid is not None for n in handle.nodes)
        yield handle
    finally:
        stop_kafka_cluster(data_dir)


def test_cluster_topics_are_replicated_and_a_dead_node_is_reported(cluster: ClusterHandle) -> None:
    live = _all_nodes_up(cluster)
    config: dict[str, Any] = {"bootstrap.servers": live.bootstrap_servers}
    default, custom = f"rf-default-{uuid.uuid4().hex[:6]}", f"rf-two-{uuid.uuid4().hex[:6]}"
    assert _cli("create-topic", "--bootstrap-servers", live.bootstrap_servers, "--topic", default,
                "--partitions", "2").returncode == 0
    made = _cli("create-topic", "--bootstrap-servers", live.bootstrap_servers, "--topic", custom, "--partitions", "2",
                "--replication-factor", "2", "--topic-config", "min.insync.replicas=1")
    assert made.returncode == 0, made.stderr
    assert _replicas(config, default) == {3} and _replicas(config, custom) == {2}
    resource = ConfigResource(ConfigResource.Type.TOPIC, custom)
    admin = AdminClient(config)  # alive until the answer is in: a collected client cancels its requests
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    assert described["min.insync.replicas"].value == "1"
    kill_node(live.data_dir, 3)
    try:
        status = _cli("broker", "status", "--data-dir", str(live.data_dir))
        assert status.returncode == 0
        assert status.stdout.strip() == ",".join(n.address for n in live.nodes[:2])
        assert "node(s) 3 of 3 are down" in status.stderr
    finally:
        _all_nodes_up(live)


def test_topic_admin_outlives_the_node_its_client_knew_as_controller(cluster: ClusterHandle) -> None:
    """An admin client sends CreateTopics and DescribeTopics to the node its metadata named controller,
    and waits for that node when it dies (seen in CI: the backfill's ``create_topic`` failed "Failed while
    waiting for controller" after a node was killed). Describes and creates answer with that node still dead."""
    live = _all_nodes_up(cluster)
    config: dict[str, Any] = {"bootstrap.servers": live.bootstrap_servers}
    topic = f"ctrl-{uuid.uuid4().hex[:6]}"
    create_topic(config, topic, 3)
    stale = AdminClient(config)
    controller = stale.list_topics(timeout=10).controller_id
    kill_node(live.data_dir, controller)
    try:
        # The stale client is stuck on the dead node (the fault this test is about), once it has noticed.
        # A request in flight as the node died fails first with a transport failure (seen in CI): the
        # client has not noticed yet, so ask again.
        deadline = time.monotonic() + 30
        while True:
            try:
                stale.describe_topics(TopicCollection([topic]), request_timeout=3)[topic].result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._TRANSPORT:
                    assert "controller" in exc.args[0].str(), exc
                    break
            assert time.monotonic() < deadline, f"the client never lost node {controller}"
            time.sleep(0.2)
        # The session answers with the node still dead. Whether its first try, with the stale client, already
        # succeeds depends on when that client next refreshes its metadata (seen in CI both ways); that each
        # try after a failed one asks with a new client is tests/unit/test_retry.py's.
        session = _AdminSession(config, stale)
        assert _describe(session, topic, timeout=30) == 3
        create_topic(config, f"{topic}-after", 2)  # create and describe, with the node still dead
        # Another client may see the new topic a little later (a live node's metadata catching up: one
        # describe right after the create found nothing in CI), so it is waited for, not asked once.
        assert wait_for_topic(config, f"{topic}-after", timeout=30) == 2
    finally:
        _all_nodes_up(live)


def _leader(config: dict[str, Any], topic: str, partition: int = 0, timeout: float = 30.0) -> int:
    """The node leading ``partition`` of ``topic``, asked again while the metadata of a topic created a
    moment ago does not list the partition or its leader yet."""
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(KafkaException):
            found = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(partition)
            if found is not None and found.leader >= 0:
                return int(found.leader)
        assert time.monotonic() < deadline, f"no leader of {topic}[{partition}] within {timeout:g} s"
        time.sleep(0.1)


def _replicas(config: dict[str, Any], topic: str) -> set[int]:
    """The replica counts of ``topic``'s partitions. A node learns of a new topic from the controller's
    metadata log a moment after it was created (seen in CI: no partitions yet on the node asked), so this
    asks until the topic shows partitions, for at most 30 s."""
    admin = AdminClient(config)
    deadline = time.monotonic() + 30
    while True:
        partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
        if partitions or time.monotonic() > deadline:
            return {len(p.replicas) for p in partitions.values()}
        time.sleep(0.2)


def _all_nodes_up(cluster: ClusterHandle) -> ClusterHandle:
    return start_kafka_cluster(len(cluster.nodes), port=cluster.nodes[0].port, data_dir=cluster.data_dir)


def test_backfill_on_three_nodes_survives_a_leader_killed(cluster: ClusterHandle, spark: SparkSession,
                                                          tmp_path: Path) -> None:
    live = _all_nodes_up(cluster)
    config = {"bootstrap.servers": live.bootstrap_servers}
    killed: list[tuple[int, str]] = []

    def kill_leader(topic: str) -> None:
        node = _leader(config, topic)
        kill_node(live.data_dir, node)
        killed.append((node, topic))

    # Struck when the events topic appears (ingest is about to write), not at its first record: see
    # _FaultOnNewTopic.
    _backfill_under_fault(spark, live.bootstrap_servers, tmp_path, kill_leader, partitions=3, on_records=False)
    node, topic = killed[0]
    status = cluster_status(live.data_dir)
    assert status is not None and status.node(node).pid is None  # it stayed dead through the run
    assert _replicas(config, topic) == {3}
    print(f"node {node} was the leader of {topic}[0]; the run finished on the two nodes left")


def test_streaming_on_three_nodes_survives_a_leader_killed(cluster: ClusterHandle, spark: SparkSession,
                                                           tmp_path: Path) -> None:
    """The streaming pipeline (three Spark applications) over 2,500 paced events; the leader of partition 0
    of the keyed events topic is killed once records flow into it (the ingest job writes it, the window job
    reads it), and the output still equals the oracle."""
    live = _all_nodes_up(cluster)
    servers = live.bootstrap_servers
    config: dict[str, Any] = {"bootstrap.servers": servers}
    source = f"raw-{uuid.uuid4().hex[:8]}"
    create_topic(config, source, 3)
    events = generated_source(config, source, tmp_path, events=2500, keys=30, disorder_ms=2000, late_fraction=0.0,
                              late_by_ms=0, seed=5)
    output = tmp_path / "windows.csv"
    run_id = f"kill-{uuid.uuid4().hex[:8]}"
    events_topic, windows = topic_names(run_id)
    killed: list[int] = []

    def kill_leader() -> None:
        node = _leader(config, events_topic)
        kill_node(live.data_dir, node)
        killed.append(node)

    fault = Fault(config, events_topic, kill_leader)
    fault.start()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--streaming", "--source-topic", source,
         "--until-source-end", "--key", "user", "--event-time", "event_time", "--window", "1m", "--sum", "amount",
         "--allowed-lateness", "1h", "--watermark-interval", "300ms", "--output", str(output), "--max-rate", "200",
         "--stall-limit", "20s",  # a wedged transaction call is retried after 20 s, not the default 180 s
         "--bootstrap-servers", servers, "--partitions", "3", "--tasks", "2", "--master", "local[2]",
         "--timeout", "480", "--run-id", run_id, "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=900, check=False,
    )
    took = time.monotonic() - started
    fault.run_ended()
    assert done.returncode == 0, done.stderr[-3000:]
    assert fault.error is None, f"the fault itself failed: {fault.error!r}"
    assert fault.fired_at is not None, "the run ended before the fault could strike"
    assert killed and fault.fired_at - started < took
    rows = assert_matches_oracle(spark, str(output), input_path=str(events), key="user", event_time="event_time",
                                 window="1m", sums=["amount"])
    assert rows > 30
    # End of stream arrived once per upstream task on every partition of the window results.
    with ControlReader(config, windows, run_id=run_id) as reader:
        list(reader.read_until_end(timeout=60))
        assert reader.tracker.is_ended
        assert reader.tracker.counters.duplicate_eos == 0
    wedged = [line for job in ("stream_ingest", "stream_window")
              for line in (tmp_path / "run" / f"{job}.log").read_text(errors="replace").splitlines()
              if "has not turned its loop" in line]
    print("\n".join(["", *wedged]))  # the watchdog ended a worker: the task was retried from its commit
    quiet = [float(line.split("has not turned its loop for ")[1].split(" s")[0]) for line in wedged]
    assert all(s < 60 for s in quiet), f"--stall-limit 20s did not reach the jobs: {wedged}"
    print(f"\nnode {killed[0]} (leader of {events_topic}[0]) killed {fault.fired_at - started:.1f} s into the "
          f"streaming run; the run took {took:.1f} s")
