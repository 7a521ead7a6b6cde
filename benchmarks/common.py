"""What the benchmark scripts share: the Kafka cluster of a run, and the harness of the streaming chain's
benchmarks (``bench_streaming.py``, ``bench_stages.py``): the :class:`Observer` threads, the :class:`Chain` of
two applications run as jobs, and the steps every live phase takes (:func:`run_live`, its generator run by
``harness.run_generator``) and every bounded one starts with (:func:`prefill`).

Imported by the scripts as a sibling module (``python benchmarks/<script>.py`` puts this directory first
on ``sys.path``).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from harness import run_generator

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.jobs import Job
from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.clusters.processes import free_ports
from controlmsg.core.codec import decode_json_payload
from controlmsg.core.durations import parse_duration
from controlmsg.core.events import StreamEnded, WatermarkAdvanced
from controlmsg.errors import ReadError
from controlmsg.kafka import ControlReader, DataRecord, create_topic
from controlmsg.kafka.settings import add_client_options, client_config_from_args, write_properties
from spark_jobs.common import topic_names

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from controlmsg.kafka import Item
    from spark_jobs.generate import GeneratorConfig

DAY_MS = 86_400_000
EVENTS_START_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z, the first day of the synthetic events


@dataclass(frozen=True)
class Cluster:
    """The cluster a benchmark runs against: its client settings, and the same settings in a properties
    file (0600) for the jobs the benchmark starts, so that no secret is on a command line."""

    config: dict[str, str]
    properties: Path

    @property
    def servers(self) -> str:
        return self.config["bootstrap.servers"]


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap-servers``, ``-X key=value`` and ``--kafka-config PATH``, as every controlmsg command."""
    add_client_options(parser, bootstrap_help="the Kafka cluster (default: bootstrap.servers of -X or "
                                              "--kafka-config, else $KAFKA_BOOTSTRAP_SERVERS, else a broker "
                                              "started for the run)")


def cluster_given(args: argparse.Namespace) -> bool:
    """Whether the options or ``$KAFKA_BOOTSTRAP_SERVERS`` name a cluster (else a benchmark starts a broker)."""
    if args.bootstrap_servers or args.kafka_config or os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip():
        return True
    return any(s.partition("=")[0].strip() == "bootstrap.servers" for s in args.kafka_settings)


@contextlib.contextmanager
def kafka_cluster(args: argparse.Namespace) -> Iterator[Cluster]:
    """The cluster the options (or ``$KAFKA_BOOTSTRAP_SERVERS``) name, resolved as every controlmsg command
    does; without one, a local broker started here on a free port for the run (stopped and its data
    removed on exit). Says which on stdout."""
    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-kafka-"))
    try:
        if cluster_given(args):
            config = client_config_from_args(args, default_servers=local_bootstrap_servers)
            print(f"broker: {config['bootstrap.servers']} (given)", flush=True)
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
            return
        from controlmsg.clusters.broker import start_broker, stop_broker

        data_dir = work / "broker"
        started = time.monotonic()
        handle = start_broker(port=free_ports(), data_dir=data_dir)
        print(f"broker: started {handle.bootstrap_servers} ({time.monotonic() - started:.1f} s)", flush=True)
        try:
            config = {"bootstrap.servers": handle.bootstrap_servers}
            yield Cluster(config, write_properties(config, work / "kafka.properties"))
        finally:
            stop_broker(data_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)



