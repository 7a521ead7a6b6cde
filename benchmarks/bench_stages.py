"""The streaming chain ``ingest -> window`` on three engines, one after another, against one broker: window-
result latency and records/s through two hops.

    python benchmarks/bench_stages.py [--engines runtime,stages,connector] [--phases latency,throughput]
        [--rate 2000] [--live-seconds 40] [--prefill-events 300000] [--window 1s] [--interval 200ms]
        [--allowed-lateness 500ms] [--disorder 500ms] [--master local[2]]

The engines, each two Spark applications run as jobs of this script (:class:`common.Chain`): **runtime**
(``spark_jobs.runtime.ingest`` and ``window``), **stages** (``spark_jobs.stages.ingest`` and ``window``:
Structured Streaming on ``format("controlmsg")``), **baseline** (another checkout's stages, ``--baseline``)
and **connector** (``connector_jobs.py stream-ingest`` and ``stream-window``: Spark's own Kafka connector).
An engine that cannot run here is reported unavailable, with the reason, and the others still run. Each
phase of each engine gets fresh topics and a fresh run id. **Latency** (live): after a warm-up, ``python -m
spark_jobs.generate`` writes at ``--rate`` events/s with event time = the wall clock; for each window end E,
the first and the last result's delay after the generator wrote E (its records' CreateTime). **Throughput**
(bounded): a prefilled backlog through the chain; records/s to every closed window's result and to the
windows topic's end of stream. The table at the end has each figure per engine and its ratio to the
runtime's. What each figure means and how it is taken: benchmarks/README.md, "The streaming chain on three
engines".
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Final

import orjson
from common import (
    Chain,
    LiveRun,
    Observer,
    PlainReader,
    add_chain_options,
    kafka_cluster,
    load_average,
    percentile,
    prefill,
    run_live,
)
from confluent_kafka import Consumer, TopicPartition
from connector_jobs import spark_interval

from controlmsg.clusters.jobs import Job
from controlmsg.core.durations import parse_duration
from controlmsg.core.events import StreamEnded
from controlmsg.kafka import ControlReader, DataRecord
from controlmsg.kafka.settings import for_client
from spark_jobs.generate import GeneratorConfig, events, generate

ENGINES = ("runtime", "stages", "baseline", "connector")
SOURCE_SCHEMA = "id STRING, user STRING, event_time STRING, amount DOUBLE, items INT"
EVENTS_SCHEMA = "key STRING, event_ms BIGINT, amount DOUBLE"
CONNECTOR_JOBS = Path(__file__).with_name("connector_jobs.py")

Pair = tuple[str, int]  # (key, window end in epoch ms)


# ---------------------------------------------------------------------------------------------- engines


class Runtime(Chain):
    """The runtime's chain (``common.Chain``), with every topic that holds its run id deleted."""

    engine: ClassVar[str] = "runtime"
    envelopes: ClassVar[bool] = True  # events and windows topics in controlmsg envelopes, with watermarks
    ends: ClassVar[bool] = True  # with --until-source-end the windows topic gets its end of stream

    @property
    def topics(self) -> list[str]:
        names = self.admin.list_topics(timeout=10).topics
        return sorted(name for name in names if self.run_id in name)

    def late_records(self) -> int | None:
        """Records the window application found behind the watermark: runtime and stages write them to
        ``<windows>-late`` (read here, to its end or until it stays quiet for 1.5 s; None: no such topic)."""
        from controlmsg.errors import ControlMsgError

        count = quiet = 0
        try:
            with ControlReader(self.config, f"{self.windows}-late", topic_timeout=5) as reader:
                while quiet < 3:
                    items = reader.poll(0.5)
                    count += sum(1 for item in items if isinstance(item, DataRecord))
                    quiet = 3 if any(isinstance(item, StreamEnded) for item in items) else 0 if items else quiet + 1
        except ControlMsgError:
            return None
        return count

    def drained(self, events: int) -> bool:
        """Whether the window application has read all ``events`` and run after it, so that no further
        result can come. Runtime and stages end their stream instead: False."""
        return False

    def _checkpoint(self, job: str) -> str:
        return str(self.work / f"{self.run_id}-{job}-checkpoint")

    def _app(self, name: str, argv: list[str]) -> Job:
        return self.apps.start(name, argv, log_path=self.work / f"{self.run_id}-{name.replace(' ', '_')}.log")


class Queries(Runtime):
    """A chain of two Structured Streaming applications, each of which logs ``ready_line`` once it runs."""

    ready_line: ClassVar[str] = "query started"

    def start_live(self) -> None:
        """Start both applications at once; return once both have logged ``ready_line``."""
        self.start_window()
        self.start_ingest(until_source_end=False)
        deadline = time.monotonic() + self.args.startup_timeout
        for app in self.apps.values():
            app.wait_for_log(self.ready_line, max(1.0, deadline - time.monotonic()), poll_s=0.05)

    def start_bounded(self) -> Job:
        """Start the window application, then, once it has logged ``ready_line``, the ingest application
        (``--until-source-end`` where it has one); returns the latter."""
        self.start_window().wait_for_log(self.ready_line, self.args.startup_timeout, poll_s=0.05)
        return self.start_ingest(until_source_end=True)


