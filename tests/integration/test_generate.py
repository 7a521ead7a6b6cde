"""``spark_jobs.generate`` writes the raw source events a streaming pipeline reads: a real broker, real
records, checked for count, keys, disorder and lateness."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from spark_jobs.generate import GeneratorConfig, generate


def read_all(kafka_config: dict[str, Any], topic: str, ends: dict[int, int]) -> list[Any]:
    consumer = Consumer({**kafka_config, "group.id": "t", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    out: list[Any] = []
    deadline = time.monotonic() + 30
    while len(out) < sum(ends.values()) and time.monotonic() < deadline:
        out += [m for m in consumer.consume(1000, 0.5) if m.error() is None]
    consumer.close()
    return out


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def test_events_disorder_and_late_share(kafka_config: dict[str, Any], new_topic: Callable[..., str]) -> None:
    topic = new_topic(3)
    cfg = GeneratorConfig(events=4000, rate=200_000, keys=20, disorder_ms=2000, late_fraction=0.05,
                          late_by_ms=600_000, start_ms=1_767_225_600_000, speedup=1000.0, seed=5)
    ends = generate(kafka_config, topic, cfg)
    assert sum(ends.values()) == 4000
    msgs = read_all(kafka_config, topic, ends)
    assert len(msgs) == 4000
    values = [orjson.loads(m.value()) for m in msgs]
    assert set(values[0]) == {"id", "user", "event_time", "amount", "items"}
    assert len({v["id"] for v in values}) == 4000
    assert all(m.key().decode() == v["user"] for m, v in zip(msgs, values, strict=True))
    assert len({v["user"] for v in values}) <= 20
    # Per partition the records are in send order; compare each event with the newest seen before it.
    late = 0
    for p in ends:
        high = None
        for m in (m for m in msgs if m.partition() == p):
            t = ms(orjson.loads(m.value())["event_time"])
            if high is not None and t < high - 2000 - 1000:  # older than disorder allows (+ clock slack)
                late += 1
            high = t if high is None else max(high, t)
    assert 100 <= late <= 300  # about 5 % of 4000


def test_cli_prints_end_offsets(kafka_config: dict[str, Any], bootstrap_servers: str,
                                new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    out = subprocess.run([sys.executable, "-m", "spark_jobs.generate", "--topic", topic, "--bootstrap-servers",
                          bootstrap_servers, "--events", "500", "--rate", "100000"],
                         capture_output=True, check=True, timeout=120)
    doc = orjson.loads(out.stdout)
    assert doc["topic"] == topic and sum(doc["endOffsets"].values()) == 500
