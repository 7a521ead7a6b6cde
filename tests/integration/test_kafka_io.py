"""The writer and the reader against a real broker: several tasks over several partitions, end-of-stream
termination, crash and restart from a checkpoint, transactions, delivery errors, and inspection."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.errors import DeliveryError, TopicError
from controlmsg.kafka import ControlReader, ControlWriter, DataRecord, FileCheckpointStore
from controlmsg.kafka.admin import end_offsets
from controlmsg.kafka.inspect import inspect_topic


def run_upstream(config: dict[str, Any], topic: str, tasks: int, per_task: int, run_id: str = "run",
                 end: bool = True) -> None:
    """``tasks`` writers in parallel threads; each writes keyed records with rising event times, a
    watermark every 100 records, and (if ``end``) its end of stream."""

    def task(i: int) -> None:
        with ControlWriter(config, topic, task_name=f"task-{i}", task_count=tasks, run_id=run_id) as w:
            for n in range(per_task):
                w.send({"task": i, "n": n, "ts": n * 10}, key=f"k{n % 17}")
                if n % 100 == 99:
                    w.send_watermark(n * 10)
            if end:
                w.send_end_of_stream()

    threads = [threading.Thread(target=task, args=(i,)) for i in range(tasks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_several_tasks_over_several_partitions_end_by_themselves(
    kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    topic = new_topic(4)
    run_upstream(kafka_config, topic, tasks=3, per_task=1000)
    with ControlReader(kafka_config, topic) as reader:
        items = list(reader.read_until_end(timeout=60))
    assert reader.tracker.is_ended
    records = [i for i in items if isinstance(i, DataRecord)]
    seen = sorted((v["task"], v["n"]) for v in (decode_json_payload(r.payload) for r in records))
    assert seen == [(t, n) for t in range(3) for n in range(1000)]
    marks = [i.timestamp for i in items if isinstance(i, WatermarkAdvanced)]
    assert marks == sorted(set(marks)) and marks and marks[-1] <= 9990
    ends = [i.partition for i in items if isinstance(i, PartitionEnded)]
    assert sorted(ends) == [0, 1, 2, 3]
    assert isinstance(items[-1], StreamEnded)
    # Keyed records keep their key -> partition mapping: every key lives in one partition.
    homes: dict[bytes | None, set[int]] = {}
    for r in records:
        homes.setdefault(r.key, set()).add(r.partition)
    assert all(len(ps) == 1 for ps in homes.values())


def test_watermark_waits_for_every_task(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    a = ControlWriter(kafka_config, topic, task_name="a", task_count=2)
    b = ControlWriter(kafka_config, topic, task_name="b", task_count=2)
    a.send_watermark(100)
    a.flush()
    with ControlReader(kafka_config, topic) as reader:
        early = reader.poll(3.0) + reader.poll(1.0)
        assert early == []  # b has not reported: the watermark is undefined
        b.send_watermark(40)
        b.flush()
        later: list[Any] = []
        deadline = time.monotonic() + 20
        while not later and time.monotonic() < deadline:
            later = reader.poll(0.5)
        assert later == [WatermarkAdvanced(40)]
    a.close()
    b.close()


def test_crash_and_resume_from_checkpoint(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                          tmp_path: Path) -> None:
    """A reader that dies without saving resumes from its last checkpoint: together the two readers see
    every record, the second starts exactly at the checkpoint, and no event is repeated."""
    topic = new_topic(3)
    run_upstream(kafka_config, topic, tasks=2, per_task=1500)
    store = FileCheckpointStore(tmp_path / "ckpt.json")
    first: list[Any] = []
    reader = ControlReader(kafka_config, topic, checkpoint=store, batch_size=500)
    while len(first) < 1200:
        first += reader.poll(2.0)
    reader.save_checkpoint()
    saved = store.load()
    assert saved is not None
    lost = reader.poll(2.0)  # read after the checkpoint, then the process "dies": no save, no close
    assert lost
    with ControlReader(kafka_config, topic, checkpoint=store, batch_size=500) as resumed:
        assert resumed.positions == saved.offsets
        second = list(resumed.read_until_end(timeout=60))
        resumed.save_checkpoint()
    assert resumed.tracker.is_ended
    records = [i for i in first + second if isinstance(i, DataRecord)]
    assert sorted((r.partition, r.offset) for r in records) == sorted({(r.partition, r.offset) for r in records})
    assert len(records) == 3000
    marks = [i.timestamp for i in first + second if isinstance(i, WatermarkAdvanced)]
    assert marks == sorted(set(marks))
    assert sum(isinstance(i, StreamEnded) for i in first + second) == 1
    # A third start from the final checkpoint knows the stream already ended and emits nothing.
    with ControlReader(kafka_config, topic, checkpoint=store) as again:
        assert again.tracker.is_ended and again.poll(1.0) == []


def test_kill_9_consumer_resumes_at_checkpoint(kafka_config: dict[str, Any], bootstrap_servers: str,
                                               new_topic: Callable[..., str], tmp_path: Path) -> None:
    """``kill -9`` of ``controlmsg consume`` mid-stream: the restarted consumer starts at the saved
    offsets (so at most the batch after the last save is printed again) and reaches end of stream."""
    topic = new_topic(2)
    ckpt = tmp_path / "ckpt.json"
    run_upstream(kafka_config, topic, tasks=2, per_task=20000, end=False)
    cmd = [sys.executable, "-m", "controlmsg", "consume", "--bootstrap-servers", bootstrap_servers,
           "--topic", topic, "--checkpoint", str(ckpt), "--until-eos"]
    with (tmp_path / "out1").open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not ckpt.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.kill()
        proc.wait(10)
    saved = FileCheckpointStore(ckpt).load()
    assert saved is not None
    run_upstream(kafka_config, topic, tasks=2, per_task=0)  # just the ends of stream
    done = subprocess.run([*cmd, "--timeout", "60"], capture_output=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr.decode()
    lines = [orjson.loads(x) for x in done.stdout.splitlines()]
    data = [x for x in lines if x["kind"] == "data"]
    for p in (0, 1):
        offsets = [x["offset"] for x in data if x["partition"] == p]
        start = max(saved.offsets[p], 0)
        assert offsets == sorted(offsets) and (not offsets or offsets[0] >= start)
    printed_before = [orjson.loads(x) for x in (tmp_path / "out1").read_bytes().splitlines() if x.endswith(b"}")]
    keys = {(x["partition"], x["offset"]) for x in printed_before + data if x["kind"] == "data"}
    assert len(keys) == 40000  # nothing lost across the kill
    assert lines[-1] == {"kind": "end_of_stream"}


def test_transactions_hide_aborted_records(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    conf = {**kafka_config, "transactional.id": f"{topic}-task-0"}
    w = ControlWriter(conf, topic, task_name="t", task_count=1)
    w.send({"n": 1}, key="a")
    w.abort()  # a failed attempt: nothing of it becomes visible to read_committed readers
    w.send({"n": 2}, key="a")
    w.send_end_of_stream()
    w.close()
    with ControlReader(kafka_config, topic) as reader:
        items = list(reader.read_until_end(timeout=30))
    values = [decode_json_payload(i.payload) for i in items if isinstance(i, DataRecord)]
    assert values == [{"n": 2}]
    assert isinstance(items[-1], StreamEnded)


def test_a_writer_destroyed_after_close_off_the_thread_keeps_what_it_committed(
        kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    """What a Spark write task does at its end: close (commit), then hand the producer's destruction to the
    background thread (controlmsg.kafka.background); the records stay committed, the writer is done."""
    from controlmsg.kafka.background import run_later

    topic = new_topic(2)
    w = ControlWriter({**kafka_config, "transactional.id": f"{topic}-task-0"}, topic, task_name="t", task_count=1)
    w.send({"n": 1}, key="a")
    w.send_end_of_stream()
    w.close()
    destroyed = threading.Event()
    run_later(w.destroy)
    run_later(destroyed.set)
    assert destroyed.wait(60)
    with pytest.raises(AttributeError):
        w.send({"n": 2})  # no producer any more
    with ControlReader(kafka_config, topic) as reader:
        items = list(reader.read_until_end(timeout=30))
    assert [decode_json_payload(i.payload) for i in items if isinstance(i, DataRecord)] == [{"n": 1}]


def test_send_encoded_and_poll_columns_are_send_and_poll_per_record(
        kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    """The batch paths give the same records, keys, headers, positions and run filter as the per-record ones."""
    from controlmsg.core.codec import encode_json_rows
    from controlmsg.kafka import DataColumns
    from controlmsg.kafka.writer import HEADER_RUN, HEADER_TASK

    topic = new_topic(3)
    rows = [{"n": n} for n in range(500)]
    keys = [f"k{n % 7}" for n in range(500)]
    with ControlWriter(kafka_config, topic, task_name="t0", task_count=2, run_id="r1", data_headers=True) as w:
        w.send_encoded(encode_json_rows(rows[:250]), keys[:250])
        w.send_encoded(encode_json_rows(rows[250:]))  # no keys
        with pytest.raises(ValueError, match="keys"):
            w.send_encoded(encode_json_rows(rows[:2]), keys[:1])
        w.send_end_of_stream()
    with ControlWriter(kafka_config, topic, task_name="t1", task_count=2, run_id="r0", data_headers=True) as old:
        old.send_encoded(encode_json_rows([{"other": 1}]), ["k0"])  # another run: skipped by both readers
    with ControlWriter(kafka_config, topic, task_name="t1", task_count=2, run_id="r1") as w:
        w.send_encoded(encode_json_rows([{"n": 500}]), ["k0"])  # no headers: passes
        w.send_end_of_stream()

    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        items = list(reader.read_until_end(timeout=60))
        expected_positions = reader.positions
        expected_skipped = reader.skipped_other_run
    expected = [i for i in items if isinstance(i, DataRecord)]
    columns = DataColumns()
    events = []
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        deadline = time.monotonic() + 60
        while not reader.tracker.is_ended and time.monotonic() < deadline:
            events.extend(reader.poll_columns(columns, 0.5))
        assert reader.positions == expected_positions
        assert reader.skipped_other_run == expected_skipped == 1
    assert isinstance(events[-1], StreamEnded)
    assert [e for e in items if not isinstance(e, DataRecord)] == events
    got = [columns.record(i) for i in range(len(columns))]
    assert sorted((r.partition, r.offset, r.key, r.payload) for r in got) == sorted(
        (r.partition, r.offset, r.key, r.payload) for r in expected)
    assert len(got) == 501
    assert sorted(orjson.loads(p)["n"] for p in columns.payloads) == list(range(501))
    keyed = [r for r in got if orjson.loads(r.payload)["n"] < 250]
    assert all(r.key == f"k{orjson.loads(r.payload)['n'] % 7}".encode() for r in keyed)
    assert all(r.key is None for r in got if 250 <= orjson.loads(r.payload)["n"] < 500)
    headers = got[0].message.headers()
    assert headers[0] == (HEADER_RUN, b"r1") and (HEADER_TASK, b"t0") in headers
    picked = columns.select([2, 0])
    assert (picked.offsets, picked.payloads) == ([columns.offsets[2], columns.offsets[0]],
                                                  [columns.payloads[2], columns.payloads[0]])


def test_runs_named_in_the_envelope_share_a_topic(kafka_config: dict[str, Any],
                                                  new_topic: Callable[..., str]) -> None:
    """Wire format 2: a writer with ``run_in_envelope`` names its run in each record's value and sends no
    headers; a reader of one run takes its records on both read paths, and those of format 1 (the run
    header, or nothing), and skips and counts another run's (one whose id begins like its own too)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from controlmsg.core.codec import encode_json_rows
    from controlmsg.kafka import DataColumns

    topic = new_topic(2)
    with ControlWriter(kafka_config, topic, task_name="a", task_count=2, run_id="r1", run_in_envelope=True) as w:
        assert w.user_prefix == b"\x03\x02r1"
        w.send({"n": 0}, "k0")
        w.send_bytes(b'{"n":1}', "k1")
        w.send_encoded(encode_json_rows([{"n": 2}, {"n": 3}], prefix=w.user_prefix), ["k2", "k3"])
        w.send_end_of_stream()
    for run in ("r11", "r"):  # other runs, tagged likewise
        with ControlWriter(kafka_config, topic, task_name="a", task_count=2, run_id=run, run_in_envelope=True) as w:
            w.send({"other": run}, "k0")
    with ControlWriter(kafka_config, topic, task_name="b", task_count=2, run_id="r1", data_headers=True) as w:
        w.send({"n": 4}, "k4")  # wire format 1, the run header
        w.send_end_of_stream()
    with pytest.raises(ValueError, match="one way"):
        ControlWriter(kafka_config, topic, task_name="c", task_count=1, run_id="r1", data_headers=True,
                      run_in_envelope=True)

    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        records = [i for i in reader.read_until_end(timeout=60) if isinstance(i, DataRecord)]
        assert reader.skipped_other_run == 2
    assert sorted(orjson.loads(r.payload)["n"] for r in records) == [0, 1, 2, 3, 4]
    columns = DataColumns()
    with ControlReader(kafka_config, topic, run_id="r1") as reader:
        deadline = time.monotonic() + 60
        while not reader.tracker.is_ended and time.monotonic() < deadline:
            reader.poll_columns(columns, 0.5)
        assert reader.skipped_other_run == 2
    assert sorted(columns.payloads) == sorted(r.payload for r in records)
    with ControlReader(kafka_config, topic) as reader:  # no run given: every run's records, their tags cut off
        everything = sorted(i.payload for i in reader.read_until_end(timeout=60) if isinstance(i, DataRecord))
    assert everything == sorted([r.payload for r in records] + [b'{"other":"r11"}', b'{"other":"r"}'])

    consumer = Consumer({**kafka_config, "group.id": f"raw-{topic}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
    raw: list[Any] = []
    deadline = time.monotonic() + 30
    while len(raw) < 11 and time.monotonic() < deadline:  # 7 data records and 4 ends of stream
        raw += [m for m in consumer.consume(100, 1.0) if m.error() is None]
    consumer.close()
    tagged = {m.value() for m in raw if m.value()[0] == 3}
    assert tagged == {b'\x03\x02r1{"n":0}', b'\x03\x02r1{"n":1}', b'\x03\x02r1{"n":2}', b'\x03\x02r1{"n":3}',
                      b'\x03\x03r11{"other":"r11"}', b'\x03\x01r{"other":"r"}'}
    assert all(m.headers() is None for m in raw if m.value()[0] == 3)  # no header on a tagged record


def test_every_send_path_writes_its_key_partition_headers_and_a_current_timestamp(
        kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    """The writer calls confluent-kafka's produce() positionally (topic, value, key, partition, callback,
    on_delivery, timestamp, headers): each path's record arrives with what it was given, timestamped now."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from controlmsg.core.codec import encode_json_rows
    from controlmsg.kafka.writer import HEADER_RUN, HEADER_TASK

    topic = new_topic(3)
    sent_at_ms = int(time.time() * 1000)
    with ControlWriter(kafka_config, topic, task_name="t0", task_count=1, run_id="r1", data_headers=True) as w:
        w.send({"path": "send"}, "ka")
        w.send({"path": "send-partition"}, "kb", partition=2)
        w.send_bytes(b'{"path": "send_bytes"}', None, partition=1)
        w.send_encoded(encode_json_rows([{"path": "encoded-keyed"}]), ["kc"])
        w.send_encoded(encode_json_rows([{"path": "encoded"}]))
    with ControlWriter(kafka_config, topic, task_name="t1", task_count=1, run_id="r1") as plain:
        plain.send({"path": "no-headers"}, "kd", partition=0)
        plain.send_encoded(encode_json_rows([{"path": "no-headers-encoded"}]), ["ke"])
        plain.send_encoded(encode_json_rows([{"path": "no-headers-ka"}, {"path": "no-headers-kc"}]), ["ka", "kc"])

    consumer = Consumer({**kafka_config, "group.id": f"check-{topic}", "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    got: dict[str, tuple[int, bytes | None, Any, int]] = {}
    ended: set[int] = set()
    deadline = time.monotonic() + 30
    while len(ended) < 3 and time.monotonic() < deadline:
        for msg in consumer.consume(100, 0.2):
            partition, value = msg.partition(), msg.value()
            assert partition is not None
            if msg.error() is not None:
                ended.add(partition)
            elif value is not None and value[0] == 0:
                got[orjson.loads(value[1:])["path"]] = (partition, msg.key(), msg.headers(), msg.timestamp()[1])
    consumer.close()
    mine = [(HEADER_RUN, b"r1"), (HEADER_TASK, b"t0")]
    assert {path: (key, headers) for path, (_, key, headers, _) in got.items()} == {
        "send": (b"ka", mine), "send-partition": (b"kb", mine), "send_bytes": (None, mine),
        "encoded-keyed": (b"kc", mine), "encoded": (None, mine),
        "no-headers": (b"kd", None), "no-headers-encoded": (b"ke", None),
        "no-headers-ka": (b"ka", None), "no-headers-kc": (b"kc", None)}
    assert (got["send-partition"][0], got["send_bytes"][0], got["no-headers"][0]) == (2, 1, 0)
    # A keyed record with headers goes where the partitioner sends its key without them.
    assert got["send"][0] == got["no-headers-ka"][0] and got["encoded-keyed"][0] == got["no-headers-kc"][0]
    assert all(sent_at_ms - 1000 <= ts <= sent_at_ms + 60_000 for _, _, _, ts in got.values()), got


def test_delivery_error_is_raised(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    w = ControlWriter({**kafka_config, "message.timeout.ms": 1000}, topic, task_name="t", task_count=1,
                      partitions=3)  # claims partitions the topic does not have
    w.send_end_of_stream()
    with pytest.raises(DeliveryError, match="not delivered"):
        w.flush(10)


def test_inspect_reports_holders_and_runs(kafka_config: dict[str, Any], bootstrap_servers: str,
                                          new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    for name, ts in (("fast", 500), ("slow", 120)):
        with ControlWriter(kafka_config, topic, task_name=name, task_count=3, run_id="r2") as w:
            w.send_watermark(ts)
    with ControlWriter(kafka_config, topic, task_name="done", task_count=3, run_id="r2") as w:
        w.send_end_of_stream()
    with ControlWriter(kafka_config, topic, task_name="old", task_count=1, run_id="r1") as w:
        w.send_end_of_stream()
    report = inspect_topic(kafka_config, topic)
    assert set(report.runs) == {"r1", "r2"}
    status = report.runs["r2"].tracker.status(0)
    assert status.watermark == 120 and status.holding_task == ("slow", 120)
    assert status.open_tasks == ["fast", "slow"] and not status.is_ended
    assert report.runs["r1"].tracker.status(1).is_ended
    out = subprocess.run([sys.executable, "-m", "controlmsg", "inspect", "--bootstrap-servers", bootstrap_servers,
                          "--topic", topic, "--run-id", "r2"], capture_output=True, check=True, timeout=60)
    text = out.stdout.decode()
    assert "partition 1: watermark 120; reported 3/3" in text
    assert "held back by slow at 120 (380 ms behind the next task)" in text
    assert "'r1'" not in text
    with ControlWriter(kafka_config, topic, task_name="slow", task_count=3, run_id="r2") as w:
        w.send_watermark(120, idle=True)  # slow has no input now: fast alone holds the watermark
    out = subprocess.run([sys.executable, "-m", "controlmsg", "inspect", "--bootstrap-servers", bootstrap_servers,
                          "--topic", topic, "--run-id", "r2", "--json"], capture_output=True, check=True, timeout=60)
    part = orjson.loads(out.stdout)["runs"]["r2"][0]
    assert (part["watermark"], part["idleTasks"], part["holdingTask"]) == (
        500, ["slow"], {"task": "fast", "watermark": 500})


def test_inspect_reads_a_transactional_topic_to_its_end(kafka_config: dict[str, Any],
                                                       new_topic: Callable[..., str]) -> None:
    """A transactional topic ends in commit markers, which no consumer is given: inspection still ends at
    once (it used to wait for an offset that never came, and failed after its timeout), and a transaction
    still open is not waited for (read_committed: the end is the last stable offset)."""
    topic = new_topic(2)
    with ControlWriter({**kafka_config, "transactional.id": f"inspect-{topic}-done"}, topic, task_name="done-r-p0",
                       task_count=2, run_id="r") as w:
        w.send({"a": 1}, partition=0)
        w.send_end_of_stream()
    still = ControlWriter({**kafka_config, "transactional.id": f"inspect-{topic}-open"}, topic,
                          task_name="open-r-p0", task_count=2, run_id="r")
    try:
        still.send({"a": 2}, partition=1)
        still.flush()
        # At its timeout (20 s) inspect_topic raises ReadError: a report at all is an end reached, not waited for.
        report = inspect_topic(kafka_config, topic, timeout=20)
    finally:
        still.abort()
        still.close()
    assert report.user_messages == {0: 1, 1: 0}
    assert [s.ended_tasks for s in report.runs["r"].partitions] == [{"done-r-p0"}, {"done-r-p0"}]


def test_inspect_shows_a_rescaled_run_per_generation(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                     new_topic: Callable[..., str]) -> None:
    """Generation 0 had two tasks; generation 1, of three, has written to partition 0 only (its tasks'
    first transactions reach partitions one at a time): partition 0 follows the new task set, partition 1
    still the old one, and each says so."""
    topic = new_topic(2)
    for name in ("a", "b"):
        with ControlWriter(kafka_config, topic, task_name=name, task_count=2, run_id="r") as w:
            w.send_watermark(100)
    with ControlWriter(kafka_config, topic, task_name="a", task_count=3, run_id="r", generation=1,
                       partitions=1) as w:  # only partition 0 (the writer sends to partitions 0 .. n-1)
        w.send_watermark(200)
    out = subprocess.run([sys.executable, "-m", "controlmsg", "inspect", "--bootstrap-servers", bootstrap_servers,
                          "--topic", topic, "--run-id", "r"], capture_output=True, check=True, timeout=60)
    text = out.stdout.decode()
    assert "run 'r': taskCount 3 (generation 1)" in text, text
    assert "partition 0: watermark undefined; reported 1/3" in text, text
    assert "partition 1 (generation 0): watermark 100; reported 2/2" in text, text
    out = subprocess.run([sys.executable, "-m", "controlmsg", "inspect", "--bootstrap-servers", bootstrap_servers,
                          "--topic", topic, "--run-id", "r", "--json"], capture_output=True, check=True, timeout=60)
    parts = orjson.loads(out.stdout)["runs"]["r"]
    assert [(p["generation"], p["taskCount"]) for p in parts] == [(1, 3), (0, 2)]


def test_end_offsets_of_a_new_topic_and_of_a_missing_one(kafka_config: dict[str, Any],
                                                         new_topic: Callable[..., str]) -> None:
    """A topic just made has its ends at once; a topic that never appears is named in the error once the
    wait for it (asked again until ``timeout``, for nodes that learn of a new topic late) is over."""
    topic = new_topic(3)
    assert end_offsets(kafka_config, topic) == {0: 0, 1: 0, 2: 0}
    missing = f"{topic}-never"
    started = time.monotonic()
    with pytest.raises(TopicError, match=f"topic '{missing}' does not exist"):
        end_offsets(kafka_config, missing, timeout=1.0)
    assert time.monotonic() - started >= 1.0  # it waited for the topic, not just asked once