class Stages(Queries):
    """``spark_jobs.stages.ingest`` -> ``spark_jobs.stages.window``: Structured Streaming on controlmsg. Its
    applications log the phases of each micro-batch (``--log-phases``, :mod:`controlmsg.spark.phases`), which
    :func:`phase_breakdown` sums up."""

    engine: ClassVar[str] = "stages"
    log_phases: ClassVar[bool] = True

    def _common(self, job: str) -> list[str]:
        return [*super()._common(job), *(["--log-phases"] if self.log_phases else [])]

    def start_window(self) -> Job:
        """stage_window runs its queries ``availableNow``: until the input's end of stream, no trigger."""
        a = self.args
        return self._app("stage_window", [
            sys.executable, "-m", "spark_jobs.stages.window", "--input-topic", self.events,
            "--output-topic", self.windows, "--window", a.window, "--sum", "amount",
            "--partitions", str(a.partitions), "--checkpoint", self._checkpoint("stage_window"),
            *self._common("stage_window")])

    def start_ingest(self, until_source_end: bool) -> Job:
        a = self.args
        return self._app("stage_ingest", [
            sys.executable, "-m", "spark_jobs.stages.ingest", "--source-topic", self.source, "--topic", self.events,
            "--key", "user", "--event-time", "event_time", "--carry", "amount",
            "--allowed-lateness", a.allowed_lateness, "--trigger-interval", spark_interval(a.watermark_interval),
            "--checkpoint", self._checkpoint("stage_ingest"), "--partitions", str(a.partitions),
            *(["--until-source-end"] if until_source_end else []), *self._common("stage_ingest")])