class PlainReader:
    """Reads every partition of a topic of plain records (not controlmsg envelopes, e.g. what Spark's own
    Kafka connector writes) from the beginning, ``read_committed``, with the surface of ``ControlReader``
    that :class:`Observer` uses: :meth:`poll` gives each record as a ``DataRecord`` whose
    payload is the record's value; there are no control messages, so never a watermark or an end of
    stream. Raises ``ReadError`` when Kafka reports an error."""

    def __init__(self, config: dict[str, str], topic: str, partitions: int, batch_size: int = 2000) -> None:
        import uuid

        from confluent_kafka import Consumer, TopicPartition

        from controlmsg.kafka.settings import for_client

        self.topic = topic
        self.batch_size = batch_size
        self._positions = dict.fromkeys(range(partitions), -2)  # -2: librdkafka's OFFSET_BEGINNING
        self._consumer = Consumer({"group.id": f"controlmsg-bench-plain-{uuid.uuid4().hex}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed",
                                   "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 10,
                                   **for_client(config, "consumer")})
        self._consumer.assign([TopicPartition(topic, p, o) for p, o in self._positions.items()])

    @property
    def positions(self) -> dict[int, int]:
        """Next offset to read per partition (negative: from the beginning)."""
        return dict(self._positions)

    def poll(self, timeout: float = 1.0) -> list[Item]:
        """Consume one batch, waiting up to ``timeout`` s for the first record; its records, in order."""
        from controlmsg.errors import ReadError
        from controlmsg.kafka import DataRecord

        items: list[Item] = []
        for msg in self._consumer.consume(self.batch_size, timeout):
            if msg.error() is not None:
                raise ReadError(f"reading {self.topic!r}: {msg.error()}")
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None  # a record's, not an error's
            self._positions[partition] = offset + 1
            key = msg.key()
            items.append(DataRecord(partition, offset, None if key is None else bytes(key), bytes(msg.value() or b""),
                                    msg))
        return items

    def close(self) -> None:
        self._consumer.close()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as text ("?" where the system has none)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def delete_topics(config: dict[str, str], topics: list[str]) -> None:
    """Delete ``topics``, warning on stderr about any that cannot be deleted."""
    if not topics:
        return
    import sys

    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = dict(config)
    admin = AdminClient(settings)  # keep it alive until the futures resolve
    futures = admin.delete_topics(topics, operation_timeout=30)
    for name, f in futures.items():
        try:
            f.result(30)
        except Exception as exc:
            print(f"warning: cannot delete topic {name}: {exc}", file=sys.stderr)


def synthetic_events(spark: SparkSession, events: int, keys: int, days: int = 30) -> DataFrame:
    """``events`` synthetic click events: ``user`` (``user-<n>``, ``keys`` users skewed towards low
    numbers: n = keys * U^3), ``event_time`` (epoch ms, uniform over ``days`` days from
    :data:`EVENTS_START_MS`), ``amount`` (2% null) and ``items`` (1..5). Deterministic (fixed seeds)."""
    from pyspark.sql import functions as F

    return spark.range(events, numPartitions=4).select(
        F.concat(F.lit("user-"), (F.pow(F.rand(7), F.lit(3)) * keys).cast("int").cast("string")).alias("user"),
        (F.lit(EVENTS_START_MS) + (F.rand(11) * days * DAY_MS).cast("long")).alias("event_time"),
        F.when(F.rand(13) < 0.02, F.lit(None)).otherwise(F.round(F.rand(17) * 100, 2)).alias("amount"),
        (F.rand(19) * 5 + 1).cast("int").alias("items"),
    )


