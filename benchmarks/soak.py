"""A soak run of the streaming chain: hours at a steady rate, a ``kill -9`` of one job at a fixed period.

    python benchmarks/soak.py [--minutes 60] [--rate 31500] [--kill-every 10] [--sample-every 60] [--out DIR]

Runs a broker (unless the cluster options or ``$KAFKA_BOOTSTRAP_SERVERS`` name one), ``python -m
spark_jobs.generate`` at ``--rate`` events/s, and the three jobs of ``python -m spark_jobs.pipeline
windowed-count --streaming`` with the arguments the pipeline gives them (``spark_jobs.job_commands.job_args``),
each its own process group started by this script. Every ``--kill-every`` minutes one job in turn gets
SIGKILL on its whole group and is started again at once; every ``--sample-every`` seconds one row of
``DIR/samples.csv`` (RSS, lag, transactions, disk, records in and out). At the end the chain drains and ends
by itself, then the end checks run (every job exited 0, the output equals the oracle, no transaction left
open). Written to ``DIR``: ``samples.csv``, ``events.csv``, ``soak.png``, ``soak.md``, ``summary.json``;
``--report-only DIR`` draws the plot and the tables again (matplotlib: ``pip install -e '.[bench]'``).
What it runs and measures in detail, the end checks, the goals and the runs: docs/SOAK.md.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from common import add_cluster_options, cluster_given, load_average

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.jobs import Job
from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.clusters.processes import descendants, free_ports
from controlmsg.core.messages import MAX_TIMESTAMP
from controlmsg.kafka.admin import create_topic, end_offsets
from controlmsg.kafka.settings import client_config_from_args, write_properties
from controlmsg.streaming.ingest import source_group
from spark_jobs.common import topic_names
from spark_jobs.job_commands import job_args
from spark_jobs.pipeline import build_parser
from spark_jobs.runtime.sink import checkpoint_path

MEASURED_MAX_RATE = 63_000.0
"""records/s: docs/PERFORMANCE.md, "Streaming: window latency and rate", 2 tasks, 4 partitions (default)."""
JOBS = ("stream_ingest", "stream_window", "stream_sink")
ROLES = {"ingest": "stream_ingest", "window": "stream_window", "sink": "stream_sink"}
TX_TIMEOUT_MS = 60_000  # the streaming tasks' transaction.timeout.ms (docs/OPERATIONS.md, cleanup)
HERE = Path(__file__).resolve().parent


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------- processes


def rss_kb(pid: int) -> int:
    """VmRSS of one process in kB (0 if it is gone or has none: a zombie, a kernel thread)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_rss(pid: int | None) -> tuple[int, int]:
    """(RSS in kB, process count) of ``pid`` and every descendant; (0, 0) when ``pid`` is None or gone."""
    if pid is None or not Path(f"/proc/{pid}").exists():
        return 0, 0
    pids = [pid, *descendants(pid)]
    return sum(rss_kb(p) for p in pids), len(pids)


# ---------------------------------------------------------------------------------------------- measures


def disk_bytes(path: Path) -> int:
    """Allocated bytes of the files under ``path`` (a file or a directory; 0 if missing)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).stat().st_blocks * 512
    return total


def output_rows(path: Path) -> int:
    """Rows in the sink's CSV output (its header not counted)."""
    if not path.exists():
        return 0
    with path.open("rb") as f:
        lines = sum(1 for _ in f)
    return max(lines - 1, 0)


@dataclass
class Transactions:
    ongoing: int = 0
    oldest_ongoing_s: float = 0.0
    open_partitions: int = 0
    hanging: int = 0
    error: str = ""
    raw: dict[str, Any] = field(default_factory=dict)


class TransactionsTool:
    """``SoakTransactions.java`` compiled once against the broker's jars; one JVM per call."""

    def __init__(self, work: Path, properties: Path) -> None:
        from controlmsg.clusters.kafka_jars import ensure_kafka_libs
        from controlmsg.clusters.processes import java_executable

        self.libs = ensure_kafka_libs()
        self.classes = work / "classes"
        self.classes.mkdir(parents=True, exist_ok=True)
        self.properties = properties
        self.java = java_executable()
        javac = shutil.which("javac") or str(Path(self.java).with_name("javac"))
        subprocess.run([javac, "-cp", f"{self.libs}/*", "-d", str(self.classes), str(HERE / "SoakTransactions.java")],
                       check=True, capture_output=True, timeout=120)

    def query(self, topics: Sequence[str]) -> Transactions:
        done = subprocess.run([self.java, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp",
                               f"{self.classes}:{self.libs}/*", "SoakTransactions", str(self.properties),
                               ",".join(topics)], capture_output=True, text=True, timeout=90, check=False)
        if done.returncode != 0:
            return Transactions(error=(done.stderr.strip().splitlines() or ["?"])[-1][:200])
        doc = orjson.loads(done.stdout)
        ongoing = [t for t in doc["transactions"] if t["state"] == "Ongoing"]
        return Transactions(
            ongoing=len(ongoing),
            oldest_ongoing_s=max((t["ageMs"] or 0) / 1000 for t in ongoing) if ongoing else 0.0,
            open_partitions=len({o["partition"] for o in doc["openOnPartitions"]}),
            hanging=sum(1 for o in doc["openOnPartitions"] if o["hanging"] and o["lastWriteAgeMs"] > TX_TIMEOUT_MS),
            raw=doc)


