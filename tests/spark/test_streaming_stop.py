"""Graceful stop of the streaming pipeline (issue 10, item 3), on the real broker and Spark.

* SIGTERM to a running ``pipeline windowed-count --streaming``: every job process (drivers, JVMs, Python
  workers) is gone within the documented bound, the pipeline exits 143, the jobs stopped at a commit
  (their tasks returned; none was cancelled), no transaction is left open on the intermediate topics,
  and the same command with the same run id completes equal to the oracle: nothing lost, nothing twice.
* SIGTERM to one job of the chain (the others running): it exits 143 within the bound at a commit,
  and the same job started again completes the run equal to the oracle.
* A window job that fails at start (a corrupt state record of its run) makes the pipeline stop the
  sink and the ingest (each exits 143) and exit 1 naming the job and its log; no process is left.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark.sql import SparkSession

from controlmsg.clusters.jobs import Job
from controlmsg.clusters.processes import descendants, pid_alive
from controlmsg.kafka.admin import create_topic, partition_count
from controlmsg.streaming.state_topic import state_key, state_topic_config
from spark_jobs.common import topic_names
from spark_jobs.generate import GeneratorConfig, generate
from spark_jobs.pipeline_run import JOB_STOP_GRACE_S
from tests.transactions import held_back

from .test_pipeline_oracle import assert_matches_oracle
from .test_streaming_pipeline import generated_source
from .test_streaming_restarts import Chain, check_wire, wait_for_records

EVENTS = 4000


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    left = {p for p in pids if pid_alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {p for p in left if pid_alive(p)}
    return left


def open_transactions(config: dict[str, Any], topic: str) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic`` where a transaction is still open: (last stable offset, high watermark)
    (:func:`tests.transactions.held_back`)."""
    count = partition_count(config, topic)
    assert count is not None, topic
    return held_back(config, topic, count)[0]


def pipeline_command(source: str, servers: str, output: Path, run_id: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_jobs.pipeline", "windowed-count", "--streaming", "--source-topic", source,
            "--key", "user", "--event-time", "event_time", "--window", "1m", "--sum", "amount",
            "--allowed-lateness", "10s", "--watermark-interval", "300ms", "--output", str(output),
            "--bootstrap-servers", servers, "--partitions", "3", "--tasks", "2", "--master", "local[2]",
            "--timeout", "300", "--run-id", run_id, "--run-dir", str(run_dir), *extra]


def test_sigterm_to_the_pipeline_then_restart(spark: SparkSession, kafka_config: dict[str, Any],
                                              bootstrap_servers: str, new_topic: Callable[..., str],
                                              tmp_path: Path) -> None:
    source = new_topic(4, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=EVENTS, keys=40, disorder_ms=5000, seed=33)
    output, run_dir, run_id = tmp_path / "windows.csv", tmp_path / "run", f"stop-{uuid.uuid4().hex[:8]}"
    # paced (about 20 s of input once running), so the stop comes mid-run; the restart reads the rest unpaced
    command = pipeline_command(source, bootstrap_servers, output, run_id, run_dir, "--until-source-end")
    paced = [*command, "--max-rate", "100"]
    events_topic, windows_topic = topic_names(run_id)
    proc = Job("pipeline", paced, tmp_path / "first.err")  # its own session, as from a terminal
    proc.start()
    try:
        wait_for_records(kafka_config, windows_topic, run_id, 20)  # window results flow, before the end
        assert proc.pid is not None
        jobs = descendants(proc.pid)
        assert proc.poll() is None and len(jobs) >= 5  # three jobs, two JVMs (and their Python workers)
        signalled = time.monotonic()
        proc.signal(signal.SIGTERM)
        code = proc.wait(JOB_STOP_GRACE_S + 30)
        stop_s = time.monotonic() - signalled
        left = wait_gone(jobs, 10)
    finally:
        proc.close()
    stderr = (tmp_path / "first.err").read_text(errors="replace")
    print(f"pipeline stopped {stop_s:.1f} s after SIGTERM")
    assert code == 143, stderr[-3000:]
    assert not [job for job in ("stream_ingest", "stream_window", "stream_sink")  # none stopped at its hard limit
                if "exiting now" in (run_dir / f"{job}.log").read_text(errors="replace")], stderr[-3000:]
    assert not left, f"processes left after the pipeline stopped: {left}"
    for job in ("stream_ingest", "stream_window", "stream_sink"):
        assert f"{job} exit 143" in stderr, stderr[-3000:]
    for job in ("stream_ingest", "stream_window"):  # at a commit: the tasks returned, none was cancelled
        log = (run_dir / f"{job}.log").read_text(errors="replace")
        assert "every task committed and returned" in log and "cancelling them" not in log, log[-3000:]
    sink = json.loads((run_dir / "stream_sink.json").read_text())
    assert not sink["ended"]  # it was mid-run
    for topic in (events_topic, windows_topic, f"{windows_topic}-state"):
        assert open_transactions(kafka_config, topic) == {}, topic

    again = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = assert_matches_oracle(spark, str(output), input_path=str(events), key="user", event_time="event_time",
                                 window="1m", sums=["amount"])
    assert rows > 150  # ten minutes of event time, 40 keys
    window = json.loads((run_dir / "stream_window.json").read_text())
    assert all(t["resumed"] for t in window["tasks"])  # from the state the stop committed
    assert sum(t["windows_emitted"] for t in window["tasks"]) == rows  # each window written once in all
    sink = json.loads((run_dir / "stream_sink.json").read_text())
    assert sink["rows"] == rows and sink["ended"] and sink["resumed"]
    check_wire(kafka_config, events_topic, tasks=2)
    check_wire(kafka_config, windows_topic, tasks=3)  # a window task per events partition


