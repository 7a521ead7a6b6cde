"""A transaction that cannot be aborted is named, and fenced so that it does not stay open
(:mod:`controlmsg.kafka.aborts`), on a real broker with real transactions.

The abort's failure is injected (a coordinator that does not answer cannot be had on demand without
stopping the broker the whole session shares): a ``Producer`` subclass whose ``abort_transaction``
raises as librdkafka does when the coordinator times out (or raises anything else). Everything else is
real: the transaction is open on the broker, the fence is a real ``init_transactions``, and the readers
are ``read_committed``.

Every caller of :func:`~controlmsg.kafka.aborts.abort_or_fence` has its own test below, in which the
failed abort leaves a transaction open on the broker: the control-round writer
(:func:`~controlmsg.kafka.markers.write_control_round`), the exit of a ``ControlWriter`` block on an
exception (a Spark write task's), and a window task that fails (``_Task._abandon``). Without the call at
that site (or with a plain abort instead) the transaction stays open for its whole
``transaction.timeout.ms`` (120 s here, longer than any of these tests waits) and the test fails."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from controlmsg.core.messages import EndOfStreamMessage
from controlmsg.core.naming import task_name, transactional_id
from controlmsg.errors import DeliveryError
from controlmsg.kafka import aborts, markers
from controlmsg.kafka import writer as writer_module
from controlmsg.kafka.aborts import abort_or_fence
from controlmsg.kafka.markers import MarkerStore, Round, write_control_round
from controlmsg.kafka.writer import ControlWriter, fence_transactions
from controlmsg.streaming.window import run_window_task
from tests.transactions import held_back

from .test_window_task import RUN, WINDOW, Topics, upstream

LOGGER = "controlmsg.kafka.transactions"
TIMEOUT_MS = 120_000
"""The tests' transactions: far longer than any test here waits, so only an abort or a fence ends one."""


class CoordinatorTimesOut(Producer):
    """A real producer whose abort fails as it does when the transaction coordinator does not answer."""

    def abort_transaction(self, *args: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort_transaction timed out (injected)"))


class AbortBreaks(Producer):
    """A real producer whose abort fails with something that is no Kafka error at all."""

    def abort_transaction(self, *args: Any) -> None:
        raise RuntimeError("abort_transaction broke (injected)")


ABORT_FAILURES = pytest.mark.parametrize("failing", [CoordinatorTimesOut, AbortBreaks], ids=["timed-out", "broke"])


def open_transaction(config: dict[str, Any], topic: str, producer_type: type[Producer] = Producer
                     ) -> tuple[Producer, dict[str, Any]]:
    """A producer of a fresh transactional id with 3 records in an open transaction on ``topic``."""
    conf = {**config, "transactional.id": f"t-abort-{uuid.uuid4().hex[:8]}", "transaction.timeout.ms": TIMEOUT_MS}
    producer = producer_type(conf)
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(3):
        producer.produce(topic, f"uncommitted-{n}".encode(), partition=0)
    assert producer.flush(30) == 0
    return producer, conf


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@ABORT_FAILURES
def test_a_failed_abort_fences_the_id_and_readers_go_on(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                        caplog: pytest.LogCaptureFixture,
                                                        failing: type[Producer]) -> None:
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, failing)
    assert held_back(kafka_config, topic, 1)[0] == {0: (0, 3)}  # the transaction is open: readers wait at 0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    waiting, records = held_back(kafka_config, topic, 1)
    assert waiting == {} and records == []  # aborted: nothing holds readers back, nothing of it is readable
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert conf["transactional.id"] in line and topic in line and "fenced the id" in line
    assert ("timed out" if failing is CoordinatorTimesOut else "RuntimeError: abort_transaction broke") in line
    with pytest.raises(KafkaException) as fenced:  # the old producer cannot commit it any more
        producer.commit_transaction(10)
    assert fenced.value.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