def sink_offsets(output: Path) -> dict[int, int]:
    """The windows-topic offsets the sink's last checkpoint accounts for (empty before its first)."""
    from controlmsg.kafka import FileCheckpointStore

    try:
        saved = FileCheckpointStore(checkpoint_path(output)).load()
    except Exception:  # being replaced right now, or not written yet: no figure this time
        return {}
    return {} if saved is None else {int(p): int(o) for p, o in saved.offsets.items()}


def windows_watermark(config: dict[str, Any], topic: str, run_id: str) -> int | None:
    """The windows topic's reconciled watermark (the minimum over its partitions), as ``controlmsg inspect``
    reports it; None before every partition has one."""
    from controlmsg.kafka.inspect import inspect_topic

    report = inspect_topic(config, topic, run_id, timeout=60)
    run = report.newest_run
    if run is None:
        return None
    marks = [s.watermark for s in run.partitions]
    return None if not marks or any(m is None for m in marks) else min(m for m in marks if m is not None)


# ---------------------------------------------------------------------------------------------- the run


COLUMNS = ["t_s", "utc", "rss_ingest_mb", "rss_window_mb", "rss_sink_mb", "rss_generator_mb", "rss_broker_mb",
           "rss_soak_mb", "procs_ingest", "procs_window", "procs_sink", "records_in", "records_out",
           "ingest_lag_records", "sink_lag_offsets", "windows_wm_lag_s", "tx_ongoing", "tx_oldest_s",
           "tx_open_partitions", "tx_hanging", "disk_broker_mb", "disk_run_mb", "disk_output_mb",
           "disk_spark_mb", "disk_total_mb", "load1", "note"]


