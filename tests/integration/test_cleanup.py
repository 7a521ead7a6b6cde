"""``controlmsg cleanup`` on a real broker: a finished run is listed with exactly its topics, consumer groups
and run directory, and deleted, another run left whole; a live run (a group member, an open transaction, a
process naming it) and a run that has not ended are refused with one line, nothing deleted.

The runs are made the way the pipeline's jobs make them, without Spark: the streaming ingest's task body
(:func:`controlmsg.streaming.ingest.run_ingest_task`: transactional writes, its source group, its end of stream)
writes the events topic, and the events are written to the windows topic as a Spark batch write does it
(a transaction and a commit marker per task, then the driver's end-of-stream round with its own marker)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from controlmsg.cli import EXIT_OK, EXIT_REFUSED, main
from controlmsg.core.messages import EndOfStreamMessage
from controlmsg.core.naming import driver_transactional_id, marker_group, task_name, transactional_id
from controlmsg.kafka.admin import create_topic
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round
from controlmsg.kafka.writer import ControlWriter
from controlmsg.streaming.ingest import run_ingest_task, source_group
from spark_jobs.common import topic_names


def topics_of(config: dict[str, Any]) -> set[str]:
    return set(AdminClient(config).list_topics(timeout=10).topics)


def groups_of(config: dict[str, Any]) -> set[str]:
    admin = AdminClient(config)  # kept until the answer is in: a collected client cancels its requests
    listing = admin.list_consumer_groups(request_timeout=10).result()
    assert not listing.errors
    return {g.group_id for g in listing.valid}


def write_windows(config: dict[str, Any], topic: str, run: str, rows: list[dict[str, Any]], tasks: int = 2) -> None:
    """``rows`` to ``topic`` as a Spark batch write of job ``window_aggregate`` does: each task's share in
    one transaction with its commit marker, then the driver's end of stream of every task with its own."""
    for i in range(tasks):
        txn = transactional_id(topic, task_name("window_aggregate", run, i))
        writer = ControlWriter({**config, "transactional.id": txn}, topic,
                               task_name=task_name("window_aggregate", run, i), task_count=None, run_id=run)
        with MarkerStore(config, txn, topic) as store, writer:
            share = rows[i::tasks]
            for row in share:
                writer.send(row, str(row["user"]))
            store.add(writer, {"batch": 0, "rows": len(share)}, len(share))
    ends = [EndOfStreamMessage(task_name("window_aggregate", run, i), tasks, run) for i in range(tasks)]

    def plan(committed: dict[str, Any] | None) -> Round | None:
        return None if committed else (ends, {"ended": True, "taskCount": tasks})

    write_control_round(config, topic, 2, plan,
                        transactional_id=driver_transactional_id(topic, "window_aggregate", run))


def make_run(config: dict[str, Any], source: str, ends: dict[int, int], run: str, runs_dir: Path) -> set[str]:
    """A finished run ``run`` of the events and windows hops, with its run directory; returns the names of
    the consumer groups it made."""
    events, windows = topic_names(run)
    for topic, partitions in ((events, 2), (f"{events}-rejects", 1), (f"{events}-stop", 1), (windows, 2)):
        create_topic(config, topic, partitions)
    summary = run_ingest_task(config, source_topic=source, source_partitions=[0, 1], output_topic=events,
                              rejects_topic=f"{events}-rejects", run_id=run, task_index=0, task_count=1,
                              key_field="user", event_time_field="ts", watermark_interval_s=0.2, until=ends)
    assert summary.ended and summary.records == 20
    write_windows(config, windows, run, [{"user": f"u{i}", "count": 1} for i in range(6)])
    (runs_dir / run).mkdir(parents=True)
    (runs_dir / run / "ingest.log").write_text("a log line\n")
    return {source_group(events, run), marker_group(driver_transactional_id(windows, "window_aggregate", run)),
            *(marker_group(transactional_id(windows, task_name("window_aggregate", run, i))) for i in range(2))}


