"""A stop that cannot be clean says so (issue 29, item 5.2), on the real broker and Spark.

Two logical tasks each hold a transaction open on a real topic and never reach a commit. Then:

* the stop record cannot be written (the stop topic refuses it: ``max.message.bytes`` below any record):
  the run fails with :class:`StopFailed` naming the stop topic and the refusal, not a clean stop; the
  tasks are cancelled at once and their transactional ids fenced, so no transaction stays open;
* the stop record is written but the tasks do not come back within the grace: they are cancelled, fenced
  the same way, and the :class:`StopRequested` names the fenced ids.

The stop is requested as the signal handler does (``Stopper.signum`` and ``requested``), not by a real
signal, whose hard-limit thread would end the test process; the signal itself is covered by
``test_streaming_stop.py``.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from controlmsg.kafka.admin import create_topic
from controlmsg.streaming.runtime import Body, run_long_running_tasks
from controlmsg.streaming.stopping import StopChannel, StopFailed, Stopper, StopRequested
from tests.transactions import held_back

TASKS = 2


def written(config: dict[str, Any], topic: str) -> int:
    """Records on ``topic`` partition 0, committed or not."""
    consumer = Consumer({**config, "group.id": f"w-{uuid.uuid4().hex}", "isolation.level": "read_uncommitted"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1])
    finally:
        consumer.close()


def stuck_body(config: dict[str, Any], topic: str, ids: list[str]) -> Body:
    """Tasks that write a record in a transaction and then never commit, whatever ``stop()`` says."""

    def body(i: int, stop: Callable[[], bool]) -> dict[str, Any]:
        from controlmsg.kafka.writer import ControlWriter

        writer = ControlWriter({**config, "transactional.id": ids[i], "transaction.timeout.ms": 120_000}, topic,
                               task_name=f"stuck-{i}", task_count=None)
        writer.send({"task": i}, partition=0)
        writer.flush()
        while True:
            stop()
            time.sleep(0.05)

    return body


@pytest.mark.parametrize("refused", [True, False], ids=["stop-record-refused", "grace-passed"])
def test_tasks_cancelled_mid_transaction_are_fenced_and_named(spark: SparkSession, kafka_config: dict[str, Any],
                                                              new_topic: Callable[..., str], refused: bool) -> None:
    out = new_topic(1, prefix="stuck")
    ids = [f"{out}-task-{i}" for i in range(TASKS)]
    stop_topic = f"{out}-stop"
    if refused:
        create_topic(kafka_config, stop_topic, 1, topic_config={"max.message.bytes": "1"})
    stop = StopChannel.open(kafka_config, stop_topic)
    stopper = Stopper("test").install()

    def request_when_open() -> None:  # once both tasks hold an open transaction, as SIGTERM would
        deadline = time.monotonic() + 60
        while written(kafka_config, out) < TASKS and time.monotonic() < deadline:
            time.sleep(0.2)
        stopper.signum = signal.SIGTERM
        stopper.requested.set()

    threading.Thread(target=request_when_open, daemon=True).start()
    expected: type[BaseException] = StopFailed if refused else StopRequested
    try:
        with pytest.raises(expected) as stopped:
            run_long_running_tasks(spark, TASKS, stuck_body(kafka_config, out, ids), stop, transactional_ids=ids)
    finally:
        stopper.uninstall()
    message = str(stopped.value)
    assert written(kafka_config, out) >= TASKS  # the tasks had written in their transactions
    assert f"fenced the cancelled tasks' transactional ids {ids}" in message and "could NOT" not in message
    if refused:
        assert repr(stop_topic) in message and "refused" in message and "could not be written" in message
    else:
        assert "tasks cancelled before they reached a commit" in message
    # Fenced, so aborted: nothing holds read_committed readers back, and nothing of it is readable.
    assert held_back(kafka_config, out, 1) == ({}, [])