class Soak:
    def __init__(self, args: argparse.Namespace, config: dict[str, Any], out: Path, broker_pid: int | None) -> None:
        self.a = args
        self.config = config
        self.out = out
        self.broker_pid = broker_pid
        self.run_id = args.run_id or f"soak-{uuid.uuid4().hex[:8]}"
        self.runs_dir = out / "runs"
        self.run_dir = self.runs_dir / self.run_id
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.output = out / "windows.csv"
        self.source = f"controlmsg-soak-{self.run_id}-source"
        self.events_topic, self.windows_topic = topic_names(self.run_id)
        self.properties = write_properties(config, out / "kafka.properties", "the soak run's client settings")
        self.spark_local = out / "spark-local"
        self.spark_local.mkdir(exist_ok=True)
        self.samples: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.t0 = 0.0
        self.env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        self.generator: Job | None = None
        self.jobs = JobGroup(self.run_dir, env=self.env)  # <run dir>/<job>.log, appended to across restarts
        self.tx_tool = TransactionsTool(out, self.properties)
        self.last_wm_lag: float | None = None

    # -- the chain's commands, as the pipeline makes them

    def job_argv(self, job: str, until_source_end: bool = False) -> list[str]:
        a = self.a
        argv = ["windowed-count", "--streaming", "--source-topic", self.source, "--key", "user", "--event-time",
                "event_time", "--window", a.window, "--sum", "amount", "--allowed-lateness", a.allowed_lateness,
                "--watermark-interval", a.watermark_interval, "--output", str(self.output), "--partitions",
                str(a.partitions), "--tasks", str(a.tasks), "--master", a.master,
                "--timeout", str(a.minutes * 60 + 3600), "--spark-conf", f"spark.local.dir={self.spark_local}"]
        if until_source_end:
            argv.append("--until-source-end")
        return job_args(job, build_parser().parse_args(argv), self.properties, self.run_id, self.run_dir)

    def event(self, kind: str, job: str, detail: str = "") -> None:
        t = time.monotonic() - self.t0 if self.t0 else 0.0
        row = {"t_s": round(t, 1), "utc": now_iso(), "event": kind, "job": job, "detail": detail}
        self.events.append(row)
        print(f"{row['utc']} +{t:7.1f} s  {kind} {job} {detail}", flush=True)

    def start_chain(self) -> None:
        create_topic(self.config, self.source, self.a.partitions)
        for job in ("stream_sink", "stream_window", "stream_ingest"):  # downstream first, as the pipeline
            self.jobs.start(job, self.job_argv(job))
            self.event("start", job)
        self.wait_for_log("stream_ingest", "over source partitions")
        self.wait_for_log("stream_window", "stream_window task ")
        gen = [sys.executable, "-m", "spark_jobs.generate", "--topic", self.source, "--kafka-config",
               str(self.properties), "--duration", str(self.a.minutes * 60), "--rate", str(self.a.rate),
               "--keys", str(self.a.keys), "--disorder", self.a.disorder, "--seed", str(self.a.seed)]
        self.generator = Job("generator", gen, self.out / "generator.log", env=self.env)
        self.t0 = time.monotonic()
        self.generator.start()
        self.event("start", "generator", f"{self.a.rate:,.0f} events/s for {self.a.minutes:g} min")

    def wait_for_log(self, job: str, text: str, timeout: float = 300.0) -> None:
        self.jobs[job].wait_for_log(text, timeout, poll_s=0.5)

    def kill_and_restart(self, job: str) -> None:
        j = self.jobs[job]
        if not j.running():
            self.event("not-running", job, "at its kill time; started again")
        else:
            j.kill()
            self.event("kill -9", job, f"process group {j.pid}")
        j.start()
        self.event("restart", job)

    def check_jobs(self, ending: bool = False) -> None:
        """A job that exited by itself (not killed here) is recorded and started again, unless ending."""
        for name, j in self.jobs.items():
            if j.poll() is not None and not ending:
                self.event("unplanned exit", name,
                           f"exit {j.returncode}; started again; log tail:\n{j.tail(8, indent='    ')}")
                j.start()

    # -- one sample

    def sample(self, note: str = "") -> None:
        started = time.monotonic()
        row: dict[str, Any] = {"t_s": round(started - self.t0, 1), "utc": now_iso(), "note": note}
        for job, col in (("stream_ingest", "ingest"), ("stream_window", "window"), ("stream_sink", "sink")):
            rss, procs = tree_rss(self.jobs[job].pid if self.jobs[job].running() else None)
            row[f"rss_{col}_mb"] = round(rss / 1024, 1)
            row[f"procs_{col}"] = procs
        gen = self.generator
        row["rss_generator_mb"] = round(tree_rss(gen.pid if gen and gen.running() else None)[0] / 1024, 1)
        row["rss_broker_mb"] = round(tree_rss(self.broker_pid)[0] / 1024, 1)
        row["rss_soak_mb"] = round(rss_kb(os.getpid()) / 1024, 1)
        try:
            ends = end_offsets(self.config, self.source)
            row["records_in"] = sum(ends.values())
            row["ingest_lag_records"] = self._ingest_lag(ends)
        except Exception as exc:
            row["records_in"] = row.get("records_in", "")
            row["ingest_lag_records"] = ""
            row["note"] += f" source: {exc}"[:120]
        row["records_out"] = output_rows(self.output)
        try:
            wends = end_offsets(self.config, self.windows_topic)
            done = sink_offsets(self.output)
            row["sink_lag_offsets"] = sum(max(o - done.get(p, 0), 0) for p, o in wends.items())
        except Exception as exc:
            row["sink_lag_offsets"] = ""
            row["note"] += f" windows: {exc}"[:120]
        try:
            mark = windows_watermark(self.config, self.windows_topic, self.run_id)
            # None before every partition has a watermark; past the end of stream the watermark is "end".
            ended = mark is None or mark >= MAX_TIMESTAMP
            row["windows_wm_lag_s"] = "" if mark is None or ended else round(time.time() - mark / 1000, 1)
        except Exception as exc:
            row["windows_wm_lag_s"] = ""
            row["note"] += f" inspect: {exc}"[:120]
        tx = self.tx_tool.query(self.run_topics())
        row.update(tx_ongoing=tx.ongoing, tx_oldest_s=round(tx.oldest_ongoing_s, 1),
                   tx_open_partitions=tx.open_partitions, tx_hanging=tx.hanging)
        if tx.error:
            row["note"] += f" transactions: {tx.error}"
        broker_dir = self.out / "broker"
        row["disk_broker_mb"] = round(disk_bytes(broker_dir) / 1e6, 1)
        row["disk_run_mb"] = round(disk_bytes(self.run_dir) / 1e6, 2)
        row["disk_output_mb"] = round((disk_bytes(self.output) + disk_bytes(checkpoint_path(self.output))) / 1e6, 2)
        row["disk_spark_mb"] = round(disk_bytes(self.spark_local) / 1e6, 2)
        row["disk_total_mb"] = round(disk_bytes(self.out) / 1e6, 1)
        row["load1"] = round(os.getloadavg()[0], 2)
        row["note"] = row["note"].strip()
        self.samples.append(row)
        with (self.out / "samples.csv").open("a", newline="") as f:
            w = csv.DictWriter(f, COLUMNS)
            if f.tell() == 0:
                w.writeheader()
            w.writerow(row)
        print(f"{row['utc']} +{row['t_s']:7.1f} s  sample: RSS MB ingest {row['rss_ingest_mb']} window "
              f"{row['rss_window_mb']} sink {row['rss_sink_mb']}; in {row['records_in']} out {row['records_out']}; "
              f"ingest lag {row['ingest_lag_records']} sink lag {row['sink_lag_offsets']} wm lag "
              f"{row['windows_wm_lag_s']} s; tx ongoing {tx.ongoing} open partitions {tx.open_partitions} hanging "
              f"{tx.hanging}; disk {row['disk_total_mb']} MB ({time.monotonic() - started:.1f} s to sample)"
              + (f"; {row['note']}" if row["note"] else ""), flush=True)

    def _ingest_lag(self, ends: dict[int, int]) -> int:
        from confluent_kafka import Consumer, TopicPartition

        from controlmsg.kafka.settings import for_client

        group = source_group(self.events_topic, self.run_id)
        consumer = Consumer({**for_client(self.config, "consumer"), "group.id": group, "enable.auto.commit": False})
        try:
            got = consumer.committed([TopicPartition(self.source, p) for p in ends], timeout=30)
        finally:
            consumer.close()
        done = {tp.partition: max(tp.offset, 0) for tp in got}
        return sum(max(end - done.get(p, 0), 0) for p, end in ends.items())

    def run_topics(self) -> list[str]:
        return [self.events_topic, self.windows_topic, f"{self.windows_topic}-state"]

    # -- the whole run

    def run(self) -> None:
        a = self.a
        self.start_chain()
        self.sample("start")
        kills = ([k * a.kill_every * 60 for k in range(1, int(a.minutes // a.kill_every) + 1)]
                 if a.kill_every > 0 else [])
        order = [ROLES[r.strip()] for r in a.kill_order.split(",")]
        next_sample = a.sample_every
        end_s = a.minutes * 60
        k = 0
        while True:
            t = time.monotonic() - self.t0
            if k < len(kills) and t >= kills[k]:
                self.kill_and_restart(order[k % len(order)])
                k += 1
            if t >= next_sample:
                self.sample()
                next_sample += a.sample_every
            self.check_jobs()
            assert self.generator is not None
            if t >= end_s and k >= len(kills) and not self.generator.running():
                break
            time.sleep(0.5)
        assert self.generator is not None
        self.event("end", "generator", f"exit {self.generator.returncode}")
        self.finish(next_sample)

    def finish(self, next_sample: float) -> None:
        """Stop the ingest at a commit, start it again bounded by the source's end, wait for the chain."""
        ingest = self.jobs["stream_ingest"]
        code = ingest.stop(30)
        self.event("SIGTERM", "stream_ingest", f"exit {code}; started again with --until-source-end")
        ingest.start(self.job_argv("stream_ingest", until_source_end=True))
        deadline = time.monotonic() + self.a.end_timeout
        while any(j.running() for j in self.jobs.values()) and time.monotonic() < deadline:
            if time.monotonic() - self.t0 >= next_sample:
                self.sample("draining")
                next_sample += self.a.sample_every
            time.sleep(0.5)
        for name, j in self.jobs.items():
            if j.running():
                self.event("timeout", name, f"still running {self.a.end_timeout:g} s after the end; SIGTERM")
                j.stop(30)
            self.event("exit", name, str(j.returncode))
        self.sample("end")

    def close(self) -> None:
        for j in [*self.jobs.values(), *([self.generator] if self.generator else [])]:
            j.close()


# ---------------------------------------------------------------------------------------------- end checks


def dump_source(config: dict[str, Any], topic: str, path: Path) -> int:
    """Every record of the source topic, one JSON value a line, for the oracle; the count."""
    from confluent_kafka import Consumer, TopicPartition

    from controlmsg.kafka.settings import for_client

    ends = end_offsets(config, topic)
    consumer = Consumer({**for_client(config, "consumer"), "group.id": f"soak-dump-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    want, got = sum(ends.values()), 0
    deadline = time.monotonic() + 1800
    with path.open("wb") as f:
        while got < want and time.monotonic() < deadline:
            batch = [v for m in consumer.consume(10_000, 1.0) if m.error() is None and (v := m.value()) is not None]
            if batch:
                f.write(b"\n".join(batch) + b"\n")
                got += len(batch)
    consumer.close()
    return got


SUM_REL_TOLERANCE = 1e-9
"""Sums of doubles compared within this relative difference, as bench_vs_kafka_connector.py compares: a window
of a heavy key sums about a million amounts here, in another order than Spark's, which moves the sixth
decimal (the six decimals ``normalized`` rounds to were made for the tests' small windows)."""


def oracle_check(soak: Soak, keep_dump: bool) -> dict[str, Any]:
    """The output against ``windowed_oracle`` over every generated event: rows missing, extra, with another
    count, with a sum off by more than :data:`SUM_REL_TOLERANCE`; up to 10 of each kept."""
    sys.path.insert(0, str(HERE.parent))
    from controlmsg.spark.session import spark_session
    from spark_jobs.events import parse_duration, windowed_oracle
    from tests.spark.test_pipeline_oracle import normalized  # the rows as the oracle tests compare them

    dump = soak.out / "source.jsonl"
    started = time.monotonic()
    events = dump_source(soak.config, soak.source, dump)
    spark = spark_session(soak.a.master, "soak-oracle", {"spark.local.dir": str(soak.spark_local)})
    try:
        written = spark.read.option("header", "true").csv(str(soak.output)).collect()
        # Full precision here (normalized rounds to 6 decimals): the sums are compared with a tolerance below.
        got = {r[:3]: r[3:] for r in normalized(written, [])}
        got_sums = {(str(r["key"]), r["window_start"], r["window_end"]): float(r["sum_amount"]) for r in written}
        oracle = windowed_oracle(spark, str(dump), key="user", event_time="event_time",
                                 window_ms=parse_duration(soak.a.window), sums=["amount"]).collect()
        want = {r[:3]: r[3:] for r in normalized(oracle, [])}
        want_sums = {(str(r["key"]), r["window_start"], r["window_end"]): float(r["sum_amount"]) for r in oracle}
    finally:
        spark.stop()
        if not keep_dump:
            dump.unlink(missing_ok=True)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    both = sorted(set(got) & set(want))
    counts = [(k, got[k][0], want[k][0]) for k in both if got[k][0] != want[k][0]]
    rel = {k: abs(got_sums[k] - want_sums[k]) / max(abs(want_sums[k]), 1e-300) for k in both}
    sums = [(k, got_sums[k], want_sums[k]) for k in both if rel[k] > SUM_REL_TOLERANCE]
    six = sum(1 for k in both if round(got_sums[k], 6) != round(want_sums[k], 6))
    return {"events_dumped": events, "rows_out": len(got), "rows_oracle": len(want),
            "equal": not (missing or extra or counts or sums), "missing": len(missing), "extra": len(extra),
            "count_differs": len(counts), "sum_differs": len(sums),
            "sum_max_relative_difference": max(rel.values(), default=0.0),
            "sum_differs_at_6_decimals": six,
            "counted_in_output": sum(int(r["count"]) for r in written),
            "examples": {"missing": missing[:10], "extra": extra[:10], "count": counts[:10], "sum": sums[:10]},
            "seconds": round(time.monotonic() - started, 1)}


def cleanup_listing(soak: Soak) -> str:
    done = subprocess.run([str(Path(sys.executable).with_name("controlmsg")), "cleanup", "--run-id", soak.run_id,
                           "--runs-dir", str(soak.runs_dir), "--kafka-config", str(soak.properties),
                           # its end-of-stream check reads the run's topics from the start, each read bounded by
                           # --timeout: the default 60 s is too short for an events topic of 10M records here
                           "--timeout", "1200"],
                          capture_output=True, text=True, timeout=2400, check=False)
    return (done.stdout + done.stderr).strip() + f"\n(exit {done.returncode})"


# ---------------------------------------------------------------------------------------------- report


def plot(samples: list[dict[str, Any]], events: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(col: str) -> tuple[list[float], list[float]]:
        pts = [(r["t_s"] / 60, float(r[col])) for r in samples if r.get(col) not in ("", None)]
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(3, 2, figsize=(13, 11), sharex=True)
    panels = [
        ("RSS, MB (process and descendants)", ["rss_ingest_mb", "rss_window_mb", "rss_sink_mb", "rss_generator_mb",
                                               "rss_broker_mb"], False),
        ("records in (generated, left) and out (output rows, right)", ["records_in"], False),
        ("lag", ["ingest_lag_records", "sink_lag_offsets"], False),
        ("windows-topic watermark, s behind: the wall clock; the event time generated",
         ["windows_wm_lag_s", "wm_behind_generated_s", "gen_behind_s"], False),
        ("transactions", ["tx_ongoing", "tx_open_partitions", "tx_hanging"], False),
        ("disk under the run's directory, MB", ["disk_broker_mb", "disk_run_mb", "disk_output_mb", "disk_spark_mb"],
         False),
    ]
    for ax, (label, cols, _) in zip(axes.flat, panels, strict=True):
        for col in cols:
            x, y = series(col)
            if x:
                ax.plot(x, y, marker=".", label=col)
        if cols == ["records_in"]:
            right = ax.twinx()
            x, y = series("records_out")
            right.plot(x, y, marker=".", color="tab:orange", label="records_out")
            right.legend(fontsize=7, loc="lower right")
        for e in events:
            if e["event"] == "kill -9":
                ax.axvline(e["t_s"] / 60, color="red", alpha=0.4, linestyle="--")
            elif e["event"] == "SIGTERM":
                ax.axvline(e["t_s"] / 60, color="grey", alpha=0.6, linestyle=":")
        ax.set_title(label, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("minutes since the generator started (red: kill -9; grey: the end's SIGTERM to ingest)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def markdown(samples: list[dict[str, Any]], events: list[dict[str, Any]], checks: dict[str, Any]) -> str:
    """Two tables of the samples (memory, records and lag; transactions and disk), the events, the checks."""
    rows = []
    prev: dict[str, Any] | None = None
    for r in samples:
        rate = ""
        if prev is not None:
            dt = (_num(r["t_s"]) or 0) - (_num(prev["t_s"]) or 0)
            a, b = _num(r.get("records_in")), _num(prev.get("records_in"))
            if dt > 0 and a is not None and b is not None:
                rate = f"{(a - b) / dt:,.0f}"
        rows.append({**r, "in_rate": rate})
        prev = r

    def table(cols: list[tuple[str, str]]) -> list[str]:
        out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---:|" * len(cols)]
        for r in rows:
            cells = []
            for c, _ in cols:
                v = r.get(c, "")
                n = _num(v)
                cells.append(f"{n:,.0f}" if n is not None and c in ("records_in", "records_out", "ingest_lag_records",
                                                                   "sink_lag_offsets") else str(v))
            out.append("| " + " | ".join(cells) + " |")
        return out

    first = table([("t_s", "t (s)"), ("rss_ingest_mb", "RSS ingest MB"), ("rss_window_mb", "RSS window MB"),
                   ("rss_sink_mb", "RSS sink MB"), ("rss_generator_mb", "RSS gen. MB"),
                   ("rss_broker_mb", "RSS broker MB"), ("procs_ingest", "procs ingest/window/sink"),
                   ("records_in", "in (generated)"), ("in_rate", "in/s since last"), ("records_out", "out (rows)"),
                   ("ingest_lag_records", "ingest lag (records)"), ("sink_lag_offsets", "sink lag (offsets)"),
                   ("windows_wm_lag_s", "windows wm behind clock (s)"), ("gen_behind_s", "generator behind (s)"),
                   ("wm_behind_generated_s", "windows wm behind generated (s)")])
    for i, r in enumerate(rows):  # one cell for the three process counts
        first[i + 2] = first[i + 2].replace(f"| {r.get('procs_ingest', '')} |",
                                            f"| {r.get('procs_ingest', '')}/{r.get('procs_window', '')}/"
                                            f"{r.get('procs_sink', '')} |", 1)
    second = table([("t_s", "t (s)"), ("tx_ongoing", "tx Ongoing (coordinator)"), ("tx_oldest_s", "oldest (s)"),
                    ("tx_open_partitions", "run partitions with open tx"), ("tx_hanging", "hanging"),
                    ("disk_broker_mb", "disk broker MB"), ("disk_run_mb", "disk run dir MB"),
                    ("disk_output_mb", "disk output+ckpt MB"), ("disk_spark_mb", "disk spark-local MB"),
                    ("disk_total_mb", "disk total MB"), ("load1", "load (1 min)"), ("note", "note")])
    ev = ["| t (s) | UTC | event | job | detail |", "|---:|---|---|---|---|"]
    for e in events:
        detail = e["detail"].splitlines()[0] if e["detail"] else ""
        ev.append(f"| {e['t_s']} | {e['utc']} | {e['event']} | {e['job']} | {detail} |")
    shown = {k: v for k, v in checks.items() if k != "transactions_at_end"}
    tx = checks.get("transactions_at_end", {})
    shown["transactions_at_end"] = {k: v for k, v in tx.items() if k != "listed"}
    shown["transactions_at_end"]["states"] = sorted({t["state"] for t in tx.get("listed", [])})
    return "\n".join(["#### Memory, records, lag", "", *first, "", "#### Transactions, disk", "", *second, "",
                      "#### Kills, restarts, exits", "", *ev, "", "#### End checks", "", "```json",
                      orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode(), "```", ""])


def derive(samples: list[dict[str, Any]], rate: float) -> None:
    """Add two columns to each sample: how far the generator is behind its schedule (``t - in / rate``,
    seconds; its event clock runs ``in / rate`` seconds from its start, at speedup 1), and so how far the
    windows topic's watermark is behind the event time generated so far (its lag to the wall clock minus
    the generator's own delay). Both to within a few seconds: the figures of one sample are taken a few
    seconds apart. Empty after the generator stopped (the schedule no longer applies)."""
    for r in samples:
        r["t_s"] = float(r["t_s"])
        n, lag = _num(r.get("records_in")), _num(r.get("windows_wm_lag_s"))
        behind = None if n is None else r["t_s"] - n / rate
        live = r.get("note", "") not in ("draining", "end")
        r["gen_behind_s"] = "" if behind is None or not live else round(behind, 1)
        r["wm_behind_generated_s"] = "" if behind is None or lag is None or not live else round(lag - behind, 1)


def report(out: Path) -> None:
    """``soak.png`` and ``soak.md`` in ``out`` from its ``samples.csv``, ``events.csv`` and ``summary.json``."""
    with (out / "samples.csv").open() as f:
        samples = list(csv.DictReader(f))
    with (out / "events.csv").open() as f:
        events = [{**e, "t_s": float(e["t_s"])} for e in csv.DictReader(f)]
    checks = orjson.loads((out / "summary.json").read_bytes())
    derive(samples, float(checks["rate"]))
    title = (f"soak {checks.get('run_id')}: {checks.get('rate', 0):,.0f} events/s asked, {checks.get('minutes')} min, "
             f"kill -9 every {checks.get('kill_every_min')} min, {checks.get('started')}")
    try:
        plot(samples, events, out / "soak.png", title)
    except ImportError:
        print("soak: no matplotlib (pip install -e '.[bench]'): no plot", file=sys.stderr)
    (out / "soak.md").write_text(markdown(samples, events, checks))


# ---------------------------------------------------------------------------------------------- main


def soak_parser() -> argparse.ArgumentParser:
    """The soak run's command line (``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="how long the generator writes")
    p.add_argument("--rate", type=float, default=MEASURED_MAX_RATE / 2,
                   help="events/s (default: half of the 63k records/s bench_streaming measured, docs/PERFORMANCE.md)")
    p.add_argument("--kill-every", type=float, default=10.0, help="minutes between two kill -9 (0: none)")
    p.add_argument("--kill-order", default="ingest,window,sink", help="the jobs killed in turn")
    p.add_argument("--sample-every", type=float, default=60.0, help="seconds between two samples")
    p.add_argument("--out", type=Path, help="directory for everything (default: soak-<UTC time>)")
    p.add_argument("--window", default="1m")
    p.add_argument("--watermark-interval", default="1s")
    p.add_argument("--allowed-lateness", default="10s")
    p.add_argument("--disorder", default="5s", help="generated events are out of order by up to this")
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--run-id")
    p.add_argument("--end-timeout", type=float, default=900.0,
                   help="seconds the chain has to end after the generator stopped")
    p.add_argument("--no-oracle", action="store_true", help="skip the oracle check (it dumps the source topic)")
    p.add_argument("--keep-dump", action="store_true", help="keep the source dump the oracle read")
    p.add_argument("--keep-broker-data", action="store_true")
    add_cluster_options(p)
    p.add_argument("--report-only", type=Path, metavar="DIR",
                   help="only draw soak.png and write soak.md again from DIR's samples.csv, events.csv, summary.json")
    return p


def end_checks(soak: Soak, a: argparse.Namespace, config: dict[str, Any], out: Path, checks: dict[str, Any]) -> None:
    """Add to ``checks`` what the run ended with: exit codes and starts, late records and windows, records in
    and out, the transactions left, the largest files, the oracle (unless ``--no-oracle``), the cleanup
    listing."""
    gen = soak.generator
    checks["generator_exit"] = gen.returncode if gen else None
    checks["job_exits"] = {n: j.returncode for n, j in soak.jobs.items()}
    checks["job_starts"] = {n: j.starts for n, j in soak.jobs.items()}
    checks["unplanned_exits"] = sum(1 for e in soak.events if e["event"] == "unplanned exit")
    window = orjson.loads((soak.run_dir / "stream_window.json").read_bytes()) \
        if (soak.run_dir / "stream_window.json").exists() else None
    checks["late"] = None if window is None else sum(int(t["late"]) for t in window["tasks"])
    checks["windows_emitted"] = None if window is None else sum(int(t["windows_emitted"]) for t in window["tasks"])
    sink = orjson.loads((soak.run_dir / "stream_sink.json").read_bytes()) \
        if (soak.run_dir / "stream_sink.json").exists() else None
    checks["sink_rows"] = None if sink is None else sink.get("rows")
    checks["records_in"] = sum(end_offsets(config, soak.source).values())
    checks["records_out"] = output_rows(soak.output)
    tx = soak.tx_tool.query(soak.run_topics())
    checks["transactions_at_end"] = {"ongoing_at_coordinator": tx.ongoing, "open_on_run_partitions":
                                     tx.open_partitions, "hanging": tx.hanging, "error": tx.error,
                                     "listed": tx.raw.get("transactions", [])}
    checks["largest_files"] = sorted(
        ((str(f.relative_to(out)), f.stat().st_blocks * 512) for f in out.rglob("*") if f.is_file()),
        key=lambda x: -x[1])[:10]
    if not a.no_oracle:
        checks["oracle"] = oracle_check(soak, a.keep_dump)
        checks["oracle"]["counts_plus_late_equal_events"] = (
            checks["late"] is not None
            and checks["oracle"]["counted_in_output"] + checks["late"] == checks["records_in"])
    checks["cleanup_listing"] = cleanup_listing(soak)


def write_results(soak: Soak, out: Path, checks: dict[str, Any]) -> None:
    """``summary.json`` and ``events.csv`` in ``out``, then, when there are samples, the report."""
    checks["ended"] = now_iso()
    (out / "summary.json").write_bytes(orjson.dumps(checks, option=orjson.OPT_INDENT_2))
    with (out / "events.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, ["t_s", "utc", "event", "job", "detail"])
        w.writeheader()
        w.writerows(soak.events)
    if soak.samples:
        report(out)


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM both end the run through ``main``'s cleanup (the jobs, the broker, the results):
    a shell starts a background command (``nohup ... &``) with SIGINT ignored, and Python keeps an ignored
    SIGINT ignored, so ``kill -INT`` did nothing there and ``kill`` left the jobs and the broker running."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    a = soak_parser().parse_args(argv)
    _stop_on_signals()
    if a.report_only is not None:
        report(a.report_only)
        return 0
    out = (a.out or Path(f"soak-{datetime.now(UTC):%Y%m%dT%H%M%SZ}")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.csv").unlink(missing_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    broker_dir = out / "broker"
    handle = None
    if cluster_given(a):
        config = dict(client_config_from_args(a, default_servers=local_bootstrap_servers))
    else:
        from controlmsg.clusters.broker import start_broker

        handle = start_broker(port=free_ports(), data_dir=broker_dir)
        config = {"bootstrap.servers": handle.bootstrap_servers}
    print(f"soak: {os.cpu_count()} cores (load {load_average()}), broker {config['bootstrap.servers']}"
          f"{' (started here)' if handle else ' (given)'}, {a.rate:,.0f} events/s for {a.minutes:g} min, kill -9 "
          f"every {a.kill_every:g} min, a sample every {a.sample_every:g} s; out {out}", flush=True)
    soak = Soak(a, config, out, handle.pid if handle else None)
    checks: dict[str, Any] = {"run_id": soak.run_id, "rate": a.rate, "minutes": a.minutes,
                              "kill_every_min": a.kill_every, "sample_every_s": a.sample_every,
                              "started": now_iso(), "broker": "started here" if handle else "given"}
    failed = False
    try:
        soak.run()
        end_checks(soak, a, config, out, checks)
    except BaseException as exc:
        failed = True
        checks["error"] = f"{type(exc).__name__}: {exc}"
        print(f"soak: {checks['error']}", file=sys.stderr, flush=True)
        if not isinstance(exc, Exception):
            raise
    finally:
        soak.close()
        write_results(soak, out, checks)
        if handle is not None:
            from controlmsg.clusters.broker import stop_broker

            stop_broker(broker_dir)
            if not a.keep_broker_data:
                shutil.rmtree(broker_dir, ignore_errors=True)
    print(orjson.dumps({k: v for k, v in checks.items() if k not in ("largest_files",)},
                       option=orjson.OPT_INDENT_2).decode())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
