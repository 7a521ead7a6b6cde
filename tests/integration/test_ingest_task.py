"""The streaming ingest task (raw source -> intermediate topic) on a real broker: every good record once,
rejects kept, its own watermarks and end of stream, and a stop/restart in the middle that loses and
duplicates nothing (one transaction holds records, watermark and source offsets)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from controlmsg.core.codec import decode, decode_json_payload
from controlmsg.core.events import StreamEnded
from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.errors import CheckpointError
from controlmsg.kafka import ControlReader, DataRecord
from controlmsg.streaming.ingest import parse_event_time, run_ingest_task
from controlmsg.streaming.ingest import source_group as ingest_group
from controlmsg.streaming.task_metrics import serve_job_metrics
from spark_jobs.generate import GeneratorConfig, generate


def test_parse_event_time_rules() -> None:
    assert parse_event_time("2026-01-01T00:00:01Z") == 1_767_225_601_000
    assert parse_event_time("2026-01-01T02:00:01+02:00") == 1_767_225_601_000
    assert parse_event_time("2026-01-01 00:00:01") == 1_767_225_601_000
    assert parse_event_time(1_767_225_601_000) == parse_event_time("1767225601000") == 1_767_225_601_000
    assert parse_event_time("yesterday") is None and parse_event_time(None) is None and parse_event_time(True) is None
    assert parse_event_time(1.5) is None


def source_with_rejects(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> tuple[str, dict[int, int]]:
    source = new_topic(4, prefix="source")
    generate(kafka_config, source, GeneratorConfig(events=3000, rate=1e6, keys=30, start_ms=1_767_225_600_000,
                                                   speedup=100.0, seed=9))
    p = Producer(kafka_config)
    for i, bad in enumerate([b'{"user": null, "event_time": "2026-01-01T00:00:00Z"}',
                             b'{"user": "u", "event_time": "whenever"}', b"not json"]):
        p.produce(source, bad, b"bad", partition=i)
    p.flush(30)
    consumer = Consumer({**kafka_config, "group.id": "x"})
    ends = {q: consumer.get_watermark_offsets(TopicPartition(source, q), timeout=10)[1] for q in range(4)}
    consumer.close()
    return source, ends


def run_two_tasks(kafka_config: dict[str, Any], source: str, out: str, rejects: str, ends: dict[int, int],
                  stop: Callable[[int], bool] | None = None, metrics_url: str | None = None) -> list[Any]:
    results: list[Any] = [None, None]

    def task(i: int) -> None:
        results[i] = run_ingest_task(
            kafka_config, source_topic=source, source_partitions=[2 * i, 2 * i + 1], output_topic=out,
            rejects_topic=rejects, run_id="r", task_index=i, task_count=2, key_field="user",
            event_time_field="event_time", allowed_lateness_ms=1000, watermark_interval_s=0.2, until=ends, stop=stop,
            metrics_url=metrics_url)

    threads = [threading.Thread(target=task, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def read_output(kafka_config: dict[str, Any], out: str) -> list[Any]:
    with ControlReader(kafka_config, out, run_id="r") as reader:
        items = list(reader.read_until_end(timeout=60))
    assert isinstance(items[-1], StreamEnded)
    return [decode_json_payload(i.payload) for i in items if isinstance(i, DataRecord)]


def task_watermarks(kafka_config: dict[str, Any], out: str, tasks: int = 2) -> dict[str, list[int]]:
    """Every committed watermark each task wrote to partition 0, in order, up to their ends of stream."""
    consumer = Consumer({**kafka_config, "group.id": "w", "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(out, 0, 0)])
    marks: dict[str, list[int]] = {}
    ended: set[str] = set()
    deadline = time.monotonic() + 30
    while len(ended) < tasks:
        assert time.monotonic() < deadline, f"ends of stream seen: {ended}"
        for m in consumer.consume(1000, 0.5):
            if m.error() is None:
                msg = decode(m.value())
                if isinstance(msg, WatermarkMessage):
                    marks.setdefault(msg.task_name, []).append(msg.timestamp)
                elif isinstance(msg, EndOfStreamMessage):
                    ended.add(msg.task_name)
    consumer.close()
    return marks


def test_ingest_tasks_end_by_themselves(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    source, ends = source_with_rejects(kafka_config, new_topic)
    out, rejects = new_topic(3, prefix="events"), new_topic(1, prefix="rejects")
    summaries = run_two_tasks(kafka_config, source, out, rejects, ends)
    assert all(s.ended for s in summaries)
    assert sum(s.records for s in summaries) == 3000 and sum(s.rejects for s in summaries) == 3
    values = read_output(kafka_config, out)
    assert len(values) == 3000 and {"key", "event_ms", "amount", "items"} <= set(values[0])
    for marks in task_watermarks(kafka_config, out).values():
        assert marks == sorted(set(marks))


def test_ingest_tasks_report_their_metrics_to_the_jobs_endpoint(kafka_config: dict[str, Any],
                                                                new_topic: Callable[..., str]) -> None:
    """The endpoint a runtime job's driver serves (``serve_job_metrics``), scraped once the two tasks ended:
    each task's records, its lag on the source (0: at the end taken at start) and its last watermark."""
    source, ends = source_with_rejects(kafka_config, new_topic)
    out, rejects = new_topic(3, prefix="events"), new_topic(1, prefix="rejects")
    server = serve_job_metrics(0, "127.0.0.1")
    try:
        summaries = run_two_tasks(kafka_config, source, out, rejects, ends, metrics_url=server.url())
        with urllib.request.urlopen(server.url() + "/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    scraped = {(s.name, s.labels.get("task"), s.labels["topic"]): s.value
               for f in text_string_to_metric_families(text) for s in f.samples
               if s.labels.get("stage") == "stream_ingest"}
    for i, summary in enumerate(summaries):
        assert scraped[("controlmsg_records_total", str(i), source)] == summary.records > 0
        assert scraped[("controlmsg_lag_records", str(i), source)] == 0
        assert scraped[("controlmsg_output_watermark_seconds", str(i), out)] == summary.watermark / 1000