class Baseline(Stages):
    """The stages chain of another checkout (``--baseline``: e.g. main's code, to compare with this one's in
    the same run): its applications run with that checkout first on ``PYTHONPATH``. Their phases are logged
    when that checkout's stage jobs take ``--log-phases``."""

    engine: ClassVar[str] = "baseline"

    def __post_init__(self) -> None:
        super().__post_init__()
        root = str(Path(self.args.baseline).resolve())
        path = os.environ.get("PYTHONPATH")
        self.env["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
        self.apps.env = dict(self.env)
        self.log_phases = "--log-phases" in (Path(root) / "spark_jobs" / "stages" / "common.py").read_text(
            encoding="utf-8")


class Connector(Queries):
    """``connector_jobs.py stream-ingest`` -> ``stream-window``: Structured Streaming on Spark's connector."""

    engine: ClassVar[str] = "connector"
    envelopes: ClassVar[bool] = False
    ends: ClassVar[bool] = False
    ready_line: ClassVar[str] = "batch 0 done"  # its first micro-batch ran: as the runtime's first commit

    def _window_log(self) -> bytes | None:
        window = self.apps.get("connector stream-window")
        return None if window is None else window.log_path.read_bytes()

    def late_records(self) -> int | None:
        """The rows stream-window's state operator dropped as older than Spark's watermark (its log)."""
        log = self._window_log()
        if log is None:
            return None
        totals = re.findall(rb"dropped by the watermark \(total (\d+)\)", log)
        return int(totals[-1]) if totals else 0

    def drained(self, events: int) -> bool:
        """True once stream-window has logged a micro-batch done after the one that brought the rows it read
        to ``events``: that later batch ran on the watermark of all of them."""
        read = 0
        for rows in re.findall(rb"batch \d+ done: (\d+) rows read", self._window_log() or b""):
            if read >= events:
                return True
            read += int(rows)
        return False

    def _connector(self, job: str, argv: list[str]) -> Job:
        a = self.args
        return self._app(f"connector {job}", [
            sys.executable, str(CONNECTOR_JOBS), job, "--bootstrap-servers", self.cluster.servers, *argv,
            "--checkpoint", self._checkpoint(job), "--trigger-interval", a.watermark_interval,
            "--master", a.master, "--jars", a.connector_jars, "--parent-pid", str(os.getpid())])

    def start_window(self) -> Job:
        a = self.args
        return self._connector("stream-window", [
            "--input-topic", self.events, "--output-topic", self.windows, "--schema", EVENTS_SCHEMA,
            "--window", a.window, "--allowed-lateness", a.allowed_lateness, "--sum", "amount"])

    def start_ingest(self, until_source_end: bool) -> Job:
        """Unbounded whatever ``until_source_end`` says: a Kafka source has no end of its stream."""
        return self._connector("stream-ingest", [
            "--source-topic", self.source, "--topic", self.events, "--schema", SOURCE_SCHEMA,
            "--key", "user", "--event-time", "event_time", "--carry", "amount"])

    def observers(self, groups: bool = False) -> tuple[Observer, Observer]:
        a = self.args

        def observer(name: str, topic: str, results: bool) -> Observer:
            reader = PlainReader(self.config, topic, a.partitions, batch_size=a.observer_batch)
            return Observer(name, self.config, topic, self.run_id, results=results, poll_s=a.observer_poll,
                            batch_size=a.observer_batch, reader=reader)
        return observer("events", self.events, False), observer("windows", self.windows, True)


ENGINE_CLASSES: dict[str, type[Runtime]] = {"runtime": Runtime, "stages": Stages, "baseline": Baseline,
                                            "connector": Connector}


def unavailable(engine: str, args: argparse.Namespace) -> str | None:
    """Why ``engine`` cannot run here (None: it can). For the connector, resolves its jar files once and
    sets ``args.connector_jars``."""
    if engine == "baseline":
        if not args.baseline:
            return "no --baseline checkout given"
        if not (Path(args.baseline) / "spark_jobs" / "stages" / "window.py").is_file():
            return f"{args.baseline} holds no spark_jobs/stages/window.py"
    if engine == "stages":
        missing = [m for m in ("spark_jobs.stages.ingest", "spark_jobs.stages.window")
                   if importlib.util.find_spec(m) is None]
        if missing:
            return f"{' and '.join(missing)} not in this checkout"
    if engine == "connector" and not args.connector_jars:
        print("resolving Spark's Kafka connector (connector_jobs.py jars) ...", flush=True)
        try:
            done = subprocess.run([sys.executable, str(CONNECTOR_JOBS), "jars", "--master", "local[1]"],
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=args.startup_timeout)
        except subprocess.TimeoutExpired:
            return f"resolving the connector took more than {args.startup_timeout:g} s"
        lines = done.stdout.decode(errors="replace").strip().splitlines()
        if done.returncode != 0 or not lines or not lines[-1].strip():
            err = [x.strip() for x in done.stderr.decode(errors="replace").splitlines() if x.strip()]
            why = [x for x in err if "unresolved dependency" in x][:1] or err[-1:] or ["no jar files printed"]
            return f"Spark's Kafka connector cannot be had with this pyspark: {why[0]}"
        args.connector_jars = lines[-1].strip()
    return None


# ---------------------------------------------------------------------------------------------- helpers


def expected_results(cfg: GeneratorConfig, clock0_ms: int, count: int, window_ms: int,
                     closed_before_ms: int) -> dict[Pair, int]:
    """The (key, window end) -> count of the first ``count`` events the generator writes with ``cfg`` and
    its clock at ``clock0_ms``, for the windows the data closes: end <= the largest event time -
    ``closed_before_ms``."""
    counts: dict[Pair, int] = {}
    top = -(2**63)
    for user, ms, _ in itertools.islice(events(cfg, clock0_ms), count):
        pair = (user, ms - ms % window_ms + window_ms)
        counts[pair] = counts.get(pair, 0) + 1
        top = max(top, ms)
    return {p: c for p, c in counts.items() if p[1] <= top - closed_before_ms}


def write_times(config: dict[str, str], topic: str, partitions: int, seed: int, count: int) -> list[float]:
    """Per event the generator wrote with ``seed`` (by the index in its ``id``, ``<seed>-<i>``), the
    wall-clock second it was written: its record's CreateTime. Reads the source topic until it has seen
    ``count`` of them; NaN for any not found within 60 s."""
    prefix = f"{seed}-"
    times = [math.nan] * count
    consumer = Consumer({"group.id": f"controlmsg-bench-stages-{os.getpid()}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", **for_client(config, "consumer")})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < count and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is not None:
                    continue
                ident = str(orjson.loads(msg.value() or b"{}").get("id", ""))
                i = int(ident[len(prefix):]) if ident.startswith(prefix) else -1
                if 0 <= i < count:
                    times[i] = msg.timestamp()[1] / 1000
                    seen += 1
    finally:
        consumer.close()
    return times


def _median_p90(values: list[float]) -> tuple[float, float] | None:
    return (statistics.median(values), percentile(values, 0.9)) if values else None


# ---------------------------------------------------------------------------------------------- latency


@dataclass
class LiveResult:
    ready_s: float  # launch -> the chain takes input
    warm_s: float  # the warm-up events written -> their first result
    generated: int
    gen_seconds: float  # the generator process, start-up and exit included
    start_offset_s: float  # the generator's first write after the moment its clock starts
    end_lag_s: float  # its last write behind its event clock (grows if it could not keep the rate)
    # Per measured window E: its first result - ref(E), and its last expected result - ref(E); inf where
    # there was no result / an expected result was missing at the end of the grace period.
    first: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)
    t0: list[float] = field(default_factory=list)  # first result - events topic's watermark >= E, where both
    measured: int = 0  # closed windows after the warm-up
    warmup: int = 0  # closed windows left out as warm-up
    no_result: int = 0  # measured windows without any result
    incomplete: int = 0  # measured windows with an expected result missing
    missing_pairs: int = 0
    late: int | None = None  # records the window application dropped as late, as it says (None: it does not)