@pytest.fixture
def source(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> tuple[str, dict[int, int]]:
    """A raw source topic (the user's, not any run's): 20 events over 2 partitions, and its end offsets."""
    topic = new_topic(2, prefix="cleanup-source")
    producer = Producer(kafka_config)
    for n in range(20):
        producer.produce(topic, orjson.dumps({"user": f"u{n % 5}", "ts": 1_767_225_600_000 + n * 1000}),
                         partition=n % 2)
    assert producer.flush(30) == 0
    return topic, {0: 10, 1: 10}


def cleanup(bootstrap: str, runs_dir: Path, run: str, *extra: str,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], list[str]]:
    capsys.readouterr()
    code = main(["cleanup", "--bootstrap-servers", bootstrap, "--runs-dir", str(runs_dir), "--run-id", run, *extra])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_a_finished_run_is_listed_exactly_and_deleted_leaving_other_runs(
        kafka_config: dict[str, Any], bootstrap_servers: str, source: tuple[str, dict[int, int]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    runs_dir = tmp_path / "runs"
    run = f"c{uuid.uuid4().hex[:8]}"
    other = f"{run}-2"  # a run id that starts with the first one's: its names start alike
    groups = make_run(kafka_config, *source, run, runs_dir)
    other_groups = make_run(kafka_config, *source, other, runs_dir)
    events, windows = topic_names(run)
    topics = [events, f"{events}-rejects", f"{events}-stop", windows]
    other_topics = {t.replace(run, other, 1) for t in topics}
    assert set(topics) | other_topics <= topics_of(kafka_config)
    assert groups | other_groups <= groups_of(kafka_config)

    code, out, err = cleanup(bootstrap_servers, runs_dir, run, capsys=capsys)
    assert code == EXIT_OK, err
    partitions = {events: 2, f"{events}-rejects": 1, f"{events}-stop": 1, windows: 2}
    assert out == ([f"topic {t} ({n} partition{'s' if n > 1 else ''})" for t, n in sorted(partitions.items())]
                   + [f"group {g} (empty)" for g in sorted(groups)] + [f"files {runs_dir / run}"])
    assert err == [f"run {run}: 4 topic(s), 4 consumer group(s), 1 local path(s); not live, ended: --delete "
                   "deletes it; nothing deleted"]
    assert set(topics) <= topics_of(kafka_config) and groups <= groups_of(kafka_config)  # a listing deletes nothing
    assert (runs_dir / run).is_dir()

    code, out, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", capsys=capsys)
    assert code == EXIT_OK, err
    assert err[-1].startswith(f"run {run}: deleted 4 topic(s), 4 consumer group(s), 1 local path(s)")
    assert not set(topics) & topics_of(kafka_config)
    assert not groups & groups_of(kafka_config)
    assert not (runs_dir / run).exists()
    # The other run, whose every name starts with the first run's id, is whole.
    assert other_topics <= topics_of(kafka_config) and other_groups <= groups_of(kafka_config)
    assert (runs_dir / other / "ingest.log").exists()
    assert source[0] in topics_of(kafka_config)  # the user's source topic is no run's

    code, out, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", capsys=capsys)  # again: nothing left
    assert (code, out) == (EXIT_OK, [])
    assert err[0].startswith(f"run {run}: nothing found")


@pytest.fixture
def unfinished(kafka_config: dict[str, Any], tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A run whose events topic has records and a watermark but no end of stream (a stopped run)."""
    run = f"u{uuid.uuid4().hex[:8]}"
    events = topic_names(run)[0]
    create_topic(kafka_config, events, 2)
    with ControlWriter(kafka_config, events, task_name=task_name("ingest", run, 0), task_count=1, run_id=run) as w:
        w.send({"user": "u"}, "u")
        w.send_watermark(1_767_225_600_000)
    (tmp_path / "runs" / run).mkdir(parents=True)
    yield run, tmp_path / "runs"


def assert_untouched(config: dict[str, Any], run: str, runs_dir: Path) -> None:
    assert topic_names(run)[0] in topics_of(config)
    assert (runs_dir / run).is_dir()


def test_a_run_that_has_not_ended_is_refused_unless_forced(
        kafka_config: dict[str, Any], bootstrap_servers: str, unfinished: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    run, runs_dir = unfinished
    events = topic_names(run)[0]
    code, out, err = cleanup(bootstrap_servers, runs_dir, run, capsys=capsys)
    assert code == EXIT_OK
    assert f"not ended: topic {events} partition(s) 0, 1 have not reached end of stream" in out
    code, out, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", capsys=capsys)
    assert code == EXIT_REFUSED
    assert err == [f"refused: run {run} has not ended, nothing deleted: topic {events} partition(s) 0, 1 have not "
                   f"reached end of stream (stopped or failed: its jobs started again with --run-id {run} resume it; "
                   "--force deletes it anyway)"]
    assert_untouched(kafka_config, run, runs_dir)
    code, out, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", "--force", capsys=capsys)
    assert code == EXIT_OK, err
    assert events not in topics_of(kafka_config) and not (runs_dir / run).exists()


def test_a_run_with_an_active_group_member_is_refused(
        kafka_config: dict[str, Any], bootstrap_servers: str, unfinished: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    run, runs_dir = unfinished
    events = topic_names(run)[0]
    group = source_group(events, run)
    member = Consumer({**kafka_config, "group.id": group, "enable.auto.commit": False})
    try:
        member.subscribe([events])
        deadline = time.monotonic() + 30
        while not member.assignment():
            assert time.monotonic() < deadline, "the member got no assignment"
            member.poll(0.2)
        for extra in ([], ["--force"]):  # --force does not override liveness
            code, _, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", *extra, capsys=capsys)
            assert code == EXIT_REFUSED
            assert len(err) == 1
            assert err[0].startswith(f"refused: run {run} is live, nothing deleted: consumer group {group} has 1 "
                                     "active member(s) (state STABLE)")
            assert_untouched(kafka_config, run, runs_dir)
            assert group in groups_of(kafka_config)
    finally:
        member.close()


def test_a_run_with_an_open_transaction_is_refused(
        kafka_config: dict[str, Any], bootstrap_servers: str, unfinished: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    run, runs_dir = unfinished
    events = topic_names(run)[0]
    name = task_name("ingest", run, 1)
    writer = ControlWriter({**kafka_config, "transactional.id": transactional_id(events, name)}, events,
                           task_name=name, task_count=2, run_id=run)
    try:
        writer.send({"user": "v"}, partition=1)
        writer.flush()  # delivered, not committed
        code, _, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", "--force", capsys=capsys)
        assert code == EXIT_REFUSED
        assert len(err) == 1
        assert err[0].startswith(f"refused: run {run} is live, nothing deleted: topic {events} partition 1 has an "
                                 "open transaction (last stable offset ")
        assert_untouched(kafka_config, run, runs_dir)
    finally:
        writer.abort()
        writer.close()


def test_a_run_named_by_a_process_is_refused(
        kafka_config: dict[str, Any], bootstrap_servers: str, unfinished: tuple[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    run, runs_dir = unfinished
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--run-id", run])
    try:
        code, out, err = cleanup(bootstrap_servers, runs_dir, run, "--delete", "--force", capsys=capsys)
        assert code == EXIT_REFUSED
        assert len(err) == 1
        assert err[0].startswith(f"refused: run {run} is live, nothing deleted: process {job.pid} (")
        assert "time.sleep(120) --run-id" in err[0]
        assert_untouched(kafka_config, run, runs_dir)
    finally:
        job.kill()
        job.wait(10)
    code, out, err = cleanup(bootstrap_servers, runs_dir, run, capsys=capsys)  # the process gone: not live
    assert not any(line.startswith("live:") for line in out)

