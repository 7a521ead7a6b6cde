"""The streaming window task against a real broker: results as soon as the watermark closes a window, late
records to the side topic, and restarts (a crash and a stop) that leave the output exactly once."""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from controlmsg.core.codec import decode_json_payload
from controlmsg.core.events import WatermarkAdvanced
from controlmsg.kafka import ControlReader, ControlWriter, DataRecord, create_topic
from controlmsg.streaming import window
from controlmsg.streaming.state_topic import state_topic_config
from controlmsg.streaming.window import (
    HEADER_LATE_OFFSET,
    HEADER_LATE_PARTITION,
    HEADER_LATE_REASON,
    HEADER_LATE_TASK,
    LATE_REASON,
    TaskSummary,
    run_window_task,
)
from controlmsg.streaming.windows import TumblingWindows
from tests.transactions import held_back

WINDOW = 1000
RUN = "run-1"


class Crash(Exception):
    """Raised by a test's stop() to kill a task mid-run."""


class Topics:
    def __init__(self, config: dict[str, Any], new_topic: Callable[..., str]) -> None:
        self.config = config
        self.input = new_topic(2, "wt-in")
        self.output = new_topic(2, "wt-out")
        self.late = new_topic(1, "wt-late")
        self.state = f"wt-state-{uuid.uuid4().hex[:8]}"
        create_topic(config, self.state, 1, topic_config=state_topic_config({}))


class TaskThread:
    """run_window_task over both input partitions, in a thread; ``result`` or ``error`` when it ends."""

    def __init__(self, t: Topics, stop: Callable[[], bool] | None = None, timeout_s: float = 40.0) -> None:
        self.result: TaskSummary | None = None
        self.error: BaseException | None = None

        def body() -> None:
            try:
                self.result = run_window_task(
                    t.config, input_topic=t.input, partitions=[0, 1], run_id=RUN, output_topic=t.output,
                    late_topic=t.late, state_topic=t.state, task_index=0, task_count=1, window_ms=WINDOW,
                    sums=["amount"], commit_interval_s=0.2, stop=stop, timeout_s=timeout_s,
                )
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 45.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the window task did not end"


@contextmanager
def upstream(t: Topics) -> Iterator[tuple[ControlWriter, ControlWriter]]:
    a = ControlWriter(t.config, t.input, task_name="a", task_count=2, run_id=RUN, data_headers=True)
    b = ControlWriter(t.config, t.input, task_name="b", task_count=2, run_id=RUN, data_headers=True)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def write(w: ControlWriter, sent: list[dict[str, Any]], key: str, event_ms: int, amount: int | float) -> None:
    value = {"key": key, "event_ms": event_ms, "amount": amount}
    w.send(value, key=key)
    sent.append(value)


def oracle(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["event_ms"] - r["event_ms"] % WINDOW, r["key"])].append(r)
    return sorted(
        ({"key": k, "window_start": s, "window_end": s + WINDOW, "count": len(rs),
          "sum_amount": sum(r["amount"] for r in rs)} for (s, k), rs in groups.items()),
        key=lambda v: (v["window_start"], v["key"]),
    )


def read_output(t: Topics, timeout: float = 30.0) -> tuple[list[dict[str, Any]], list[int], ControlReader]:
    """The whole output (read_committed) to end of stream: results, the watermarks seen, the reader."""
    with ControlReader(t.config, t.output, run_id=RUN) as reader:
        items = list(reader.read_until_end(timeout=timeout))
    assert reader.tracker.is_ended, "the output has no end of stream"
    results = [decode_json_payload(i.payload) for i in items if isinstance(i, DataRecord)]
    marks = [i.timestamp for i in items if isinstance(i, WatermarkAdvanced)]
    return sorted(results, key=lambda v: (v["window_start"], v["key"])), marks, reader


def wait_for_first_result(t: Topics, timeout: float = 20.0) -> dict[str, Any]:
    with ControlReader(t.config, t.output, run_id=RUN) as reader:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for item in reader.poll(0.2):
                if isinstance(item, DataRecord):
                    value: dict[str, Any] = decode_json_payload(item.payload)
                    return value
    raise AssertionError("no window result became readable")