def test_a_producer_fenced_already_needs_no_abort(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic)
    fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)  # a newer instance of the id
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    assert held_back(kafka_config, topic, 1) == ({}, [])
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert "no abort needed" in line and conf["transactional.id"] in line and topic in line


def test_an_abort_that_cannot_be_fenced_either_names_what_it_holds_back(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    """The abort fails and the fence cannot reach a cluster (its bootstrap address answers nothing): the
    ERROR line names the id, the topic, and until when the open transaction can hold readers back."""
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    unreachable = {**conf, "bootstrap.servers": f"127.0.0.1:{closed_port()}"}
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert abort_or_fence(producer, unreachable, topic, timeout=3.0) is False
        (record,) = [r for r in caplog.records if r.name == LOGGER]
        line = record.getMessage()
        assert record.levelno == logging.ERROR
        assert conf["transactional.id"] in line and repr(topic) in line
        assert "holds read_committed readers" in line and "120000 ms" in line and "at the latest" in line
        assert held_back(kafka_config, topic, 1)[0] == {0: (0, 3)}  # honest: it is still open
    finally:
        fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)
    assert held_back(kafka_config, topic, 1) == ({}, [])


# ------------------------------------------------------------------------ abort_or_fence never raises


def _error_line(caplog: pytest.LogCaptureFixture) -> str:
    (record,) = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.ERROR
    return record.getMessage()


def test_a_fencer_that_cannot_even_be_made_is_named_not_raised(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture) -> None:
    """The fencing producer's construction fails (librdkafka refuses a setting: here a transaction timeout
    that is no number, which the ERROR line also cannot turn into a time): still no exception, and the line
    names the id, the topic and both failures."""
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert abort_or_fence(producer, {**conf, "transaction.timeout.ms": "soon"}, topic, timeout=3.0) is False
        line = _error_line(caplog)
        assert conf["transactional.id"] in line and repr(topic) in line and "timed out" in line
        assert "transaction.timeout.ms ('soon')" in line
        assert held_back(kafka_config, topic, 1)[0] == {0: (0, 3)}  # honest: it is still open
    finally:
        fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)


