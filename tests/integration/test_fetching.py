"""A consumer returns what it has without waiting for what is not there (:mod:`controlmsg.kafka.fetching`),
on a real broker: librdkafka's ``consume(n, timeout)`` holds a batch shorter than ``n`` for the whole timeout,
and an end-of-partition event comes with an empty fetch, which the broker holds for ``fetch.wait.max.ms``.

The bounds below are the calls' own timeouts: the old ``consume(n, timeout)`` returned only at the timeout,
so a call that waits for what is not there fails them; nothing here is timed more tightly than that."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from controlmsg.kafka import ControlReader, ControlWriter, DataRecord
from controlmsg.kafka.fetching import EOF_FETCH_WAIT_MS, consume_ready

TIMEOUT_S = 20.0


def test_a_short_batch_comes_back_before_the_timeout(kafka_config: dict[str, Any],
                                                      new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    producer = Producer(kafka_config)
    for n in range(5):
        producer.produce(topic, f"m{n}".encode(), partition=n % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({**kafka_config, "group.id": "fetching", "enable.partition.eof": True,
                         "fetch.wait.max.ms": EOF_FETCH_WAIT_MS})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        got: list[bytes] = []
        ends: set[int] = set()
        started = time.monotonic()
        while len(ends) < 2:
            msgs = consume_ready(consumer, 1000, TIMEOUT_S)
            assert msgs, "nothing within the timeout"
            got += [m.value() for m in msgs if m.error() is None]
            ends |= {m.partition() for m in msgs if m.error() is not None}
        took = time.monotonic() - started
    finally:
        consumer.close()
    assert sorted(got) == [f"m{n}".encode() for n in range(5)]
    assert took < TIMEOUT_S, f"waited {took:.1f} s for 5 records and two partition ends"


def test_the_reader_returns_what_it_has_and_the_cli_ends_at_the_partitions_end(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str]) -> None:
    """ControlReader.poll waits "up to timeout for the first record" (its contract), not for a full batch;
    ``controlmsg consume -e`` (a transactional topic: its last offsets are commit markers) ends at once."""
    import subprocess
    import sys

    topic = new_topic(2)
    with ControlWriter(kafka_config, topic, task_name="t0", task_count=1, run_id="r") as writer:
        for n in range(3):
            writer.send({"n": n}, partition=n % 2)
    with ControlReader(kafka_config, topic, stop_at_end=False) as reader:
        started = time.monotonic()
        items = reader.poll(TIMEOUT_S)
        while len(items) < 3:
            items += reader.poll(TIMEOUT_S)
        assert time.monotonic() - started < TIMEOUT_S
    assert all(isinstance(item, DataRecord) for item in items)
    assert sorted(item.offset for item in items if isinstance(item, DataRecord)) == [0, 0, 1]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "controlmsg", "consume", "--bootstrap-servers", bootstrap_servers,
                           "--topic", topic, "-e", "--timeout", f"{TIMEOUT_S:g}"], capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert len(done.stdout.splitlines()) == 3
    assert time.monotonic() - started < TIMEOUT_S
