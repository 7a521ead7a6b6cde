"""The streaming chain (two Spark applications, two Kafka hops): window-result latency and records/s.

    python benchmarks/bench_streaming.py [--watermark-interval 200ms] [--window 1s] [--rate 2000]
        [--live-seconds 30] [--prefill-events 300000] [--master local[2]] [--phases latency,throughput]

The chain: raw source topic -> ``python -m spark_jobs.runtime.ingest`` (Spark application 1, ``--tasks``
long-running tasks) -> the events topic -> ``python -m spark_jobs.runtime.window`` (Spark application 2) ->
the windows topic. Each application is its own process group (``controlmsg.clusters.jobs.JobGroup``),
started by this script and stopped when its phase ends (SIGTERM to its driver, then SIGKILL to the group
and every descendant). Uses $KAFKA_BOOTSTRAP_SERVERS, else starts a local broker for the run. Every phase
uses fresh topics (a new run id), deleted at the end unless ``--keep-topics``. The applications' logs stay
in a temporary directory, printed at the start.

What is measured, from one run:

**Phase A, window-result latency (live).** Two observers run in this process, one thread each, started
before the applications: a ``ControlReader`` (``read_committed``, all partitions, the run id) on the events
topic and one on the windows topic. They poll with a short timeout (``--observer-poll``, 10 ms; librdkafka's
``consume`` returns only when the batch is full or the timeout has passed, so this is the resolution of
every timestamp) and stamp what they see with ``time.monotonic()`` when ``poll`` returns. For each window
end E:

* t0 = the moment the events observer's reconciled watermark (minimum over every ingest task and every
  partition: its ``WatermarkAdvanced`` items) first reaches >= E, i.e. when the input of stream_window
  has, for the first time, everything it needs to close the windows ending at E;
* t1 = the moment the windows observer first sees a result record with ``window_end == E``;
* latency(E) = t1 - t0: stream_window's reading, closing and committing, plus Kafka's transaction
  markers, seen from outside. The first hop (source -> ingest -> events) is not in it: t0 is defined on the
  events topic. Both stamps carry up to one observer poll (10 ms) of delay.

t0 is over *all* partitions while t1 is the *first* result, and each window task closes its windows on
its own partitions' watermark only, which may reach E earlier than the other task's (see below), so
latency(E) can come out below zero. Three more views are printed for the same windows: the time until
*all* results for E are visible (the windows topic's reconciled watermark reaches E: every window task
has committed its results for E, which share a transaction with that watermark), which is never below
zero; the first result measured from the earliest partition group's watermark (the events observer also
tracks the watermark of each window task's partition group, dealt as ``controlmsg.streaming.runtime`` does); and
the skew between the groups. The skew comes from ``read_committed``: a partition is readable only up to
its first open transaction, and an ingest task's transaction is open almost all the time, so another
task's watermark on a partition where this task writes data becomes visible only at this task's next
commit. The generator and the ingest writer use the same partitioner and partition count, so ingest task
i writes its data to exactly the partitions stream_window's task i reads: the groups' watermarks each
follow their own ingest task's commit timer.

Both applications start at once, stream_ingest unbounded (no ``--until-source-end``); once both ingest
tasks have committed their first (empty) transaction (their consumer groups hold offsets) and
stream_window's driver has launched its tasks, ``python -m spark_jobs.generate`` writes live for
``--live-seconds`` at ``--rate`` events/s, event time following the wall clock times ``--speedup`` (so
with 1 s windows and speedup 1, one window closes per second). Windows whose t0 falls in the first
``--warmup`` seconds of generation are left out (the first watermark needs every source partition to have
yielded a record, and the Python workers are still warming up). After the generator stops the script waits
until the events observer has seen every generated event and every window with a t0 has its result (or a
grace period has passed: those are reported as missing), then kills both applications: stream_ingest does
not end by itself without ``--until-source-end``. The phase also reports whether the chain kept up: the
generator's achieved rate; how far the windows topic's watermark trails the generator's event clock just
after the warm-up and at the end of generation (it grows when the chain falls behind); when, relative to
the generator's exit, the last generated event was on the events topic and the windows topic's watermark
had caught up with the events topic's; how often the watermark advanced on each topic; and the median
latency of the first and second half of the measured windows. Both applications commit on their own timers
of one interval, so the latency of a window depends on where it falls between them; that phase drifts,
which is why the halves can differ without the chain falling behind.

The events observer reads every data record too; its batch size (``--observer-batch``) is large, and
the phase reports how many of its polls came back with a full batch (a sign it was behind, which would
delay t0 and bias the latency down) and its CPU time. The goal is "latency < 1 s + one watermark
interval", judged on every measured window (and on the p90), for the first result and for all results.

**Phase B, sustained records/s (bounded backlog).** ``--prefill-events`` events are written to a fresh
source topic first (``spark_jobs.generate.generate`` as fast as it goes, event time spaced as in the live
phase: ``--rate`` events per second of event time, so windows hold as many records), not timed. Then the
same two applications run with ``--until-source-end`` (stream_window first, stream_ingest once
stream_window's driver has launched its tasks) and end by themselves. Records/s of the chain = events /
(the windows topic's end of stream as seen by the windows observer - the first committed record the events
observer sees). The start is the first *visible* ingest output, so it is late by at most about one
watermark interval (an ingest task commits its first transaction one interval after it starts reading)
plus the commit; the figure is therefore slightly optimistic by that much. A pessimistic bound is printed
beside it, from the moment stream_ingest's driver logs that it launches its tasks (task scheduling and
Python worker start-up included), and the same from the launch of stream_window's process (JVM start-ups
included). Also printed: the ingest hop alone (first record -> end of stream on the events topic), end of
stream propagation through stream_window, and a check that the window results' counts plus the late
records add up to the events. The two observers compete with the applications for the machine's cores:
this process's CPU time over the measured span is printed as a share of the cores.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from common import Cluster, PlainReader, add_cluster_options, kafka_cluster, load_average
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from controlmsg.clusters.jobs import Job, JobGroup
from controlmsg.core.bookkeeping import StreamEnded, WatermarkAdvanced
from controlmsg.core.codec import decode_json_payload
from controlmsg.errors import ReadError
from controlmsg.kafka import ControlReader, DataRecord, Item, create_topic
from controlmsg.streaming.ingest import committed_source_state
from controlmsg.streaming.ingest import source_group as ingest_group
from spark_jobs.common import topic_names
from spark_jobs.events import parse_duration
from spark_jobs.generate import GeneratorConfig, generate

TOPIC_PREFIX = "controlmsg-bench"


# ---------------------------------------------------------------------------------------------- helpers


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in (0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# ---------------------------------------------------------------------------------------------- observers


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


# ---------------------------------------------------------------------------------------------- the chain


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
        try:
            state = committed_source_state(self.config, self.source, ingest_group(self.events, self.run_id),
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


# ---------------------------------------------------------------------------------------------- phase A


@dataclass
class LatencyResult:
    latencies: list[float]
    complete: list[float]
    own: list[float]
    skew: list[float]
    missing: int
    warmup_left_out: int
    generated: int
    gen_seconds: float
    drain_s: float | None
    wm_catch_up_s: float | None
    lag_early_s: float | None
    lag_late_s: float | None
    wm_step_events_s: float | None
    wm_step_windows_s: float | None
    observer_full_polls: int
    observer_polls: int
    observer_cpu_s: float
    first_half_median: float | None
    second_half_median: float | None
    ready_s: float


def phase_latency(chain: Chain) -> LatencyResult:
    a = chain.args
    chain.create_topics()
    events_obs, windows_obs = chain.observers(groups=True)
    events_obs.start()
    windows_obs.start()
    try:
        t_start = time.monotonic()
        chain.start_live()
        ready_s = time.monotonic() - t_start
        print(f"  both applications running {ready_s:.1f} s after launch; generating for {a.live_seconds:g} s",
              flush=True)

        clock0_ms = int(time.time() * 1000)  # the generator's event clock starts here (given as --start)
        gen_argv = chain.generator_argv(datetime.fromtimestamp(clock0_ms / 1000, UTC).isoformat())
        gen_started = time.monotonic()
        generated, gen_ended = run_generator(gen_argv, chain.work / f"{chain.run_id}-generator.log",
                                             a.live_seconds + 120)

        # Drain: every generated event on the events topic, and every window with a t0 has its result.
        grace = gen_ended + a.grace
        drain_s: float | None = None
        while time.monotonic() < grace:
            for app in chain.apps.values():
                app.ensure_running()
            if drain_s is None and events_obs.data >= generated and events_obs.last_data is not None:
                drain_s = events_obs.last_data - gen_ended
            with events_obs.lock, windows_obs.lock:
                closed = [e for e in _window_ends(events_obs, windows_obs, a) if events_obs.reached(e) is not None]
                done = (drain_s is not None and all(e in windows_obs.result_seen for e in closed)
                        and bool(windows_obs.wm_ts) and bool(events_obs.wm_ts)
                        and windows_obs.wm_ts[-1] >= events_obs.wm_ts[-1])
            if done:
                break
            time.sleep(0.1)
        time.sleep(max(0.0, min(1.0, grace - time.monotonic())))  # a last moment for stragglers
    finally:
        chain.stop(events_obs, windows_obs)

    # t0 per window end: the events watermark reaching it; t1: its first result on the windows topic.
    warmup_until = gen_started + a.warmup
    latencies: list[float] = []
    complete: list[float] = []  # windows topic's watermark >= E (every task's results for E visible) - t0
    own: list[float] = []  # first result - the earliest partition group's watermark reaching E
    skew: list[float] = []  # t0 - that: how much later the slowest partition group got there
    missing = left_out = 0
    for end in _window_ends(events_obs, windows_obs, a):
        t0 = events_obs.reached(end)
        if t0 is None:
            continue
        if t0 < warmup_until:
            left_out += 1
            continue
        t1 = windows_obs.result_seen.get(end)
        if t1 is None:
            missing += 1
            continue
        latencies.append(t1 - t0)
        t_all = windows_obs.reached(end)
        if t_all is not None:
            complete.append(t_all - t0)
        groups = [t for t in events_obs.group_reached(end) if t is not None]
        if groups:
            own.append(t1 - min(groups))
            skew.append(t0 - min(groups))
    final_wm = events_obs.wm_ts[-1] if events_obs.wm_ts else None
    caught = windows_obs.reached(final_wm) if final_wm is not None else None
    half = len(latencies) // 2

    def lag(t_from: float, t_to: float) -> float | None:
        """Median wall-clock seconds the windows topic's watermark trails the generator's event clock."""
        lags = [(clock0_ms + (t - gen_started) * 1000 * a.speedup - ts) / (1000 * a.speedup)
                for t, ts in zip(windows_obs.wm_at, windows_obs.wm_ts, strict=True) if t_from <= t <= t_to]
        return statistics.median(lags) if lags else None
    return LatencyResult(
        latencies=latencies, complete=complete, own=own, skew=skew, missing=missing, warmup_left_out=left_out,
        generated=generated,
        gen_seconds=gen_ended - gen_started, drain_s=drain_s,
        wm_catch_up_s=None if caught is None else caught - gen_ended,
        wm_step_events_s=_median_step(events_obs.wm_at, warmup_until, gen_ended),
        wm_step_windows_s=_median_step(windows_obs.wm_at, warmup_until, gen_ended),
        lag_early_s=lag(warmup_until, warmup_until + a.lag_span),
        lag_late_s=lag(gen_ended - a.lag_span, gen_ended),
        observer_full_polls=events_obs.full_polls, observer_polls=events_obs.polls, observer_cpu_s=events_obs.cpu_s,
        first_half_median=statistics.median(latencies[:half]) if half else None,
        second_half_median=statistics.median(latencies[half:]) if half else None,
        ready_s=ready_s,
    )


def run_generator(argv: list[str], log_path: Path, timeout: float) -> tuple[int, float]:
    """Run ``python -m spark_jobs.generate`` (``argv``) to its end as a job of its own, output to
    ``log_path``, killed after ``timeout`` s. Returns the source topic's records (the sum of the end offsets
    it prints last) and the ``time.monotonic()`` it ended at; raises ``RuntimeError`` if it fails."""
    gen = Job("generator", argv, log_path)
    try:
        gen.start()
        code = gen.wait(timeout)
        ended = time.monotonic()
        if code != 0:
            raise RuntimeError(f"generator {'still running' if code is None else f'failed ({code})'} after "
                               f"{timeout:g} s:\n{gen.tail(25, indent='    ')}")
        for line in reversed(log_path.read_bytes().splitlines()):
            if line.startswith(b'{"topic"'):
                return sum(orjson.loads(line)["endOffsets"].values()), ended
        raise RuntimeError(f"the generator printed no end offsets:\n{gen.tail(25, indent='    ')}")
    finally:
        gen.close()


def _median_step(moments: list[float], t_from: float, t_to: float) -> float | None:
    """The median time between successive moments inside [t_from, t_to]."""
    inside = [t for t in moments if t_from <= t <= t_to]
    steps = [b - a for a, b in itertools.pairwise(inside)]
    return statistics.median(steps) if steps else None


def _window_ends(events_obs: Observer, windows_obs: Observer, a: argparse.Namespace) -> list[int]:
    """Every window end the events watermark or the results have passed, in order."""
    size = parse_duration(a.window)
    ends = set(windows_obs.result_seen)
    if events_obs.wm_ts:
        lo = min(ends) if ends else events_obs.wm_ts[0] - events_obs.wm_ts[0] % size
        hi = events_obs.wm_ts[-1]
        ends.update(range(lo - lo % size + size, hi - hi % size + 1, size))
    return sorted(ends)


# ---------------------------------------------------------------------------------------------- phase B


@dataclass
class ThroughputResult:
    events: int
    prefill_s: float
    launch_to_end_s: float
    driver_to_end_s: float
    first_record_to_end_s: float
    ingest_s: float
    eos_propagation_s: float
    window_rows: int
    counted: int
    late: int | None
    observer_cpu_s: float
    observer_full_polls: int
    observer_polls: int
    process_cpu_measured_s: float | None


def phase_throughput(chain: Chain) -> ThroughputResult:
    a = chain.args
    chain.create_topics()
    t = time.monotonic()
    # Event time spaced as in the live phase: `rate` events per second of event time.
    fill_rate = 1_000_000.0
    ends = generate(chain.config, chain.source, GeneratorConfig(
        events=a.prefill_events, rate=fill_rate, speedup=fill_rate / a.rate * a.speedup, keys=a.keys,
        disorder_ms=parse_duration(a.disorder), seed=a.seed))
    prefill_s = time.monotonic() - t
    events = sum(ends.values())
    print(f"  prefilled {events:,} events in {prefill_s:.1f} s (not timed); starting the chain", flush=True)
    events_obs, windows_obs = chain.observers()
    events_obs.start()
    windows_obs.start()
    try:
        launched = time.monotonic()
        ingest_app = chain.start_bounded()
        ingest_driver = ingest_app.wait_for_log("over source partitions", a.startup_timeout, poll_s=0.05)
        deadline = time.monotonic() + a.startup_timeout + a.throughput_timeout
        cpu_at_first: float | None = None  # this process's CPU time when the first event record showed up
        while windows_obs.ended_at is None:
            if cpu_at_first is None and events_obs.first_data is not None:
                cpu_at_first = time.process_time()
            if time.monotonic() > deadline:
                raise RuntimeError("the chain did not reach end of stream on the windows topic in time")
            for app in chain.apps.values():
                if app.poll() not in (None, 0):
                    app.ensure_running()
            if windows_obs.error is not None or events_obs.error is not None:
                break
            time.sleep(0.05)
        cpu_measured = None if cpu_at_first is None else time.process_time() - cpu_at_first
        chain.wait_apps(60)
    finally:
        chain.stop(events_obs, windows_obs)
    assert events_obs.first_data is not None and events_obs.ended_at is not None
    assert windows_obs.ended_at is not None
    window_summary = chain.summary("stream_window")
    late = None if window_summary is None else sum(int(t["late"]) for t in window_summary["tasks"])
    return ThroughputResult(
        events=events_obs.data, prefill_s=prefill_s, launch_to_end_s=windows_obs.ended_at - launched,
        driver_to_end_s=windows_obs.ended_at - ingest_driver,
        first_record_to_end_s=windows_obs.ended_at - events_obs.first_data,
        ingest_s=events_obs.ended_at - events_obs.first_data,
        eos_propagation_s=windows_obs.ended_at - events_obs.ended_at,
        window_rows=windows_obs.result_records, counted=windows_obs.counted, late=late,
        observer_cpu_s=events_obs.cpu_s + windows_obs.cpu_s, observer_full_polls=events_obs.full_polls,
        observer_polls=events_obs.polls, process_cpu_measured_s=cpu_measured,
    )


# ---------------------------------------------------------------------------------------------- main


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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--phases", default="latency,throughput", help="which phases to run, comma-separated")
    p.add_argument("--watermark-interval", default="200ms",
                   help="ingest's watermark and commit interval, and stream_window's commit interval")
    p.add_argument("--window", default="1s", help="tumbling window length")
    p.add_argument("--rate", type=float, default=2000.0, help="live generator rate, events/s (phase A); "
                   "phase B spaces its event time the same way")
    p.add_argument("--speedup", type=float, default=1.0, help="event time per wall-clock second (phase A)")
    p.add_argument("--live-seconds", type=float, default=30.0, help="how long the generator writes (phase A)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of generation left out of the latency")
    p.add_argument("--lag-span", type=float, default=3.0,
                   help="seconds over which the watermark lag is taken, after the warm-up and before the end")
    p.add_argument("--grace", type=float, default=10.0,
                   help="after the generator stops, wait at most this long for the last results (phase A)")
    add_chain_options(p)
    p.add_argument("--startup-timeout", type=float, default=180.0, help="seconds for an application to start")
    p.add_argument("--throughput-timeout", type=float, default=600.0, help="seconds for phase B's chain to end")
    args = p.parse_args(argv)
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not phases or any(x not in ("latency", "throughput") for x in phases):
        p.error("--phases takes latency and/or throughput")
    for text in (args.watermark_interval, args.window, args.disorder, args.allowed_lateness):
        parse_duration(text)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    interval_s = parse_duration(args.watermark_interval) / 1000
    goal_s = 1.0 + interval_s

    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-streaming-"))
    with kafka_cluster(args) as cluster:
        print(f"bench_streaming: {os.cpu_count()} cores (load {load_average()}), broker {cluster.servers}, "
              f"master {args.master}, {args.partitions} partitions, {args.tasks} tasks per application; logs in {work}")
        print(f"windows {args.window}, watermark/commit interval {args.watermark_interval}, disorder "
              f"{args.disorder}, allowed lateness {args.allowed_lateness}, {args.keys} keys", flush=True)
        chains: list[Chain] = []
        lat: LatencyResult | None = None
        thr: ThroughputResult | None = None
        try:
            if "latency" in phases:
                chain = Chain(args, cluster, work, "lat")
                chains.append(chain)
                print(f"\nphase A, latency (run {chain.run_id}): live generator {args.rate:,.0f} ev/s, "
                      f"event time x{args.speedup:g}", flush=True)
                lat = phase_latency(chain)
                print_latency(lat, args, interval_s, goal_s)
            if "throughput" in phases:
                chain = Chain(args, cluster, work, "thr")
                chains.append(chain)
                print(f"\nphase B, throughput (run {chain.run_id}): {args.prefill_events:,} events prefilled, "
                      "chain with --until-source-end", flush=True)
                thr = phase_throughput(chain)
                print_throughput(thr)
        finally:
            for chain in chains:
                chain.stop_apps()
                if not args.keep_topics:
                    chain.delete_topics()
        print_summary(lat, thr, args, goal_s)
    return 0


def print_latency(r: LatencyResult, a: argparse.Namespace, interval_s: float, goal_s: float) -> None:
    print(f"  generator wrote {r.generated:,} events in its {a.live_seconds:g} s ({r.generated / a.live_seconds:,.0f} "
          f"ev/s; the process ran {r.gen_seconds:.1f} s with start-up and exit)")
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f} s"

    print(f"  windows-topic watermark behind the generator's event clock (wall-clock s; includes the allowed "
          f"lateness): {fmt(r.lag_early_s)} in the {a.lag_span:g} s after the warm-up, {fmt(r.lag_late_s)} in the "
          f"last {a.lag_span:g} s of generation")
    print(f"  watermark advanced every {fmt(r.wm_step_events_s)} on the events topic, every "
          f"{fmt(r.wm_step_windows_s)} on the windows topic (median; interval {a.watermark_interval})")
    drain = "not within the grace period" if r.drain_s is None else f"{r.drain_s:+.2f} s"
    catch = "never" if r.wm_catch_up_s is None else f"{r.wm_catch_up_s:+.2f} s"
    print(f"  relative to the generator's exit (it exits ~0.1-0.5 s after its last write: flush, end offsets): "
          f"last event on the events topic {drain}, windows watermark caught up with the events topic's {catch}")
    behind = "never behind" if not r.observer_full_polls else "it WAS BEHIND: t0 may be late, latency low"
    print(f"  events observer: {r.observer_full_polls} of {r.observer_polls:,} polls came back full "
          f"(batch {a.observer_batch:,}: {behind}), {r.observer_cpu_s:.2f} s CPU")
    print(f"  windows measured: {len(r.latencies)} ({r.warmup_left_out} closed in the {a.warmup:g} s warm-up "
          f"left out, {r.missing} with no result)")
    if r.latencies:
        lat = r.latencies
        print(f"  latency t1 - t0: median {statistics.median(lat):.3f} s, p90 {percentile(lat, 0.9):.3f} s, "
              f"min {min(lat):.3f} s, max {max(lat):.3f} s (interval {interval_s:.3f} s, goal < {goal_s:.3f} s)")
        for label, values in (
                ("windows-topic watermark >= E (every task's results for E committed) - t0", r.complete),
                ("first result - the earliest partition group's watermark >= E", r.own),
                ("t0 - that (slowest partition group behind the fastest)", r.skew)):
            if values:
                print(f"  {label}: median {statistics.median(values):.3f} s, p90 {percentile(values, 0.9):.3f} s, "
                      f"max {max(values):.3f} s")
        if r.first_half_median is not None and r.second_half_median is not None:
            print(f"  median latency, first half / second half of the windows: {r.first_half_median:.3f} s / "
                  f"{r.second_half_median:.3f} s")


def print_throughput(r: ThroughputResult) -> None:
    print(f"  events through the chain: {r.events:,}; window results: {r.window_rows:,}")
    print(f"  first committed event record -> windows end of stream: {r.first_record_to_end_s:.1f} s "
          f"({r.events / r.first_record_to_end_s:,.0f} rec/s)")
    print(f"  stream_ingest's driver launching its tasks -> windows end of stream (task start-up included): "
          f"{r.driver_to_end_s:.1f} s ({r.events / r.driver_to_end_s:,.0f} rec/s)")
    print(f"  stream_window launched -> windows end of stream (JVM start-ups included): {r.launch_to_end_s:.1f} s "
          f"({r.events / r.launch_to_end_s:,.0f} rec/s)")
    print(f"  ingest hop alone, first record -> events end of stream: {r.ingest_s:.1f} s "
          f"({r.events / r.ingest_s:,.0f} rec/s); end of stream events -> windows topic: {r.eos_propagation_s:.2f} s")
    late = "?" if r.late is None else f"{r.late:,}"
    check = "ok" if r.late is not None and r.counted + r.late == r.events else "MISMATCH"
    print(f"  check: counts in the window results {r.counted:,} + late {late} = {r.events:,}: {check}")
    cores = os.cpu_count() or 1
    if r.process_cpu_measured_s is not None:
        share = r.process_cpu_measured_s / (r.first_record_to_end_s * cores)
        print(f"  this process (the observers) used {r.process_cpu_measured_s:.2f} s CPU over the "
              f"{r.first_record_to_end_s:.1f} s measured: {share:.0%} of the {cores} cores, taken from the chain")
    behind = ("never behind" if not r.observer_full_polls else
              "it was behind at times: the events topic's end-of-stream moment may be late, so the ingest hop's "
              "rate may be low and the EOS propagation short; the chain figure is not affected")
    print(f"  events observer: {r.observer_full_polls} of {r.observer_polls:,} polls came back full ({behind}); "
          f"observers' CPU over the whole phase {r.observer_cpu_s:.2f} s")


def print_summary(lat: LatencyResult | None, thr: ThroughputResult | None, a: argparse.Namespace,
                  goal_s: float) -> None:
    print()
    print(f"{'measure':<58} value")
    print(f"{'watermark interval (ingest) = commit interval (window)':<58} {a.watermark_interval}")
    if lat is not None:
        n = len(lat.latencies)
        print(f"{'live generator rate (achieved)':<58} {lat.generated / a.live_seconds:,.0f} ev/s "
              f"({lat.generated:,} events)")
        print(f"{'windows measured (after warm-up)':<58} {n}" + (f" ({lat.missing} missing)" if lat.missing else ""))
        verdicts = []
        for label, values in (("window-result latency, events wm >= E -> first result", lat.latencies),
                              ("  all results of E: -> windows-topic wm >= E", lat.complete)):
            if not values:
                continue
            p90 = percentile(values, 0.9)
            print(f"{label:<58} median {statistics.median(values):.3f} s  p90 {p90:.3f} s  max {max(values):.3f} s")
            over = sum(1 for x in values if x >= goal_s)
            verdicts.append("met" if over == 0 and not lat.missing else (
                f"met on the p90, missed by {over} of {len(values)} windows" if p90 < goal_s else
                f"missed ({over} of {len(values)} windows at or above)"))
        if lat.skew:
            print(f"{'  partition groups: slowest behind fastest reaching E':<58} median "
                  f"{statistics.median(lat.skew):.3f} s  max {max(lat.skew):.3f} s")
        if verdicts:
            print(f"{f'goal: latency < 1 s + one interval = {goal_s:.3f} s':<58} first result: {verdicts[0]}"
                  + (f"; all results: {verdicts[1]}" if len(verdicts) > 1 else ""))
    if thr is not None:
        print(f"{'chain records/s, first event record -> windows EOS':<58} "
              f"{thr.events / thr.first_record_to_end_s:,.0f} rec/s "
              f"({thr.events:,} in {thr.first_record_to_end_s:.1f} s)")
        print(f"{'  same, from stream_ingest launching its tasks':<58} "
              f"{thr.events / thr.driver_to_end_s:,.0f} rec/s ({thr.driver_to_end_s:.1f} s)")
        print(f"{'  same, from stream_window process launch (JVMs incl.)':<58} "
              f"{thr.events / thr.launch_to_end_s:,.0f} rec/s ({thr.launch_to_end_s:.1f} s)")
        print(f"{'ingest hop records/s, first record -> events EOS':<58} {thr.events / thr.ingest_s:,.0f} rec/s")
        print(f"{'end of stream, events topic -> windows topic':<58} {thr.eos_propagation_s:.2f} s")
        print(f"{'ratio live rate / sustained chain rate (headroom)':<58} "
              f"{a.rate / (thr.events / thr.first_record_to_end_s):.3f}")


if __name__ == "__main__":
    sys.exit(main())