def test_stop_and_restart_loses_and_duplicates_nothing(kafka_config: dict[str, Any],
                                                      new_topic: Callable[..., str]) -> None:
    source, ends = source_with_rejects(kafka_config, new_topic)
    out, rejects = new_topic(3, prefix="events"), new_topic(1, prefix="rejects")
    first = run_two_tasks(kafka_config, source, out, rejects, ends, stop=lambda records: records >= 100)
    assert not all(s.ended for s in first)
    assert 0 < sum(s.records for s in first) < 3000
    second = run_two_tasks(kafka_config, source, out, rejects, ends)
    assert all(s.ended for s in second)
    values = read_output(kafka_config, out)
    ids = [v["id"] for v in values]
    assert len(ids) == 3000 and len(set(ids)) == 3000  # every record once across the restart
    for marks in task_watermarks(kafka_config, out).values():
        assert marks == sorted(set(marks))  # never back, even across the restart


def test_a_restart_after_the_end_writes_nothing_again(kafka_config: dict[str, Any],
                                                      new_topic: Callable[..., str]) -> None:
    source, ends = source_with_rejects(kafka_config, new_topic)
    out, rejects = new_topic(3, prefix="events"), new_topic(1, prefix="rejects")
    first = run_two_tasks(kafka_config, source, out, rejects, ends)
    again = run_two_tasks(kafka_config, source, out, rejects, ends)
    assert all(s.ended for s in again)
    assert [(s.records, s.rejects, s.watermark, s.commits) for s in again] == [
        (s.records, s.rejects, s.watermark, s.commits) for s in first]  # the committed counters, nothing new
    assert len(read_output(kafka_config, out)) == 3000
    eos = [m for m in dump_plain(kafka_config, out) if m.value()[0] == 2]
    assert len(eos) == 2 * 3  # each task's end of stream once on each of the 3 partitions


