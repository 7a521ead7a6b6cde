"""``controlmsg`` as kcat users' hands expect it, against a real broker, the CLI run as a subprocess:
``consume -o/-c/-p/-e``, data lines with the record's timestamp and headers, the refused combinations,
``inspect --watch``, ``metadata`` (kcat -L) and ``--version``."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from controlmsg.kafka.writer import ControlWriter
from tests.integration.test_consume_cli import data, eos, wm

pytestmark = pytest.mark.kafka

BASE_TS = 1_767_225_600_000


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "controlmsg", *args], capture_output=True, timeout=timeout,
                          check=False)


def consume(bootstrap: str, topic: str, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = cli("consume", "--bootstrap-servers", bootstrap, "--topic", topic, *args)
    return proc.returncode, [orjson.loads(x) for x in proc.stdout.splitlines() if x.strip()], proc.stderr.decode()


def offsets(lines: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(line["partition"], line["offset"]) for line in lines if line["kind"] == "data"]


def write_records(config: dict[str, Any], topic: str, partition: int, count: int, first: int = 0) -> None:
    """``count`` data records on ``partition``, record i with timestamp BASE_TS + 1000 * i and headers."""
    producer = Producer(config)
    for i in range(first, first + count):
        producer.produce(topic, data({"i": i}), f"k{i}".encode(), partition, timestamp=BASE_TS + 1000 * i,
                         headers=[("trace", f"t{i}".encode()), ("raw", b"\xff\x00"), ("empty", None)])
    assert producer.flush(30) == 0


def test_offsets_count_partition_and_exit_at_end(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                 new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    write_records(kafka_config, topic, 0, 10)
    write_records(kafka_config, topic, 1, 3)
    p0 = ("-p", "0", "-e", "--timeout", "30")

    code, lines, stderr = consume(bootstrap_servers, topic, "-e", "--timeout", "30")
    assert code == 0, stderr  # -e: every partition at its end, no end of stream needed
    assert sorted(offsets(lines)) == [(0, i) for i in range(10)] + [(1, i) for i in range(3)]
    first = next(line for line in lines if line["partition"] == 0 and line["offset"] == 4)
    assert first["timestamp"] == BASE_TS + 4000
    assert first["headers"] == [["trace", "t4"], ["raw", {"base64": base64.b64encode(b"\xff\x00").decode()}],
                                ["empty", None]]
    assert first["key"] == "k4" and first["value"] == {"i": 4}

    cases: list[tuple[tuple[str, ...], list[int]]] = [
        (("-o", "beginning"), list(range(10))),
        (("-o", "5"), [5, 6, 7, 8, 9]),
        (("-o", "-3"), [7, 8, 9]),
        (("-o", "-30"), list(range(10))),  # N before the end, at least the log start
        (("-o", "end"), []),
        (("-o", f"s@{BASE_TS + 6000}"), [6, 7, 8, 9]),
        (("-o", f"s@{BASE_TS + 5500}"), [6, 7, 8, 9]),  # the first record at or after the time
        (("-o", f"s@{BASE_TS + 99_000}"), []),  # none after: the end
    ]
    for args, expected in cases:
        code, lines, stderr = consume(bootstrap_servers, topic, *p0, *args)
        assert code == 0, (args, stderr)
        assert offsets(lines) == [(0, i) for i in expected], args

    code, lines, stderr = consume(bootstrap_servers, topic, "-p", "1", "-c", "2", "--timeout", "30")
    assert code == 0, stderr  # -c: exit after COUNT data records, without -e
    assert offsets(lines) == [(1, 0), (1, 1)]
    code, lines, stderr = consume(bootstrap_servers, topic, "-o", "-1", "-c", "5", "--timeout", "3")
    assert code == 3 and len(offsets(lines)) == 2, stderr  # one per partition, then the timeout: exit 3


def test_exit_at_end_after_transactions_and_with_until_eos(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                           new_topic: Callable[..., str]) -> None:
    """A transactional topic ends on commit markers, never delivered: -e still sees the partitions' end.
    With --until-eos as well, whichever comes first ends the command."""
    topic = new_topic(2)
    with ControlWriter({**kafka_config, "transactional.id": f"{topic}-t0"}, topic, task_name="t0", task_count=2,
                       run_id="r1") as writer:
        for n in range(6):
            writer.send({"n": n}, key=f"k{n}")
        writer.send_watermark(100)
        writer.commit()
    code, lines, stderr = consume(bootstrap_servers, topic, "-e", "--until-eos", "--timeout", "30")
    assert code == 0, stderr  # at the end, not at the timeout (which exits 3, as below)
    assert len(offsets(lines)) == 6 and {"kind": "end_of_stream"} not in lines  # task t1 never ended
    code, lines, stderr = consume(bootstrap_servers, topic, "--until-eos", "--timeout", "3")
    assert code == 3 and "waiting for end of stream" in stderr  # without -e: the contract as it was


def test_start_offset_then_resume_from_the_checkpoint(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                      new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(1)
    write_records(kafka_config, topic, 0, 5)
    ckpt = str(tmp_path / "ckpt.json")
    code, lines, stderr = consume(bootstrap_servers, topic, "-o", "-2", "-e", "--checkpoint", ckpt, "--timeout", "30")
    assert code == 0, stderr
    assert offsets(lines) == [(0, 3), (0, 4)]
    write_records(kafka_config, topic, 0, 1, first=5)
    code, lines, stderr = consume(bootstrap_servers, topic, "-e", "--checkpoint", ckpt, "--timeout", "30")
    assert code == 0, stderr
    assert offsets(lines) == [(0, 5)]  # the checkpoint holds absolute offsets, not "2 before the end"


@pytest.mark.parametrize(("args", "error"), [
    (("-o", "-1", "--checkpoint", "EXISTING"), "error: -o -1 and --checkpoint"),
    (("-c", "3", "--checkpoint", "NEW"), "error: -c and --checkpoint"),
    (("-c", "0"), "error: -c 0: give a count of at least 1"),
    (("-p", "7"), "error: -p 7: topic"),
    (("-o", "latest"), "error: -o 'latest': expected beginning, end"),
])
def test_refused_combinations_in_one_line(kafka_config: dict[str, Any], bootstrap_servers: str,
                                          new_topic: Callable[..., str], tmp_path: Path,
                                          args: tuple[str, ...], error: str) -> None:
    topic = new_topic(2)
    existing = tmp_path / "existing.json"
    code, _, _ = consume(bootstrap_servers, topic, "-e", "--checkpoint", str(existing), "--timeout", "30")
    assert code == 0 and existing.exists()
    given = [str(existing) if a == "EXISTING" else str(tmp_path / "new.json") if a == "NEW" else a for a in args]
    code, lines, stderr = consume(bootstrap_servers, topic, *given, "--timeout", "10")
    assert code == 1 and lines == []
    assert stderr.startswith(error) and stderr.count("\n") == 1, stderr  # one line, no traceback


def test_inspect_watch_redraws_until_interrupted(kafka_config: dict[str, Any], bootstrap_servers: str,
                                                 new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)
    # Started with SIGINT ignored, as a non-interactive shell starts a command in the background (and CI its
    # jobs): `kill -INT` must end the watch all the same.
    proc = subprocess.Popen([sys.executable, "-m", "controlmsg", "inspect", "--bootstrap-servers", bootstrap_servers,
                             "--topic", topic, "--watch", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        wrote = False
        while time.monotonic() < deadline:
            line = proc.stdout.readline().decode()
            assert line, "inspect --watch ended by itself"
            seen.append(line)
            if line.startswith("every 0.5 s:") and not wrote and sum(x.startswith("every") for x in seen) >= 2:
                producer = Producer(kafka_config)  # a control message between two redraws
                producer.produce(topic, wm("t0", 1, 4242, "r9"), partition=0)
                producer.produce(topic, eos("t0", 1, "r9"), partition=0)
                assert producer.flush(30) == 0
                wrote = True
            if wrote and "run 'r9'" in line:
                break
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    finally:
        proc.kill()
    assert code == 0, proc.stderr.read().decode() if proc.stderr else ""
    redraws = [i for i, x in enumerate(seen) if x.startswith("every 0.5 s:")]
    assert len(redraws) >= 2
    assert "no control messages" in "".join(seen[redraws[0]:redraws[1]])  # the first, before the write
    assert any("run 'r9'" in x for x in seen[redraws[1]:])  # a later redraw reads the topic again


def test_metadata_and_version(bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(3)
    shown = cli("metadata", "--bootstrap-servers", bootstrap_servers, "--topic", topic)
    assert shown.returncode == 0, shown.stderr.decode()
    text = shown.stdout.decode()
    assert f"topic {topic!r} with 3 partitions:" in text and " 1 topics:" in text
    assert "partition 2, leader " in text and "(controller)" in text
    as_json = cli("list", "--bootstrap-servers", bootstrap_servers, "--json")
    doc = orjson.loads(as_json.stdout)
    ids = {b["id"] for b in doc["brokers"]}
    [mine] = [t for t in doc["topics"] if t["topic"] == topic]
    assert [p["partition"] for p in mine["partitions"]] == [0, 1, 2]
    assert all(p["leader"] in ids and p["leader"] in p["isrs"] for p in mine["partitions"])
    missing = cli("metadata", "--bootstrap-servers", bootstrap_servers, "--topic", f"{topic}-none")
    assert missing.returncode == 1 and b"does not exist" in missing.stderr
    version = cli("--version")
    assert version.returncode == 0
    assert version.stdout.decode().startswith("controlmsg ") and "librdkafka 2." in version.stdout.decode()