@pytest.mark.parametrize("step", ["construction", "init_transactions"])
def test_a_fence_that_raises_anything_is_named_not_raised(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Whatever the fence raises (not only Kafka's and controlmsg's errors), abort_or_fence returns False and
    logs the ERROR line instead."""
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, AbortBreaks)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the fence's {step} broke (injected)")

    monkeypatch.setattr(aborts, "Producer" if step == "construction" else "init_transactions", broken)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            assert abort_or_fence(producer, conf, topic, timeout=3.0) is False
        line = _error_line(caplog)
        assert conf["transactional.id"] in line and repr(topic) in line
        assert "abort_transaction broke" in line and f"the fence's {step} broke" in line
        assert f"{TIMEOUT_MS} ms" in line and "at the latest" in line
    finally:
        monkeypatch.undo()
        fence_transactions(kafka_config, [conf["transactional.id"]], timeout=30)


def test_a_fencer_that_fails_to_end_still_fenced(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                 caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The fencing producer fails as it is being let go (after its ``init_transactions``, which fenced the
    id): that changes nothing, the transaction is aborted and the WARNING says so."""

    class EndBreaks(Producer):
        def flush(self, *args: Any) -> int:
            raise RuntimeError("flush broke (injected)")

    monkeypatch.setattr(aborts, "Producer", EndBreaks)
    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    assert held_back(kafka_config, topic, 1) == ({}, [])
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert conf["transactional.id"] in line and "fenced the id" in line


def test_a_log_line_that_cannot_be_logged_is_not_raised(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A filter of the transactions logger that raises (logging lets a filter's exception through): the
    fence is done all the same, and the line goes to stderr."""

    def broken(record: logging.LogRecord) -> bool:
        raise RuntimeError("filter broke (injected)")

    topic = new_topic(1)
    producer, conf = open_transaction(kafka_config, topic, CoordinatorTimesOut)
    aborts.TRANSACTION_LOGGER.addFilter(broken)
    try:
        assert abort_or_fence(producer, conf, topic, timeout=10.0) is True
    finally:
        aborts.TRANSACTION_LOGGER.removeFilter(broken)
    assert held_back(kafka_config, topic, 1) == ({}, [])
    err = capsys.readouterr().err
    assert "cannot log" in err and conf["transactional.id"] in err and "filter broke" in err


# ------------------------------------------------------------------ each caller of abort_or_fence


def failing_transactions(made: list[Producer]) -> type[Producer]:
    """A real producer (kept in ``made``: alive, as in a process that goes on) whose commit marker cannot be
    added, once the round's records are on the broker in the open transaction, and whose abort times out."""

    class MarkerTimesOut(CoordinatorTimesOut):
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            made.append(self)

        def send_offsets_to_transaction(self, *args: Any) -> None:
            assert self.flush(30) == 0
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "send_offsets_to_transaction timed out (injected)"))

    return MarkerTimesOut


def test_a_control_round_whose_abort_fails_is_fenced(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                     caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """write_control_round (the driver of a Spark write): the marker cannot be added, the abort fails; the
    round's error is raised, not the abort's, and its open transaction is ended by the fence."""
    made: list[Producer] = []
    monkeypatch.setattr(markers, "Producer", failing_transactions(made))
    topic = new_topic(2)
    tid = f"round-{uuid.uuid4().hex[:8]}"
    ends = [EndOfStreamMessage(f"t{i}", 2, "r1") for i in range(2)]

    def plan(committed: dict[str, Any] | None) -> Round | None:
        return None if committed else (ends, {"ended": True})

    with caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(DeliveryError, match="commit marker"):
        write_control_round({**kafka_config, "transaction.timeout.ms": TIMEOUT_MS}, topic, 2, plan,
                            transactional_id=tid, timeout=30)
    assert len(made) == 1  # the round's producer, still there
    assert held_back(kafka_config, topic, 2) == ({}, [])  # ended: nothing holds readers back, nothing committed
    with MarkerStore(kafka_config, tid, topic) as store:
        assert store.load() is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert repr(tid) in line and repr(topic) in line and "fenced the id" in line and "timed out" in line


@ABORT_FAILURES
def test_a_writer_left_by_an_exception_whose_abort_fails_is_fenced(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, failing: type[Producer]) -> None:
    """A ``with ControlWriter(...)`` block (a Spark write task's) left by an exception, with records in the
    open transaction, and the abort fails: the block's exception propagates, the transaction is ended."""
    monkeypatch.setattr(writer_module, "Producer", failing)
    topic = new_topic(2)
    tid = f"exit-{uuid.uuid4().hex[:8]}"
    conf = {**kafka_config, "transactional.id": tid, "transaction.timeout.ms": TIMEOUT_MS}
    with (caplog.at_level(logging.WARNING, logger=LOGGER), pytest.raises(RuntimeError, match="the task failed"),
          ControlWriter(conf, topic, task_name="t0", task_count=1, run_id="r1") as writer):
        for n in range(4):
            writer.send({"n": n}, partition=n % 2)
        writer.flush()
        assert set(held_back(kafka_config, topic, 2)[0]) == {0, 1}  # open on both partitions
        raise RuntimeError("the task failed (planted)")
    assert held_back(kafka_config, topic, 2) == ({}, [])
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert repr(tid) in line and repr(topic) in line and "fenced the id" in line
    assert writer.topic == topic  # the writer (and its producer) is still there: the fence, not its end, did it


def test_a_marker_call_wedged_past_its_timeout_fails_the_write_and_ends_its_transaction(
        kafka_config: dict[str, Any], new_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's send_offsets_to_transaction can block for good past its timeout after a broker restart
    (librdkafka#5456; a Spark write task waited 10 minutes in it): the write task's marker call fails within
    its timeout plus the grace, naming the call, and the writer's exit ends the open transaction, so that
    Spark's retry of the task starts clean. The wedge is injected (it cannot be had on demand): the call
    blocks until the test ends."""
    from controlmsg.kafka import retry

    release = threading.Event()

    class OffsetsWedge(Producer):
        def send_offsets_to_transaction(self, *args: Any) -> None:
            release.wait(120)

    monkeypatch.setattr(writer_module, "Producer", OffsetsWedge)
    monkeypatch.setattr(retry, "WEDGE_GRACE_S", 1.0)
    topic = new_topic(2)
    tid = f"wedge-{uuid.uuid4().hex[:8]}"
    conf = {**kafka_config, "transactional.id": tid, "transaction.timeout.ms": TIMEOUT_MS}
    try:
        with (pytest.raises(DeliveryError, match="send_offsets_to_transaction did not return") as raised,
              MarkerStore(kafka_config, tid, topic, timeout=2.0) as store,
              ControlWriter(conf, topic, task_name="t0", task_count=1, run_id="r1") as writer):
            for n in range(4):
                writer.send({"n": n}, partition=n % 2)
            writer.flush()
            assert set(held_back(kafka_config, topic, 2)[0]) == {0, 1}  # open on both partitions
            store.add(writer, {"ended": True})
        assert repr(topic) in str(raised.value) and "wedged (confluentinc/librdkafka#5456)" in str(raised.value)
        assert held_back(kafka_config, topic, 2) == ({}, [])  # ended: nothing holds readers back, nothing committed
        with MarkerStore(kafka_config, tid, topic) as store:
            assert store.load() is None
    finally:
        release.set()


class Crash(Exception):
    """Raised by the window task's stop() to make it fail mid-transaction."""


def test_a_window_task_whose_abort_fails_is_fenced(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                                   caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A window task fails with its watermark written in an open transaction (no window closed, no commit
    due), and its abort fails: the task's error propagates, and the fence ends the transaction."""
    monkeypatch.setattr(writer_module, "Producer", CoordinatorTimesOut)
    t = Topics(kafka_config, new_topic)
    config = {**kafka_config, "transaction.timeout.ms": TIMEOUT_MS}
    crash = threading.Event()
    errors: list[BaseException] = []

    def stop() -> bool:
        if crash.is_set():
            raise Crash("the task failed (planted)")
        return False

    def body() -> None:
        try:
            run_window_task(config, input_topic=t.input, partitions=[0, 1], run_id=RUN, output_topic=t.output,
                            late_topic=t.late, state_topic=t.state, task_index=0, task_count=1, window_ms=WINDOW,
                            sums=["amount"], commit_interval_s=3600, stop=stop)
        except BaseException as exc:
            errors.append(exc)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        task = threading.Thread(target=body, daemon=True)
        task.start()
        with upstream(t) as (a, b):
            for n, w in enumerate((a, b)):
                w.send({"key": "k", "event_ms": 100 + n, "amount": 1}, key="k")
                w.send_watermark(WINDOW // 2)  # closes no window: the task writes its watermark, commits nothing
        deadline = time.monotonic() + 60
        while set(held_back(kafka_config, t.output, 2)[0]) != {0, 1}:
            assert time.monotonic() < deadline and task.is_alive(), f"no open transaction on the output: {errors}"
            time.sleep(0.2)
        crash.set()
        task.join(60)
    assert not task.is_alive(), "the window task did not end"
    assert len(errors) == 1 and isinstance(errors[0], Crash), errors
    assert held_back(kafka_config, t.output, 2) == ({}, [])
    tid = transactional_id(t.output, task_name("window", RUN, 0))
    (line,) = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f"transactional id {tid!r} on topic {t.output!r}" in line
    assert "fenced the id" in line and "timed out" in line