def test_a_window_job_failing_at_start_stops_the_others(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                        new_topic: Callable[..., str], tmp_path: Path) -> None:
    source = new_topic(4, prefix="raw")
    generate(kafka_config, source, GeneratorConfig(events=500, rate=1e6, keys=10, start_ms=1_767_225_600_000,
                                                   speedup=1e5, seed=5))
    output, run_dir, run_id = tmp_path / "windows.csv", tmp_path / "run", f"fail-{uuid.uuid4().hex[:8]}"
    # Only the window job reads this: a state record of its task 0 that is not JSON (CheckpointError at start).
    state_topic = f"{topic_names(run_id)[1]}-state"
    create_topic(kafka_config, state_topic, 1, topic_config=state_topic_config({}))
    producer = Producer(kafka_config)
    producer.produce(state_topic, b"not json", state_key(run_id, 0).encode(), partition=0)
    assert producer.flush(10) == 0
    # unbounded: the ingest and the sink would run forever on their own
    command = pipeline_command(source, bootstrap_servers, output, run_id, run_dir)
    seen: set[int] = set()
    proc = Job("pipeline", command, tmp_path / "pipeline.err")
    proc.start()
    try:
        assert proc.pid is not None
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(descendants(proc.pid))
            time.sleep(0.5)
        code = proc.poll()
        left = wait_gone(seen, 10)
    finally:
        proc.close()
    stderr = (tmp_path / "pipeline.err").read_text(errors="replace")
    assert code == 1, stderr[-3000:]
    assert "job stream_window failed (exit 1)" in stderr and f"{run_dir / 'stream_window'}.log" in stderr, stderr
    assert "CheckpointError" in stderr, stderr[-3000:]
    assert "stream_ingest exit 143" in stderr and "stream_sink exit 143" in stderr, stderr[-3000:]
    assert len(seen) >= 4 and not left, f"processes left after the pipeline ended: {left}"


def test_sigterm_to_each_job_in_turn_then_restart(spark: SparkSession, kafka_config: dict[str, Any],
                                                  bootstrap_servers: str, new_topic: Callable[..., str],
                                                  tmp_path: Path) -> None:
    """One run of the chain; each job alone gets SIGTERM once in the middle of it (its own process only, as
    the pipeline signals it), stops by itself at a commit, and is started again: the ingest after 1,500
    events, the window job and then the sink once window results flow."""
    source = new_topic(4, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=6000, keys=40, disorder_ms=5000, seed=34)
    chain = Chain(bootstrap_servers, source, tmp_path)
    for topic in (chain.events_topic, chain.windows_topic):  # as the pipeline does: the sink need not wait
        create_topic(kafka_config, topic, 3)
    try:
        for name in ("stream_sink", "stream_window", "stream_ingest"):
            chain.start(name)
        for job, topic, records in (("stream_ingest", chain.events_topic, 1500),
                                    ("stream_window", chain.windows_topic, 40),
                                    ("stream_sink", chain.windows_topic, 40)):
            wait_for_records(kafka_config, topic, chain.run_id, records)
            proc = chain.jobs[job]
            assert proc.poll() is None, f"{job} ended before the signal: the test lost its timing"
            signalled = time.monotonic()
            proc.signal(signal.SIGTERM)
            code = proc.wait(JOB_STOP_GRACE_S + 10)
            print(f"{job} stopped {time.monotonic() - signalled:.1f} s after SIGTERM")
            log = (chain.run_dir / f"{job}.log").read_text(errors="replace")
            assert code == 143 and "exiting now" not in log, log[-3000:]  # stopped by itself, not at its hard limit
            if job != "stream_sink":
                assert "every task committed and returned" in log and "cancelling them" not in log, log[-3000:]
                assert open_transactions(kafka_config, topic) == {}
            chain.start(job)
        chain.wait()
    finally:
        chain.close()
    rows = assert_matches_oracle(spark, str(chain.output), input_path=str(events), key="user",
                                 event_time="event_time", window="1m", sums=["amount"])
    window = json.loads((chain.run_dir / "stream_window.json").read_text())
    assert sum(t["windows_emitted"] for t in window["tasks"]) == rows
    assert all(t["resumed"] for t in window["tasks"])  # from the state its stop committed
    sink = json.loads((chain.run_dir / "stream_sink.json").read_text())
    assert sink["rows"] == rows and sink["ended"] and sink["resumed"]
    check_wire(kafka_config, chain.events_topic, tasks=2)
    check_wire(kafka_config, chain.windows_topic, tasks=3)  # a window task per events partition