def test_a_restart_with_another_task_layout_is_refused(kafka_config: dict[str, Any],
                                                       new_topic: Callable[..., str]) -> None:
    source, ends = source_with_rejects(kafka_config, new_topic)
    out, rejects = new_topic(3, prefix="events"), new_topic(1, prefix="rejects")
    run_two_tasks(kafka_config, source, out, rejects, ends, stop=lambda records: records >= 100)
    with pytest.raises(CheckpointError, match=r"as task 0 of 2 over source partitions \[0, 1\].*same --tasks"):
        run_ingest_task(kafka_config, source_topic=source, source_partitions=[0, 1, 2, 3], output_topic=out,
                        rejects_topic=rejects, run_id="r", task_index=0, task_count=1, key_field="user",
                        event_time_field="event_time", until=ends)


def dump_plain(kafka_config: dict[str, Any], topic: str) -> list[Any]:
    consumer = Consumer({**kafka_config, "group.id": "plain", "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    count = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(count)])
    got: list[Any] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + 30
    while len(at_end) < count and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.2):
            if m.error() is None:
                got.append(m)
            else:
                partition = m.partition()
                assert partition is not None
                at_end.add(partition)
    consumer.close()
    return got


def test_kill_9_mid_transaction_then_restart(kafka_config: dict[str, Any], bootstrap_servers: str,
                                             new_topic: Callable[..., str]) -> None:
    """A task process killed with SIGKILL while it writes: its open transaction is aborted when the task
    starts again, which resumes from the last committed source offsets: every record exactly once."""
    import signal
    import subprocess
    import sys

    source = new_topic(2, prefix="source")
    ends = generate(kafka_config, source, GeneratorConfig(events=60_000, rate=1e7, keys=30,
                                                          start_ms=1_767_225_600_000, speedup=100.0, seed=4))
    out, rejects = new_topic(2, prefix="events"), new_topic(1, prefix="rejects")
    args = dict(source_topic=source, source_partitions=[0, 1], output_topic=out, rejects_topic=rejects, run_id="r",
                task_index=0, task_count=1, key_field="user", event_time_field="event_time",
                watermark_interval_s=0.2, until=ends, max_rate=15_000.0)  # paced: about 4 s in all
    script = ("import sys, orjson; from controlmsg.streaming.ingest import run_ingest_task; "
              "a = orjson.loads(sys.argv[1]); a['until'] = {int(k): v for k, v in a['until'].items()}; "
              "run_ingest_task({'bootstrap.servers': sys.argv[2]}, **a)")
    wire = {**args, "until": {str(k): v for k, v in ends.items()}}
    proc = subprocess.Popen([sys.executable, "-c", script, orjson.dumps(wire).decode(), bootstrap_servers])
    group = Consumer({**kafka_config, "group.id": ingest_group(out, "r")})

    def committed() -> int:  # source records the task has committed so far
        return sum(max(0, tp.offset) for tp in group.committed([TopicPartition(source, p) for p in (0, 1)], timeout=10))

    deadline = time.monotonic() + 60
    # Kill it once some transactions have committed: it is writing the next one all the time.
    while committed() < 10_000:
        assert time.monotonic() < deadline and proc.poll() is None, "the task wrote nothing, or finished too soon"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    resumed_at = committed()
    group.close()
    assert 0 < resumed_at < 60_000  # the restart resumes from there, it does not start over
    summary = run_ingest_task(kafka_config, **args)  # type: ignore[arg-type]
    assert summary.ended and summary.records == 60_000  # the counters are committed with the offsets too
    values = read_output(kafka_config, out)
    ids = [v["id"] for v in values]
    assert len(ids) == 60_000 and len(set(ids)) == 60_000


def test_an_idle_source_partition_does_not_hold_the_watermark(kafka_config: dict[str, Any],
                                                               new_topic: Callable[..., str]) -> None:
    """Task s1's only source partition goes quiet at event time 1000 while task s0's keeps moving on:
    after the idle timeout s1 says idle and the reconciled watermark follows s0 alone. When s1's partition
    gets a record again, s1 comes back before that record (its watermark without the idle flag precedes
    it in every partition), so downstream counts it again from that record on."""
    source, out, rejects = new_topic(2, prefix="source"), new_topic(2, prefix="events"), new_topic(1, prefix="rej")
    producer = Producer(kafka_config)
    lock = threading.Lock()

    def event(partition: int, event_ms: int, user: str) -> None:
        with lock:
            producer.produce(source, orjson.dumps({"user": user, "event_time": event_ms}), user.encode(),
                             partition=partition)
            producer.flush(10)

    stop, produced = threading.Event(), threading.Event()
    busy_sent, busy_read = [0], [0]

    def keep_busy() -> None:  # partition 0 never goes quiet: event time 1000, 1500, ... every 0.1 s
        while not produced.is_set():
            event(0, 1000 + 500 * busy_sent[0], "busy")
            busy_sent[0] += 1
            time.sleep(0.1)

    event(1, 1000, "quiet")
    summaries: list[Any] = [None, None]

    def task(i: int) -> None:
        summaries[i] = run_ingest_task(
            kafka_config, source_topic=source, source_partitions=[i], output_topic=out, rejects_topic=rejects,
            run_id="r", task_index=i, task_count=2, key_field="user", event_time_field="event_time",
            watermark_interval_s=0.2, idle_timeout_s=1.0, stop=lambda _: stop.is_set())

    threads = [threading.Thread(target=f, args=a, daemon=True)
               for f, a in ((keep_busy, ()), (task, (0,)), (task, (1,)))]
    for t in threads:
        t.start()
    try:
        with ControlReader(kafka_config, out, run_id="r") as reader:
            def poll() -> list[Any]:
                items = reader.poll(0.2)
                busy_read[0] += sum(1 for item in items if isinstance(item, DataRecord)
                                    and decode_json_payload(item.payload)["key"] == "busy")
                return items

            deadline = time.monotonic() + 30
            while (reader.tracker.emitted_watermark or 0) < 5000:  # without idleness it would stay at 1000
                assert time.monotonic() < deadline, (reader.tracker.emitted_watermark, reader.tracker.statuses())
                poll()
            for s in reader.tracker.statuses():
                assert s.idle_tasks == {"ingest-r-p1"}
                holder = s.holding_task
                assert holder is not None and holder[0] == "ingest-r-p0" and holder[1] >= 5000
            event(1, 1000 + 500 * busy_sent[0], "back")  # s1 is active again from here on
            seen_back = False
            while not seen_back:
                assert time.monotonic() < deadline, "the record of the re-activated partition never came"
                for item in poll():
                    if isinstance(item, DataRecord) and decode_json_payload(item.payload)["key"] == "back":
                        seen_back = True
                        assert reader.tracker.status(item.partition).idle_tasks == set()  # came back before it
                        assert item.upstream_task == "ingest-r-p1"
            # The tasks stop once task 0 has written every record of partition 0: its count is then exact.
            produced.set()
            threads[0].join(30)
            deadline = time.monotonic() + 30
            while busy_read[0] < busy_sent[0]:
                assert time.monotonic() < deadline, (busy_read[0], busy_sent[0])
                poll()
    finally:
        produced.set()
        stop.set()
        for t in threads:
            t.join(30)
    assert summaries[1] is not None and summaries[1].idle_periods >= 1 and summaries[1].records == 2
    assert summaries[0] is not None and summaries[0].idle_periods == 0 and summaries[0].records == busy_sent[0]