def warm_up(chain: Chain, windows_obs: Observer) -> float:
    """Write ``--warm-events`` events (event time two minutes back, spaced as the live ones, another seed)
    to the source topic and wait until the windows topic has a result: both hops have run on data once
    (Python workers, code generation, the first micro-batches). Returns how long that took; raises if the
    chain gives no result within ``--startup-timeout``."""
    a = chain.args
    fill_rate = 1_000_000.0
    generate(chain.config, chain.source, GeneratorConfig(
        events=a.warm_events, rate=fill_rate, speedup=fill_rate / a.rate, keys=a.keys,
        disorder_ms=parse_duration(a.disorder), seed=a.seed + 1, start_ms=int(time.time() * 1000) - 120_000))
    written = time.monotonic()
    while windows_obs.result_records == 0:
        chain.check_apps()
        if time.monotonic() > written + a.startup_timeout:
            raise RuntimeError(f"no window result within {a.startup_timeout:g} s of {a.warm_events:,} warm-up events")
        time.sleep(0.1)
    return time.monotonic() - written


def phase_latency(chain: Runtime) -> LiveResult:
    """Run ``chain`` live (benchmarks/README.md, "The streaming chain on three engines")."""
    a = chain.args
    window_ms = parse_duration(a.window)
    disorder_ms = parse_duration(a.disorder)
    to_wall = time.time() - time.monotonic()  # observers stamp time.monotonic()
    expected: dict[Pair, int] = {}

    def settle(run: LiveRun) -> Callable[[], bool]:
        """Done once every (key, window) result the generated events close is on the windows topic."""
        cfg = GeneratorConfig(rate=a.rate, keys=a.keys, disorder_ms=disorder_ms, seed=a.seed)
        expected.update(expected_results(cfg, run.clock0_ms, run.records - a.warm_events, window_ms,
                                         parse_duration(a.allowed_lateness) + disorder_ms))

        def settled() -> bool:
            with run.windows.lock:
                return all(p in run.windows.result_pairs for p in expected)
        return settled

    run = run_live(chain, settle, warm_up=warm_up, poll_s=0.2)
    events_obs, windows_obs, clock0_ms = run.events, run.windows, run.clock0_ms
    generated = run.records - a.warm_events  # the generator prints the topic's end offsets: the warm-up's in them
    assert run.warm_s is not None
    written = write_times(chain.config, chain.source, a.partitions, a.seed, generated)
    result = LiveResult(ready_s=run.ready_s, warm_s=run.warm_s, generated=generated,
                        gen_seconds=run.gen_ended - run.gen_started,
                        late=chain.late_records(),
                        start_offset_s=written[0] - clock0_ms / 1000,
                        end_lag_s=written[-1] - (clock0_ms + int((generated - 1) / a.rate * 1000)) / 1000)

    def ref(end: int) -> float:
        """When the generator wrote its first event whose clock (clock0 + i / rate) is at or past ``end``."""
        i = max(0, math.ceil((end - clock0_ms) * a.rate / 1000) - 1)
        while i < generated and clock0_ms + int(i / a.rate * 1000) < end:
            i += 1
        return float(written[min(i, generated - 1)])

    by_end: dict[int, list[Pair]] = {}
    for pair in expected:
        by_end.setdefault(pair[1], []).append(pair)
    warmup_until = written[0] + a.warmup
    for end in sorted(by_end):
        t_ref = ref(end)
        if math.isnan(t_ref) or t_ref < warmup_until:
            result.warmup += 1
            continue
        result.measured += 1
        seen = [windows_obs.result_pairs[p] for p in by_end[end] if p in windows_obs.result_pairs]
        if len(seen) < len(by_end[end]):
            result.incomplete += 1
            result.missing_pairs += len(by_end[end]) - len(seen)
            result.last.append(math.inf)
        else:
            result.last.append(max(seen) + to_wall - t_ref)
        first = windows_obs.result_seen.get(end)
        if first is None:
            result.first.append(math.inf)
            result.no_result += 1
            continue
        result.first.append(first + to_wall - t_ref)
        t0 = events_obs.reached(end) if chain.envelopes else None
        if t0 is not None:
            result.t0.append(first - t0)
    return result


def print_latency(r: LiveResult, a: argparse.Namespace) -> None:
    print(f"  generator wrote {r.generated:,} events ({r.generated / a.live_seconds:,.0f} ev/s over "
          f"{a.live_seconds:g} s; its process ran {r.gen_seconds:.1f} s); first write {r.start_offset_s:+.2f} s "
          f"after its clock started, last write {r.end_lag_s:+.2f} s behind its clock")
    print(f"  closed windows: {r.measured} measured, {r.warmup} in the {a.warmup:g} s warm-up; of the measured, "
          f"{r.no_result} without any result, {r.incomplete} with results missing (their figures count as inf) "
          f"({r.missing_pairs} (key, window) results: dropped as late, or not there within the grace period); "
          f"records dropped as late by the window application: {'not reported' if r.late is None else r.late}")
    for label, values in (("first result - ref(E)", r.first), ("last result - ref(E)", r.last),
                          ("first result - events watermark >= E (t0)", r.t0)):
        if values:
            print(f"  {label}: median {statistics.median(values):.3f} s, p90 {percentile(values, 0.9):.3f} s, "
                  f"min {min(values):.3f} s, max {max(values):.3f} s")