def counts(text: str) -> list[int]:
    """An argparse type: one count or several, comma-separated (``100000,1_000_000``), each at least 1."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count or a comma-separated list of counts: {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every count must be at least 1: {text!r}")
    return values


# ---------------------------------------------------------------------------------------------- the chain's harness

TOPIC_PREFIX = "controlmsg-bench"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in (0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class Observer(threading.Thread):
    """Reads one envelope topic (all partitions, ``read_committed``, one run) and stamps what it sees."""

    def __init__(self, name: str, config: dict[str, Any], topic: str, run_id: str, *, results: bool,
                 poll_s: float, batch_size: int, groups: list[list[int]] | None = None,
                 reader: ControlReader | PlainReader | None = None) -> None:
        """``reader``: what to read with instead of a ``ControlReader`` of ``topic`` (``groups`` need a
        ``ControlReader``); results are JSON objects with ``key``, ``window_end`` and ``count``."""
        super().__init__(name=name, daemon=True)
        # Partition groups (those of stream_window's tasks) whose own watermark, the minimum over the group's
        # partitions only, is stamped too: it is what each window task closes its windows on.
        self.groups = groups or []
        self.group_at: list[list[float]] = [[] for _ in self.groups]
        self.group_ts: list[list[int]] = [[] for _ in self.groups]
        self.reader = reader or ControlReader(config, topic, run_id=run_id, batch_size=batch_size)
        self.results = results
        self.poll_s = poll_s
        self.batch_size = batch_size
        self.wm_at: list[float] = []  # when the reconciled watermark advanced ...
        self.wm_ts: list[int] = []  # ... and to what (strictly increasing)
        self.data = 0
        self.first_data: float | None = None
        self.last_data: float | None = None
        self.ended_at: float | None = None
        self.result_seen: dict[int, float] = {}  # window end -> first result record seen
        self.result_pairs: dict[tuple[str, int], float] = {}  # (key, window end) -> its first result seen
        self.result_counts: dict[tuple[str, int], int] = {}  # (key, window end) -> the sum of its results' counts
        self.result_records = 0
        self.counted = 0  # sum of the results' counts
        self.polls = 0
        self.full_polls = 0
        self.cpu_s = 0.0
        self.error: BaseException | None = None
        self.lock = threading.Lock()  # held while a poll's items are stamped; take it to read them meanwhile
        self._halt = threading.Event()

    def _consumed(self) -> int:
        return sum(max(o, 0) for o in self.reader.positions.values())

    def run(self) -> None:
        cpu0 = time.thread_time()
        reader = self.reader
        try:
            while not self._halt.is_set() and self.ended_at is None:
                before = self._consumed()
                items = reader.poll(self.poll_s)
                now = time.monotonic()
                self.polls += 1
                if self._consumed() - before >= self.batch_size:
                    self.full_polls += 1
                with self.lock:
                    self._stamp(items, now)
        except BaseException as exc:
            self.error = exc
        finally:
            self.cpu_s = time.thread_time() - cpu0

    def _stamp(self, items: list[Item], now: float) -> None:
        """Record what one poll returned, stamped ``now``."""
        for item in items:
            if isinstance(item, DataRecord):
                self.data += 1
                if self.first_data is None:
                    self.first_data = now
                self.last_data = now
                if self.results:
                    value = decode_json_payload(item.payload)
                    self.result_records += 1
                    count = int(value["count"])
                    self.counted += count
                    end = int(value["window_end"])
                    pair = (str(value["key"]), end)
                    self.result_seen.setdefault(end, now)
                    self.result_pairs.setdefault(pair, now)
                    self.result_counts[pair] = self.result_counts.get(pair, 0) + count
            elif isinstance(item, WatermarkAdvanced):
                self.wm_at.append(now)
                self.wm_ts.append(item.timestamp)
            elif isinstance(item, StreamEnded):
                self.ended_at = now
        if items and self.groups:
            self._stamp_groups(now)

    def _stamp_groups(self, now: float) -> None:
        assert isinstance(self.reader, ControlReader)
        tracker = self.reader.tracker
        for i, group in enumerate(self.groups):
            marks = [tracker.status(p).watermark for p in group]
            if any(m is None for m in marks):
                continue
            mark = min(m for m in marks if m is not None)
            if not self.group_ts[i] or mark > self.group_ts[i][-1]:
                self.group_at[i].append(now)
                self.group_ts[i].append(mark)

    def reached(self, ts: int) -> float | None:
        """When the watermark first reached >= ``ts`` (None: not yet)."""
        return _first_reaching(self.wm_at, self.wm_ts, ts)

    def group_reached(self, ts: int) -> list[float | None]:
        """Per partition group: when its watermark first reached >= ``ts``."""
        return [_first_reaching(at, marks, ts) for at, marks in zip(self.group_at, self.group_ts, strict=True)]

    def halt(self) -> None:
        self._halt.set()
        self.join(10)
        self.reader.close()
        if self.error is not None:
            raise RuntimeError(f"observer {self.name} failed: {self.error!r}") from self.error


def _first_reaching(at: list[float], marks: list[int], ts: int) -> float | None:
    i = bisect.bisect_left(marks, ts)
    return at[i] if i < len(at) else None


@dataclass
class Chain:
    """One run of the chain: its topics and how to start its two applications."""

    args: argparse.Namespace
    cluster: Cluster
    work: Path
    label: str

    def __post_init__(self) -> None:
        self.run_id = f"{self.label}{uuid.uuid4().hex[:8]}"
        self.source = f"{TOPIC_PREFIX}-{self.run_id}-source"
        self.events, self.windows = topic_names(self.run_id, prefix=TOPIC_PREFIX)
        self.config: dict[str, Any] = dict(self.cluster.config)
        self.env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        self.apps = JobGroup(self.work, env=self.env)  # the two applications, logs <run id>-<job>.log
        self.admin = AdminClient(self.config)  # one for the run: each one destroyed logs a purge notice

    @property
    def topics(self) -> list[str]:
        return [self.source, self.events, f"{self.events}-rejects", self.windows, f"{self.windows}-late",
                f"{self.windows}-state"]

    def create_topics(self) -> None:
        for topic in (self.source, self.events, self.windows):
            create_topic(self.config, topic, self.args.partitions)

    def observers(self, groups: bool = False) -> tuple[Observer, Observer]:
        a = self.args
        # stream_window runs a task per partition of its input.
        dealt = [[p] for p in range(a.partitions)] if groups else None
        events = Observer("events", self.config, self.events, self.run_id, results=False, poll_s=a.observer_poll,
                          batch_size=a.observer_batch, groups=dealt)
        windows = Observer("windows", self.config, self.windows, self.run_id, results=True,
                           poll_s=a.observer_poll, batch_size=a.observer_batch)
        return events, windows

    def start_observers(self, groups: bool = False) -> tuple[Observer, Observer]:
        """:meth:`observers`, started."""
        events, windows = self.observers(groups=groups)
        events.start()
        windows.start()
        return events, windows

    def check_apps(self, *, ended_ok: bool = False) -> None:
        """Raise ``JobError`` (with the exit code and the log's tail) if an application has failed, or, unless
        ``ended_ok``, has ended at all."""
        for app in self.apps.values():
            if not ended_ok or app.poll() not in (None, 0):
                app.ensure_running()

    def _common(self, job: str) -> list[str]:
        # --parent-pid: the jobs stop by themselves if this script dies.
        return ["--kafka-config", str(self.cluster.properties), "--run-id", self.run_id, "--master", self.args.master,
                "--summary", str(self.work / f"{self.run_id}-{job}.json"), "--parent-pid", str(os.getpid())]

    def start_window(self) -> Job:
        a = self.args
        argv = [sys.executable, "-m", "spark_jobs.runtime.window", "--input-topic", self.events,
                "--output-topic", self.windows, "--window", a.window, "--sum", "amount",
                "--partitions", str(a.partitions),
                "--commit-interval", a.watermark_interval, *self._common("stream_window")]
        return self.apps.start("stream_window", argv, log_path=self.work / f"{self.run_id}-stream_window.log")

    def start_ingest(self, until_source_end: bool) -> Job:
        a = self.args
        argv = [sys.executable, "-m", "spark_jobs.runtime.ingest", "--source-topic", self.source,
                "--topic", self.events, "--key", "user", "--event-time", "event_time", "--carry", "amount",
                "--partitions", str(a.partitions), "--tasks", str(a.tasks),
                "--allowed-lateness", a.allowed_lateness, "--watermark-interval", a.watermark_interval,
                *(["--until-source-end"] if until_source_end else []), *self._common("stream_ingest")]
        return self.apps.start("stream_ingest", argv, log_path=self.work / f"{self.run_id}-stream_ingest.log")

    def start_live(self) -> None:
        """Start both applications, unbounded, and return once they take input: every ingest task has
        committed its first transaction and stream_window's driver has launched its tasks."""
        a = self.args
        t_start = time.monotonic()
        # Both at once (nothing is generated before both run, so the order does not matter here).
        window_app = self.start_window()
        ingest_app = self.start_ingest(until_source_end=False)
        deadline = t_start + a.startup_timeout
        while not self.ingest_tasks_committed():
            window_app.ensure_running()
            ingest_app.ensure_running()
            if time.monotonic() > deadline:
                raise RuntimeError(f"stream_ingest's tasks did not commit within {a.startup_timeout:g} s:\n"
                                   f"{ingest_app.tail(25, indent='    ')}")
            time.sleep(0.2)
        window_app.wait_for_log("stream_window task ", max(1.0, deadline - time.monotonic()), poll_s=0.05)

    def start_bounded(self) -> Job:
        """Start stream_window, then, once its driver has launched its tasks, stream_ingest with
        ``--until-source-end``; returns stream_ingest's app. Both end by themselves."""
        window_app = self.start_window()
        window_app.wait_for_log("stream_window task ", self.args.startup_timeout, poll_s=0.05)
        return self.start_ingest(until_source_end=True)

    def generator_argv(self, start: str) -> list[str]:
        """``python -m spark_jobs.generate`` writing live to the source topic for ``--live-seconds`` at
        ``--rate``, its event clock starting at ``start`` (ISO-8601)."""
        a = self.args
        return [sys.executable, "-m", "spark_jobs.generate", "--topic", self.source,
                "--kafka-config", str(self.cluster.properties), "--duration", str(a.live_seconds),
                "--rate", str(a.rate), "--speedup", str(a.speedup), "--keys", str(a.keys), "--disorder", a.disorder,
                "--seed", str(a.seed), "--start", start]

    def summary(self, job: str) -> dict[str, Any] | None:
        path = self.work / f"{self.run_id}-{job}.json"
        return orjson.loads(path.read_bytes()) if path.exists() else None

    def ingest_tasks_committed(self) -> bool:
        """True once every ingest task has committed a transaction (the run's source group holds an offset
        for every source partition). Asked as the ingest's driver asks (a consumer's ``committed``):
        librdkafka 2.16's admin ``list_consumer_group_offsets`` crashed this process (SIGSEGV in
        ``rd_kafka_cgrp_op``) on this group."""
        from controlmsg.streaming.ingest import committed_source_state, source_group

        try:
            state = committed_source_state(self.config, self.source, source_group(self.events, self.run_id),
                                           range(self.args.partitions), timeout=10)
        except ReadError:
            return False
        return len(state) == int(self.args.partitions)

    def stop_apps(self) -> None:
        """Stop the applications (SIGTERM to each driver, SIGKILL to its process group 10 s later) and close
        their logs."""
        self.apps.stop(10.0)
        self.apps.close()

    def wait_apps(self, timeout: float) -> None:
        """Give the applications up to ``timeout`` s to exit by themselves (their summaries come at exit)."""
        self.apps.wait(timeout)

    def stop(self, *observers: Observer) -> None:
        """Stop the applications, then halt ``observers`` (raises if one of them failed)."""
        self.stop_apps()
        for observer in observers:
            observer.halt()

    def delete_topics(self) -> None:
        for name, future in self.admin.delete_topics(self.topics, operation_timeout=30).items():
            try:
                future.result(30)
            except KafkaException as exc:
                if "UNKNOWN_TOPIC" not in str(exc):
                    print(f"warning: cannot delete topic {name}: {exc}", file=sys.stderr)


def add_chain_options(p: argparse.ArgumentParser) -> None:
    """The options a :class:`Chain` and its observers read (besides the phases' own), and the cluster's."""
    p.add_argument("--prefill-events", type=int, default=300_000, help="backlog of the throughput phase")
    p.add_argument("--keys", type=int, default=100, help="distinct users (skewed)")
    p.add_argument("--disorder", default="500ms", help="events are out of order by up to this")
    p.add_argument("--allowed-lateness", default="500ms",
                   help="the watermark = the largest event time read minus this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--master", default="local[2]", help="Spark master of each application")
    p.add_argument("--partitions", type=int, default=4, help="partitions of every topic")
    p.add_argument("--tasks", type=int, default=2, help="the runtime's long-running tasks per application")
    p.add_argument("--observer-poll", type=float, default=0.01, help="observers' poll timeout, seconds")
    p.add_argument("--observer-batch", type=int, default=20_000, help="observers' batch size")
    p.add_argument("--keep-topics", action="store_true", help="do not delete the topics at the end")
    add_cluster_options(p)


@dataclass
class LiveRun:
    """What :func:`run_live` saw: its two observers (halted), and when what happened (``time.monotonic()``,
    but ``clock0_ms``)."""

    events: Observer
    windows: Observer
    ready_s: float  # launch -> the chain takes input
    warm_s: float | None  # the warm-up's events written -> their first result (None: no warm-up)
    clock0_ms: int  # the generator's event clock started here (epoch ms, as it parses --start)
    gen_started: float
    gen_ended: float
    records: int  # the source topic's records when the generator ended (the warm-up's included)


def run_live(chain: Chain, settle: Callable[[LiveRun], Callable[[], bool]], *, groups: bool = False,
             warm_up: Callable[[Chain, Observer], float] | None = None, poll_s: float = 0.1,
             linger_s: float = 0.0) -> LiveRun:
    """The live phase's steps: fresh topics; both observers started (``groups``: the events one stamps each
    window task's partition group too); the chain started unbounded (:meth:`Chain.start_live`); ``warm_up``
    (when given); the generator run for ``--live-seconds`` with its event clock at the wall clock; then,
    every ``poll_s`` with the applications checked alive, until ``settle(run)``'s predicate holds or
    ``--grace`` s after the generator's end; then at most ``linger_s`` more for stragglers. The chain and
    the observers are stopped whatever happens; raises what they or the generator raised."""
    a = chain.args
    chain.create_topics()
    events_obs, windows_obs = chain.start_observers(groups=groups)
    try:
        t_start = time.monotonic()
        chain.start_live()
        ready_s = time.monotonic() - t_start
        warm_s = None if warm_up is None else warm_up(chain, windows_obs)
        warmed = "" if warm_s is None else f", its first result {warm_s:.1f} s after the warm-up events were written"
        print(f"  chain running {ready_s:.1f} s after launch{warmed}; generating for {a.live_seconds:g} s", flush=True)
        start = datetime.now(UTC).isoformat()
        clock0_ms = int(datetime.fromisoformat(start).timestamp() * 1000)  # as the generator parses --start
        gen_started = time.monotonic()
        records, gen_ended = run_generator(chain.generator_argv(start), chain.work / f"{chain.run_id}-generator.log",
                                           a.live_seconds + 120)
        run = LiveRun(events_obs, windows_obs, ready_s, warm_s, clock0_ms, gen_started, gen_ended, records)
        settled = settle(run)
        grace = gen_ended + a.grace
        while time.monotonic() < grace:
            chain.check_apps()
            if settled():
                break
            time.sleep(poll_s)
        time.sleep(max(0.0, min(linger_s, grace - time.monotonic())))
    finally:
        chain.stop(events_obs, windows_obs)
    return run


def prefill(chain: Chain, start_ms: int | None = None) -> tuple[GeneratorConfig, int]:
    """The bounded phase's backlog: fresh topics, then ``--prefill-events`` events written to the source
    topic as fast as it goes (not timed), their event time spaced ``--rate`` events per second (times
    ``--speedup``) from ``start_ms`` (None: the generator's default), so windows hold as many records as
    in the live phase. Returns the generator's configuration and how many events the topic holds."""
    from spark_jobs.generate import GeneratorConfig, generate

    a = chain.args
    chain.create_topics()
    fill_rate = 1_000_000.0
    cfg = GeneratorConfig(events=a.prefill_events, rate=fill_rate, speedup=fill_rate / a.rate * a.speedup,
                          keys=a.keys, disorder_ms=parse_duration(a.disorder), seed=a.seed, start_ms=start_ms)
    started = time.monotonic()
    count = sum(generate(chain.config, chain.source, cfg).values())
    print(f"  prefilled {count:,} events in {time.monotonic() - started:.1f} s (not timed)", flush=True)
    return cfg, count
