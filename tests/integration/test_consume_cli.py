"""The ``controlmsg consume`` contract, against a real broker, with envelopes written by an independent
client: a bare confluent-kafka Producer and hand-built bytes, not controlmsg's own writer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition


def wm(task: str, count: int, ts: int, run: str = "r1") -> bytes:
    """An independent client's watermark envelope: fields in another order, one unknown extra field."""
    return b"\x01" + orjson.dumps({"timestamp": ts, "runId": run, "taskCount": count, "taskName": task,
                                   "version": 1, "comment": "extra fields are ignored"})


def eos(task: str, count: int, run: str = "r1") -> bytes:
    return b"\x02" + orjson.dumps({"version": 1, "taskName": task, "taskCount": count, "runId": run})


def data(value: Any) -> bytes:
    return b"\x00" + orjson.dumps(value)


def write(config: dict[str, Any], topic: str, records: Sequence[tuple[int, bytes | None, bytes | None]]) -> None:
    """Write (partition, key, value) records in this order, one flush at the end."""
    producer = Producer(config)
    for partition, key, value in records:
        producer.produce(topic, value, key, partition)
    assert producer.flush(30) == 0


def consume(bootstrap: str, topic: str, *args: str, timeout: float = 60) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "controlmsg", "consume", "--bootstrap-servers", bootstrap, "--topic", topic, *args],
        capture_output=True, timeout=timeout, check=False,
    )
    lines = [orjson.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, lines, proc.stderr.decode()


def kinds(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["kind"] == kind]


def test_reference_scenario_step_by_step(kafka_config: dict[str, Any], bootstrap_servers: str,
                                         new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(2)
    ckpt = str(tmp_path / "ckpt.json")
    steps: list[tuple[list[tuple[int, bytes | None, bytes | None]], list[int]]] = [
        ([(0, None, wm("task0", 2, 6)), (0, None, wm("task1", 2, 3)),
          (1, None, wm("task0", 2, 10)), (1, None, wm("task1", 2, 4))], [3]),
        ([(0, None, wm("task1", 2, 8))], [4]),
        ([(1, None, wm("task1", 2, 7))], [6]),
        ([(1, None, wm("task1", 2, 5))], []),  # a regression: nothing
    ]
    for records, expected in steps:
        write(kafka_config, topic, records)
        code, lines, stderr = consume(bootstrap_servers, topic, "--timeout", "3", "--checkpoint", ckpt)
        assert code == 3, stderr
        assert [line["timestamp"] for line in kinds(lines, "watermark")] == expected
        assert "partition 0: waiting for end of stream from upstream tasks task0, task1 (reported, not ended)" in stderr
    write(kafka_config, topic, [(p, None, eos(t, 2)) for p in (0, 1) for t in ("task0", "task1")])
    code, lines, stderr = consume(bootstrap_servers, topic, "--timeout", "20", "--checkpoint", ckpt, "--until-eos")
    assert code == 0, stderr
    # If partition 0 ends first, the consumer watermark is partition 1's 7 for a moment; +infinity (all
    # ended) is never printed as a watermark, and nothing at or below the 6 printed before comes again.
    assert [line["timestamp"] for line in kinds(lines, "watermark")] in ([], [7])
    assert sorted(line["partition"] for line in kinds(lines, "partition_end")) == [0, 1]
    assert lines[-1] == {"kind": "end_of_stream"}


def test_data_lines_keys_and_non_json(kafka_config: dict[str, Any], bootstrap_servers: str,
                                      new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    write(kafka_config, topic, [
        (0, b"k1", data({"a": 1})),
        (0, None, data([1, 2])),
        (0, b"k3", b"\x00\xff\xfe not json"),
        (0, None, wm("only", 1, 100)),
        (0, None, eos("only", 1)),
    ])
    code, lines, stderr = consume(bootstrap_servers, topic, "--until-eos", "--timeout", "30")
    assert code == 0, stderr
    for line in lines[:3]:  # the record's timestamp (the producer's clock) and headers (none here)
        assert isinstance(line.pop("timestamp"), int) and line.pop("headers") == []
    assert lines[0] == {"kind": "data", "partition": 0, "offset": 0, "key": "k1", "value": {"a": 1}}
    assert lines[1] == {"kind": "data", "partition": 0, "offset": 1, "key": None, "value": [1, 2]}
    assert lines[2]["key"] == "k3" and "value" not in lines[2]
    assert lines[2]["value_base64"] == "//4gbm90IGpzb24="
    assert lines[3:] == [{"kind": "watermark", "timestamp": 100}, {"kind": "partition_end", "partition": 0},
                         {"kind": "end_of_stream"}]


def test_old_run_end_of_stream_does_not_end_new_run(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                    new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    old = [(p, None, eos(t, 2, run="old")) for p in (0, 1) for t in ("a", "b")]
    new = [(0, b"x", data({"n": 1})), (0, None, wm("a", 2, 50, run="new")), (1, None, wm("a", 2, 50, run="new")),
           (0, None, eos("b", 2, run="new")), (1, None, eos("b", 2, run="new"))]
    write(kafka_config, topic, [*old, *new])
    code, lines, stderr = consume(bootstrap_servers, topic, "--run-id", "new", "--until-eos", "--timeout", "4")
    assert code == 3, stderr
    assert kinds(lines, "end_of_stream") == [] and kinds(lines, "partition_end") == []
    assert [line["timestamp"] for line in kinds(lines, "watermark")] == [50]
    assert "waiting for end of stream from upstream tasks a (reported, not ended); 1 of 2 ended" in stderr
    write(kafka_config, topic, [(p, None, eos("a", 2, run="new")) for p in (0, 1)])
    code, lines, stderr = consume(bootstrap_servers, topic, "--run-id", "new", "--until-eos", "--timeout", "30")
    assert code == 0, stderr
    assert lines[-1] == {"kind": "end_of_stream"}


BAD_RECORDS: list[tuple[bytes | None, str]] = [
    (b"\x07{}", "unknown MessageType byte 7"),
    (b"\x03\x09r1{}", "names a run of 9 bytes but has only 4"),  # wire format 2, its run id cut short
    (b"", "empty value"),
    (b"\x01{not json", "not valid UTF-8 JSON"),
    (b"\x01" + orjson.dumps({"version": 2, "taskName": "a", "taskCount": 1, "timestamp": 1}), "version 2"),
    (b"\x01" + orjson.dumps({"version": 1, "taskName": "a", "taskCount": "1", "timestamp": 1}), "taskCount"),
    (b"\x02" + orjson.dumps({"version": 1, "taskName": "a", "taskCount": 3, "runId": "r1"}), "taskCount 3"),
    (b"\x02" + orjson.dumps({"version": 1, "taskName": "zz", "taskCount": 2, "runId": "r1"}), "taskCount is 2"),
]


def test_bad_records_fail_with_location(kafka_config: dict[str, Any], bootstrap_servers: str,
                                        new_topic: Callable[..., str]) -> None:
    for value, reason in BAD_RECORDS:
        topic = new_topic(1)
        write(kafka_config, topic, [(0, None, data(1)), (0, None, eos("a", 2)), (0, None, eos("b", 2)),
                                    (0, None, value)])
        code, lines, stderr = consume(bootstrap_servers, topic, "--timeout", "20")
        assert code == 2, (reason, stderr)
        assert f"topic '{topic}', partition 0, offset 3" in stderr, stderr
        assert reason in stderr
        assert lines[0]["kind"] == "data"


def test_dead_letter_topic_keeps_bad_records(kafka_config: dict[str, Any], bootstrap_servers: str,
                                             new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    dlq = new_topic(1, prefix="dlq")
    records: list[tuple[int, bytes | None, bytes | None]] = [(0, None, eos("a", 2)), (0, None, wm("b", 2, 1))]
    records += [(0, b"bad", value) for value, _ in BAD_RECORDS]
    records += [(0, b"good", data({"ok": True})), (0, None, eos("b", 2))]
    write(kafka_config, topic, records)
    code, lines, stderr = consume(bootstrap_servers, topic, "--until-eos", "--timeout", "30",
                                  "--dead-letter-topic", dlq)
    assert code == 0, stderr
    assert [line["kind"] for line in lines] == ["watermark", "data", "partition_end", "end_of_stream"]
    assert f"{len(BAD_RECORDS)} bad record(s) went to dead-letter topic" in stderr

    consumer = Consumer({**kafka_config, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(dlq, 0, 0)])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < len(BAD_RECORDS) and time.monotonic() < deadline:
        got += [m for m in consumer.consume(100, 1.0) if m.error() is None]
    consumer.close()
    assert [m.value() for m in got] == [value for value, _ in BAD_RECORDS]
    for m, (_, reason) in zip(got, BAD_RECORDS, strict=True):
        headers = dict(m.headers() or [])
        assert reason in headers["controlmsg-dlq-reason"].decode()
        assert headers["controlmsg-dlq-topic"].decode() == topic
        assert headers["controlmsg-dlq-partition"] == b"0"
        assert m.key() == b"bad"
    assert sorted(int(dict(m.headers())["controlmsg-dlq-offset"]) for m in got) == list(range(2, 2 + len(BAD_RECORDS)))


def test_a_missing_dead_letter_topic_fails_before_reading(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                           new_topic: Callable[..., str], tmp_path: Path) -> None:
    """The broker does not create topics on its own here: bad records would have nowhere to go, so the
    command refuses to start, and reading later with a real dead-letter topic loses nothing."""
    topic = new_topic(1)
    write(kafka_config, topic, [(0, b"bad", b"\x07junk"), (0, None, data({"ok": 1})), (0, None, eos("a", 1))])
    checkpoint = tmp_path / "ckpt.json"
    code, lines, stderr = consume(bootstrap_servers, topic, "--until-eos", "--timeout", "30",
                                  "--dead-letter-topic", f"{topic}-no-such-dlq", "--checkpoint", str(checkpoint))
    assert code == 1 and lines == []
    assert f"dead-letter topic '{topic}-no-such-dlq' does not exist" in stderr
    assert "went to dead-letter topic" not in stderr
    dlq = new_topic(1, prefix="dlq")
    code, lines, stderr = consume(bootstrap_servers, topic, "--until-eos", "--timeout", "30",
                                  "--dead-letter-topic", dlq, "--checkpoint", str(checkpoint))
    assert code == 0, stderr
    assert "1 bad record(s) went to dead-letter topic" in stderr
    assert [line["kind"] for line in lines] == ["data", "partition_end", "end_of_stream"]


def test_kill_and_restart_prints_nothing_twice(kafka_config: dict[str, Any], bootstrap_servers: str,
                                               new_topic: Callable[..., str], tmp_path: Path) -> None:
    """SIGTERM in the middle (an interrupt: the checkpoint is saved), then a resumed run: together they
    print every data line exactly once and watermarks that only go up."""
    topic = new_topic(3)
    ckpt = str(tmp_path / "ckpt.json")
    tasks = ["t0", "t1"]
    first: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(3000):
        first.append((i % 3, str(i).encode(), data({"i": i})))
        if i % 500 == 499:
            first += [(p, None, wm(t, 2, i)) for t in tasks for p in range(3)]
    write(kafka_config, topic, first)
    out_path = tmp_path / "out1.jsonl"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controlmsg", "consume", "--bootstrap-servers", bootstrap_servers,
             "--topic", topic, "--checkpoint", ckpt, "--until-eos"],
            stdout=out, stderr=subprocess.PIPE,
        )
    # Let it read everything written so far, then interrupt it while it waits for the end of stream.
    deadline = time.monotonic() + 60
    while not os.path.exists(ckpt) or orjson.loads(Path(ckpt).read_bytes())["offsets"]["0"] < 1000:
        assert time.monotonic() < deadline, "consumer made no progress"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err1 = proc.communicate(timeout=30)
    assert proc.returncode == 130, err1.decode()
    out1 = out_path.read_bytes()

    second: list[tuple[int, bytes | None, bytes]] = [(i % 3, str(i).encode(), data({"i": i}))
                                                     for i in range(3000, 4000)]
    second += [(p, None, wm(t, 2, 5000)) for t in tasks for p in range(3)]
    second += [(p, None, eos(t, 2)) for t in tasks for p in range(3)]
    write(kafka_config, topic, second)
    code, lines2, stderr = consume(bootstrap_servers, topic, "--checkpoint", ckpt, "--until-eos", "--timeout", "60")
    assert code == 0, stderr
    lines1 = [orjson.loads(line) for line in out1.splitlines()]
    values = [line["value"]["i"] for line in kinds(lines1 + lines2, "data")]
    assert sorted(values) == list(range(4000))  # nothing lost, nothing twice
    marks = [line["timestamp"] for line in kinds(lines1 + lines2, "watermark")]
    assert marks == sorted(set(marks)) and marks[-1] == 5000
    assert lines2[-1] == {"kind": "end_of_stream"}