# ---------------------------------------------------------------------------------------------- throughput


@dataclass
class BoundedResult:
    events: int
    expected: int  # (key, window) results the data closes
    events_seen: int  # data records on the events topic
    results_seen: int  # of the expected results, those that came
    to_closed_s: float | None  # first event record -> every closed window's result visible
    to_last_s: float | None  # first event record -> the last expected result that came
    to_eos_s: float | None  # first event record -> the windows topic's end of stream
    counts_ok: int  # closed windows whose count is the recomputed one
    late: int | None  # records the window application dropped as late, as it says (None: it does not)
    ended: str  # how the phase ended


def phase_throughput(chain: Runtime) -> BoundedResult:
    """Run ``chain`` over a prefilled backlog (benchmarks/README.md). Ends when every closed window's
    result is there (the connector), or at the windows topic's end of stream (runtime and stages), or when
    no further result can come (:meth:`Runtime.drained`), or at the timeouts."""
    a = chain.args
    cfg, count = prefill(chain, start_ms=int(time.time() * 1000))
    assert cfg.start_ms is not None
    expected = expected_results(cfg, cfg.start_ms, count, parse_duration(a.window),
                                parse_duration(a.allowed_lateness) + parse_duration(a.disorder))
    print(f"  they close {len(expected):,} (key, window) results; starting the chain", flush=True)
    events_obs, windows_obs = chain.start_observers()
    complete_at: float | None = None
    ended = f"timed out ({a.startup_timeout + a.throughput_timeout:g} s)"
    try:
        chain.start_bounded()
        deadline = time.monotonic() + a.startup_timeout + a.throughput_timeout
        while time.monotonic() < deadline:
            chain.check_apps(ended_ok=True)
            if events_obs.error is not None or windows_obs.error is not None:
                ended = "an observer failed"
                break
            if complete_at is None:
                with windows_obs.lock:
                    if all(p in windows_obs.result_pairs for p in expected):
                        complete_at = max((windows_obs.result_pairs[p] for p in expected), default=time.monotonic())
            if complete_at is not None and not chain.ends:
                ended = "stopped once every closed window's result was there (it never ends by itself)"
                break
            if windows_obs.ended_at is not None:
                ended = "ended by itself (windows topic's end of stream)"
                break
            if chain.drained(count):
                time.sleep(1)  # its last results' way to the observer
                ended = ("stopped: the window query had read every event and run a micro-batch after it, and "
                         "closed windows' results were missing (dropped as late: they never come)")
                break
            time.sleep(0.1)
        if windows_obs.ended_at is not None:
            chain.wait_apps(30)
            chain.check_apps(ended_ok=True)  # an application that failed after the end of stream fails the run
    finally:
        chain.stop(events_obs, windows_obs)
    first = events_obs.first_data
    came = [windows_obs.result_pairs[p] for p in expected if p in windows_obs.result_pairs]
    return BoundedResult(
        events=count, expected=len(expected), events_seen=events_obs.data, results_seen=len(came),
        to_closed_s=None if first is None or complete_at is None else complete_at - first,
        to_last_s=None if first is None or not came else max(came) - first,
        to_eos_s=None if first is None or windows_obs.ended_at is None else windows_obs.ended_at - first,
        counts_ok=sum(1 for p, c in expected.items() if windows_obs.result_counts.get(p) == c),
        late=chain.late_records(), ended=ended)


def print_throughput(r: BoundedResult) -> None:
    late = "not reported" if r.late is None else f"{r.late:,}"
    print(f"  {r.ended}; events topic {r.events_seen:,} records of {r.events:,}; closed windows' results there "
          f"{r.results_seen:,} of {r.expected:,}, with the recomputed count {r.counts_ok:,}; records dropped as late "
          f"by the window application: {late}")
    for label, span in (("first event record -> every closed window's result", r.to_closed_s),
                        ("first event record -> the last closed window's result that came", r.to_last_s),
                        ("first event record -> windows end of stream", r.to_eos_s)):
        if span is not None:
            print(f"  {label}: {span:.1f} s ({r.events / span:,.0f} rec/s)")


# ---------------------------------------------------------------------------------------------- main


@dataclass
class EngineRun:
    engine: str
    unavailable: str | None = None
    live: LiveResult | None = None
    live_error: str | None = None
    bounded: BoundedResult | None = None
    bounded_error: str | None = None
    phases: dict[str, Phases] = field(default_factory=dict)  # per bench phase, where the engine logs them