def read_plain(config: dict[str, Any], topic: str, timeout: float = 15.0) -> list[Any]:
    """Every committed record of a 1-partition topic, to its end."""
    consumer = Consumer({**config, "group.id": f"t-{uuid.uuid4().hex}", "isolation.level": "read_committed",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                return out
            out.append(msg)
    finally:
        consumer.close()
    raise AssertionError(f"end of {topic!r} not reached")


def first_phase(a: ControlWriter, b: ControlWriter, sent: list[dict[str, Any]]) -> None:
    """Records in windows [0, 1000) and [1000, 2000), then a watermark from both tasks that closes them."""
    for n in range(40):
        write(a if n % 2 else b, sent, f"k{n % 3}", n * 50, n)
    a.send_watermark(2000)
    b.send_watermark(2000)
    a.flush()
    b.flush()


def test_results_follow_the_watermark_before_end_of_stream(
    kafka_config: dict[str, Any], new_topic: Callable[..., str]
) -> None:
    t = Topics(kafka_config, new_topic)
    sent: list[dict[str, Any]] = []
    task = TaskThread(t)
    with upstream(t) as (a, b):
        first_phase(a, b, sent)
        early = wait_for_first_result(t)
        # Readable downstream while the upstream has not ended: the result left on the watermark.
        assert task.thread.is_alive()
        assert early["window_end"] <= 2000
        for n in range(40):
            write(a if n % 2 else b, sent, f"k{n % 4}", 2000 + n * 50, n + 0.5)
        a.send_watermark(3000)
        b.send_watermark(3500)
        a.send_end_of_stream()
        b.send_end_of_stream()
    task.join()
    assert task.error is None, task.error
    results, marks, reader = read_output(t)
    assert results == oracle(sent)
    assert marks[0] == 2000 and marks == sorted(set(marks)) and set(marks) <= {2000, 3000, 3500}
    assert reader.tracker.counters.regressions == 0
    assert task.result is not None
    assert (task.result.records, task.result.late, task.result.ended) == (80, 0, True)
    assert task.result.windows_emitted == len(results)
    assert read_plain(kafka_config, t.late) == []


def test_late_records_go_to_the_side_topic(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    t = Topics(kafka_config, new_topic)
    sent: list[dict[str, Any]] = []
    task = TaskThread(t)
    with upstream(t) as (a, b):
        first_phase(a, b, sent)
        wait_for_first_result(t)  # the task's watermark is 2000 now: windows before it are closed
        late: list[dict[str, Any]] = [
            {"key": "k1", "event_ms": 100, "amount": 7},
            {"key": "k9", "event_ms": 1999, "amount": 8},
            {"key": "k2", "event_ms": 1500, "amount": 9},
        ]
        for v in late:
            a.send(v, key=v["key"])
        a.send_bytes(b"not json", key="bad")  # malformed: to the side topic too, and the task goes on
        a.send({"key": "k3"}, key="k3")  # no event_ms
        write(b, sent, "k1", 2000, 1)  # on time: its window [2000, 3000) is open
        write(a, sent, "k1", 2999, 2)
        a.send_end_of_stream()
        b.send_end_of_stream()
    task.join()
    assert task.error is None, task.error
    results, _, _ = read_output(t)
    assert results == oracle(sent)
    assert task.result is not None and task.result.late == 3 and task.result.rejected == 2
    everything = read_plain(kafka_config, t.late)
    rejected = [m for m in everything if dict(m.headers())[HEADER_LATE_REASON].startswith(b"malformed record")]
    assert sorted(m.value() for m in rejected) == [b"not json", b'{"key":"k3"}']
    side = [m for m in everything if m not in rejected]
    bodies = sorted((orjson.loads(m.value()) for m in side), key=lambda v: v["event_ms"])
    assert [(v["key"], v["event_ms"], v["amount"]) for v in bodies] == sorted(
        ((v["key"], v["event_ms"], v["amount"]) for v in late), key=lambda x: x[1]
    )
    assert all(v["watermark"] == 2000 and v["reason"] == LATE_REASON for v in bodies)
    assert all(v["upstream_task"] == "a" and v["upstream_partition"] in (0, 1) for v in bodies)
    for m in everything:  # late and malformed alike name the upstream task, partition and offset
        headers = dict(m.headers())
        assert headers[HEADER_LATE_TASK] == b"a"
        assert int(headers[HEADER_LATE_PARTITION]) in (0, 1) and int(headers[HEADER_LATE_OFFSET]) >= 0
    assert sorted(int(dict(m.headers())[HEADER_LATE_PARTITION]) for m in side) == sorted(
        v["upstream_partition"] for v in bodies)


@pytest.mark.parametrize("hard_kill", [False, True], ids=["crash", "kill"])
def test_restarts_leave_the_output_exactly_once(
    kafka_config: dict[str, Any], new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch, hard_kill: bool
) -> None:
    """Run 1 dies mid-stream (``crash``: an exception, the task aborts its transaction; ``kill``: as kill -9,
    the transaction stays open and its producer alive, a zombie the next run must fence), run 2 resumes and
    is stopped, run 3 resumes and finishes. The output is the oracle exactly once."""
    zombies: list[Any] = []
    if hard_kill:

        def vanish(self: Any) -> None:  # no abort: the open transaction and its producer stay behind
            zombies.append(self.writer)
            self.reader.close()

        monkeypatch.setattr(window._Task, "abandon", vanish)
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    t = Topics(kafka_config, new_topic)
    sent: list[dict[str, Any]] = []

    go_on = threading.Event()

    def produce() -> None:
        with upstream(t) as (a, b):
            for step in range(16):
                if step == 6:
                    assert go_on.wait(30)
                for n in range(30):
                    write(a if n % 2 else b, sent, f"k{n % 5}", step * WINDOW + n * 33, n + step)
                a.send_watermark((step + 1) * WINDOW)
                b.send_watermark((step + 1) * WINDOW)
                a.flush()
                b.flush()
                time.sleep(0.1)
            a.send_end_of_stream()
            b.send_end_of_stream()

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()

    def after(seconds: float, then: Callable[[], bool]) -> Callable[[], bool]:
        """A stop() that calls ``then`` once ``seconds`` have passed since the task's first loop."""
        started: list[float] = []

        def stop() -> bool:
            if not started:
                started.append(time.monotonic())
            return then() if time.monotonic() - started[0] >= seconds else False

        return stop

    crash_now = threading.Event()

    def crash() -> bool:
        if crash_now.is_set():
            raise Crash
        return False

    first = TaskThread(t, stop=crash)
    wait_for_first_result(t)  # the first run has committed some output
    go_on.set()  # the upstream writes on; the crash comes in the middle of it
    time.sleep(rng.uniform(0.0, 0.8))
    crash_now.set()
    first.join()
    assert isinstance(first.error, Crash), (seed, first.error)
    second = TaskThread(t, stop=after(rng.uniform(0.2, 0.8), lambda: True))
    second.join()
    assert second.error is None, (seed, second.error)
    assert second.result is not None and second.result.resumed, seed
    third = TaskThread(t)
    third.join()
    producer.join(30)
    assert third.error is None, (seed, third.error)
    assert third.result is not None and third.result.resumed and third.result.ended, seed
    assert third.result.records == len(sent), seed  # counters commit with the state: exactly once too

    results, marks, reader = read_output(t)
    assert results == oracle(sent), seed
    assert marks == sorted(set(marks)), seed
    assert reader.tracker.counters.regressions == 0, seed
    assert third.result.windows_emitted == len(results), seed
    assert read_plain(kafka_config, t.late) == [], seed


class BuggyWindows(TumblingWindows):
    """The task's windows with a bug planted in ``add`` for one key: as any internal error of our code would,
    it raises one of the exceptions that were once taken for the record's fault."""

    def add(self, key: str, event_time: int, values: Any = None) -> Any:
        if key == "boom":
            raise KeyError("internal bookkeeping lost a window (planted)")
        return super().add(key, event_time, values or {})


def test_an_internal_error_fails_the_task_and_is_not_filed_as_a_bad_record(
    kafka_config: dict[str, Any], new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A malformed record still goes the bad-record way (side topic, reason, counted). An error our own code
    raises on a valid record is not a bad record: the task fails with it (its Spark task fails, the job
    exits non-zero), the note names the task and the record's topic, partition and offset, nothing of the
    record reaches the side topic, and the open transaction is aborted."""
    monkeypatch.setattr(window, "TumblingWindows", BuggyWindows)
    t = Topics(kafka_config, new_topic)
    task = TaskThread(t)
    with upstream(t) as (a, _b):
        a.send_bytes(b"not json", key="bad")
        a.send({"key": 7, "event_ms": 5}, key="bad")  # a key the windows refuse: the record's fault
        a.flush()
        deadline = time.monotonic() + 20
        while len(read_plain(kafka_config, t.late)) < 2:  # committed to the side topic before the bug hits
            assert time.monotonic() < deadline, "the malformed records did not reach the side topic"
            time.sleep(0.2)
        a.send({"key": "boom", "event_ms": 10, "amount": 1}, key="boom")
        a.flush()
        task.join()
    assert isinstance(task.error, KeyError), task.error
    note = " ".join(getattr(task.error, "__notes__", []))
    assert f"topic {t.input!r} partition" in note and "offset" in note and "window task 0" in note
    assert "not a malformed record" in note
    side = read_plain(kafka_config, t.late)
    reasons = sorted(dict(m.headers())[HEADER_LATE_REASON].decode() for m in side)
    assert len(reasons) == 2 and all(r.startswith("malformed record: ") for r in reasons)
    assert any("window key must be a string" in r for r in reasons)
    assert held_back(kafka_config, t.output, 2)[0] == {} and held_back(kafka_config, t.late, 1)[0] == {}