# ---------------------------------------------------------------------------------------------- phases


Phases = dict[str, list[dict[str, Any]]]
"""Phase lines (:mod:`controlmsg.spark.phases`) by ``<application> <phase> <topic role>``."""


def collect_phases(chain: Runtime) -> Phases:
    """The phase lines the chain's applications logged, grouped by application, phase and the role of the
    topic (``source``, ``events``, ``windows``, ``late``)."""
    from controlmsg.spark.phases import parse_phase

    roles = {chain.source: "source", chain.events: "events", chain.windows: "windows", f"{chain.windows}-late": "late"}
    found: Phases = {}
    for name, app in chain.apps.items():
        if not app.log_path.exists():
            continue
        for line in app.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            fields = parse_phase(line)
            if fields is not None:
                role = roles.get(str(fields.get("topic")), str(fields.get("topic")))
                found.setdefault(f"{name} {fields.get('phase')} {role}", []).append(fields)
    return found


def _ms(lines: list[dict[str, Any]], key: str = "ms") -> list[float]:
    return [float(x[key]) for x in lines if isinstance(x.get(key), int | float)]


def _med(values: list[float]) -> str:
    return "-" if not values else f"{statistics.median(values):,.0f}"


def _med_p90(values: list[float]) -> str:
    return "-" if not values else f"{statistics.median(values):,.0f} / {percentile(values, 0.9):,.0f}"


def print_phases(phases: Phases) -> None:
    """One line per group of phase lines: how many, ms median / p90 / sum, and what else they say."""
    for key in sorted(phases):
        lines = phases[key]
        ms = _ms(lines)
        extra = ""
        kind = key.split(" ")[-2]
        if kind == "query":
            keys = sorted({k for x in lines for k in (x.get("durations") or {})})
            extra = "; " + ", ".join(
                f"{k} {_med([float(x['durations'][k]) for x in lines if k in (x.get('durations') or {})])}"
                for k in keys if k != "triggerExecution")
        elif kind == "scan":
            stops: dict[str, int] = {}
            for x in lines:
                stops[str(x.get("stop"))] = stops.get(str(x.get("stop")), 0) + 1
            extra = f"; stopped by {stops}, records med {_med(_ms(lines, 'records'))}"
        elif kind == "write":
            rows = sum(int(x.get("rows") or 0) for x in lines)
            extra = f"; skipped (empty) {sum(1 for x in lines if x.get('skipped'))}, rows {rows:,}"
        elif kind == "commit":
            extra = f"; making the writer med {_med(_ms(lines, 'init_ms'))} ms"
        elif kind == "read":
            extra = f"; rows {sum(int(x.get('rows') or 0) for x in lines):,}"
        print(f"    {key}: {len(lines):,} lines, ms med / p90 {_med_p90(ms)}, sum {sum(ms) / 1000:,.1f} s{extra}")


PHASE_ROWS: Final = (
    ("window query: micro-batches", "stage_window query windows", None),
    ("  each: triggerExecution ms med / p90", "stage_window query windows", "triggerExecution"),
    ("  latestOffset (driver scan) ms med / p90", "stage_window query windows", "latestOffset"),
    ("  addBatch (tasks + sink commit) ms med / p90", "stage_window query windows", "addBatch"),
    ("  walCommit + commitOffsets ms med / p90", "stage_window query windows", "wal+commit"),
    ("  scan ms med / p90 (settle batches)", "stage_window scan events", "scan"),
    ("  read task ms med / p90", "stage_window read events", "ms"),
    ("  write task ms med / p90 (skipped empty)", "stage_window write windows", "write"),
    ("  driver commit ms med / p90", "stage_window commit windows", "ms"),
    ("late query: micro-batches", "stage_window query late", None),
    ("ingest query: micro-batches / trigger ms med", "stage_ingest query events", "count+ms"),
)


def phase_cell(phases: Phases | None, group: str, what: str | None) -> str:
    """One cell of the table's phase rows (:data:`PHASE_ROWS`)."""
    lines = (phases or {}).get(group)
    if not lines:
        return "-"
    if what is None:
        return f"{len(lines):,}"
    if what == "count+ms":
        return f"{len(lines):,} / {_med(_ms(lines))}"
    if what == "scan":
        return f"{_med_p90(_ms(lines))} ({sum(1 for x in lines if x.get('settle'))})"
    if what == "write":
        return f"{_med_p90(_ms(lines))} ({sum(1 for x in lines if x.get('skipped'))} of {len(lines)})"
    if what == "ms":
        return _med_p90(_ms(lines))
    durations = [x.get("durations") or {} for x in lines]
    if what == "wal+commit":
        return _med_p90([float(d.get("walCommit", 0)) + float(d.get("commitOffsets", 0)) for d in durations])
    return _med_p90([float(d[what]) for d in durations if what in d])


def run_phase(run: EngineRun, phase: str, chain: Runtime) -> None:
    """One phase of one engine on fresh topics, deleted at the end (unless ``--keep-topics``); a failure is
    printed (with the applications' last log lines) and recorded, not raised, so the other engines still
    run."""
    print(f"\n{run.engine}, {phase} (run {chain.run_id}, load {load_average()})", flush=True)
    try:
        if phase == "latency":
            run.live = phase_latency(chain)
            print_latency(run.live, chain.args)
        else:
            run.bounded = phase_throughput(chain)
            print_throughput(run.bounded)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # The first line, and the application's own last word on it where its log tail is in the text.
        cause = next((x for x in reversed(lines[1:]) if "Error" in x and not x.startswith("at ")), None)
        message = f"{type(exc).__name__}: {lines[0] if lines else ''}" + (f" ... {cause}" if cause else "")
        print(f"  FAILED: {exc}", flush=True)
        traceback.print_exc(limit=3)
        for app in chain.apps.values():
            print(f"  last lines of {app.log_path}:\n{app.tail(15, indent='    ')}")
        if phase == "latency":
            run.live_error = message
        else:
            run.bounded_error = message
    finally:
        chain.stop_apps()
        if isinstance(chain, Stages):
            run.phases[phase] = collect_phases(chain)
            if run.phases[phase]:
                print(f"  phases ({run.engine}, {phase}; {PHASE_NOTE}):")
                print_phases(run.phases[phase])
        if not chain.args.keep_topics:
            chain.delete_topics()


PHASE_NOTE: Final = "the applications' --log-phases lines, controlmsg.spark.phases"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, run in this order")
    p.add_argument("--phases", default="latency,throughput", help="latency and/or throughput, comma-separated")
    p.add_argument("--interval", dest="watermark_interval", default="200ms",
                   help="the runtime's watermark and commit interval; the trigger interval of the stages' and the "
                        "connector's queries")
    p.add_argument("--window", default="1s", help="tumbling window length")
    p.add_argument("--rate", type=float, default=2000.0, help="live generator rate, events/s; the prefilled "
                   "backlog's event time is spaced the same way")
    p.add_argument("--live-seconds", type=float, default=40.0, help="how long the generator writes (latency)")
    p.add_argument("--warm-events", type=int, default=4000,
                   help="events written before the live generator, from two minutes back: the chain has produced a "
                        "result before the measured generation starts")
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of generation whose windows are left out")
    p.add_argument("--grace", type=float, default=60.0,
                   help="after the generator stops, wait at most this long for the closed windows' results")
    add_chain_options(p)
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="engine baseline: the stages chain of this checkout of the project (e.g. main's code), run "
                        "with it first on PYTHONPATH, side by side with this checkout's stages in the same run")
    p.add_argument("--connector-jars", help="the connector's jar files, comma-separated (default: resolved once)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for a chain to start")
    p.add_argument("--throughput-timeout", type=float, default=300.0, help="seconds for a bounded chain to finish")
    p.set_defaults(speedup=1.0)  # event time = wall clock (common.Chain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    engines = [x.strip() for x in args.engines.split(",") if x.strip()]
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if not engines or any(e not in ENGINES for e in engines) or len(set(engines)) < len(engines):
        p.error(f"--engines takes some of {', '.join(ENGINES)}, each once")
    if not phases or any(x not in ("latency", "throughput") for x in phases):
        p.error("--phases takes latency and/or throughput")
    for text in (args.watermark_interval, args.window, args.disorder, args.allowed_lateness):
        parse_duration(text)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark

    load_start = load_average()
    work = Path(tempfile.mkdtemp(prefix="controlmsg-bench-stages-"))
    print(f"bench_stages: pyspark {pyspark.__version__}, {os.cpu_count()} cores (load {load_start}), master "
          f"{args.master}, {args.partitions} partitions; logs in {work}")
    print(f"windows {args.window}, interval {args.watermark_interval}, allowed lateness {args.allowed_lateness}, "
          f"disorder {args.disorder}, {args.keys} keys, live {args.rate:,.0f} ev/s for {args.live_seconds:g} s, "
          f"backlog {args.prefill_events:,} events", flush=True)
    runs = [EngineRun(e, unavailable(e, args)) for e in engines]
    for run in runs:
        if run.unavailable:
            print(f"engine {run.engine}: unavailable: {run.unavailable}", flush=True)
    with kafka_cluster(args) as cluster:
        if "connector" in engines and set(cluster.config) != {"bootstrap.servers"}:
            print("note: the connector gets bootstrap.servers only, not the other client settings", flush=True)
        for run in runs:
            for phase in phases if not run.unavailable else []:
                run_phase(run, phase, ENGINE_CLASSES[run.engine](args, cluster, work, f"{run.engine[:3]}{phase[:3]}"))
    print_table(runs, args, phases, load_start)
    return 0


def print_table(runs: list[EngineRun], a: argparse.Namespace, phases: list[str], load_start: str) -> None:
    """Each figure per engine, with its ratio to the runtime's where both exist."""
    base = next((r for r in runs if r.engine == "runtime"), None)
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, cell: Callable[[EngineRun], str]) -> None:
        rows.append((label, [cell(r) for r in runs]))

    def failed(r: EngineRun, live: bool) -> str | None:
        if r.unavailable:
            return "unavailable"
        error = r.live_error if live else r.bounded_error
        return "failed" if error else None

    def stat(values: Callable[[LiveResult], list[float]], ratio: bool) -> Callable[[EngineRun], str]:
        def cell(r: EngineRun) -> str:
            why = failed(r, True)
            if why or r.live is None:
                return why or "-"
            mp = _median_p90(values(r.live))
            if mp is None:
                return "n/a"
            text = f"{mp[0]:.2f} / {mp[1]:.2f} s"
            ref = _median_p90(values(base.live)) if base is not None and base.live is not None else None
            if ratio and ref is not None and ref[0] > 0:
                text += f" ({mp[0] / ref[0]:.2f}x)"
            return text
        return cell

    def rate(span: Callable[[BoundedResult], float | None], never: str) -> Callable[[EngineRun], str]:
        def cell(r: EngineRun) -> str:
            why = failed(r, False)
            if why or r.bounded is None:
                return why or "-"
            s = span(r.bounded)
            if s is None:
                return never if not ENGINE_CLASSES[r.engine].ends else "not reached"
            text = f"{r.bounded.events / s:,.0f} ({s:.1f} s)"
            ref = span(base.bounded) if base is not None and base.bounded is not None else None
            if ref:
                text += f" {ref / s:.2f}x"
            missing = r.bounded.expected - r.bounded.results_seen
            return text + (f", {missing:,} results missing" if missing else "")
        return cell

    row("engine", lambda r: r.engine)
    if "latency" in phases:
        row("live: launch -> takes input / warm-up's 1st result", lambda r: failed(r, True) or (
            "-" if r.live is None else f"{r.live.ready_s:.1f} s / {r.live.warm_s:.1f} s"))
        row("live: generator's rate achieved", lambda r: failed(r, True) or (
            "-" if r.live is None else f"{r.live.generated / a.live_seconds:,.0f} ev/s"))
        row("live: windows measured / with no result / incomplete", lambda r: failed(r, True) or (
            "-" if r.live is None else
            f"{r.live.measured} / {r.live.no_result} / {r.live.incomplete}"))
        row("first result - E, median / p90 (x runtime)", stat(lambda x: x.first, True))
        row("last result - E, median / p90 (x runtime)", stat(lambda x: x.last, True))
        row("first result - events wm >= E (t0), med / p90", stat(lambda x: x.t0, True))
        row("floor shared: allowed lateness", lambda r: f"{parse_duration(a.allowed_lateness) / 1000:.2f} s")
    if "throughput" in phases:
        row("bounded: events / closed (key, window) results", lambda r: failed(r, False) or (
            "-" if r.bounded is None else f"{r.bounded.events:,} / {r.bounded.expected:,}"))
        row("rec/s, 1st event -> closed windows (x runtime)", rate(lambda x: x.to_closed_s, "never complete"))
        row("  incomplete: rec/s to the last result that came", lambda r: "-" if r.bounded is None or (
            r.bounded.to_closed_s is not None or r.bounded.to_last_s is None) else
            f"{r.bounded.events / r.bounded.to_last_s:,.0f} ({r.bounded.to_last_s:.1f} s)")
        row("rec/s, 1st event -> windows EOS (x runtime)", rate(lambda x: x.to_eos_s, "never ends (stopped)"))
        row("closed windows' results there / right count", lambda r: failed(r, False) or (
            "-" if r.bounded is None else f"{r.bounded.results_seen:,} / {r.bounded.counts_ok:,}"))
        row("records dropped as late (window app says)", lambda r: failed(r, False) or (
            "-" if r.bounded is None else "not reported" if r.bounded.late is None else f"{r.bounded.late:,}"))
    for phase in phases:
        if any(r.phases.get(phase) for r in runs):
            row(f"{phase}: phases of stage_window (ms)", lambda r: "")
            for label, group, what in PHASE_ROWS:
                row(f"  {label}", lambda r, g=group, w=what, ph=phase: phase_cell(r.phases.get(ph), g, w))
    widths = [max(len(label) for label, _ in rows)] + [
        max(len(cells[i]) for _, cells in rows) for i in range(len(runs))]
    print()
    for label, cells in rows:
        print("  ".join([label.ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells, widths[1:], strict=True))]))
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; latencies in wall-clock seconds after ref(E), the generator "
          f"writing event time E; load average at the start {load_start}, at the end {load_average()}")
    for r in runs:
        for what, error in (("latency", r.live_error), ("throughput", r.bounded_error)):
            if error:
                print(f"{r.engine} {what} failed: {error}")
        if r.unavailable:
            print(f"{r.engine}: unavailable: {r.unavailable}")


if __name__ == "__main__":
    sys.exit(main())
