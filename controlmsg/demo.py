"""``controlmsg demo``: several upstream tasks write an intermediate topic; one consumer follows it to end
of stream and shows the reconciled watermark as it advances.

Each upstream task emits events whose event times run forward with some disorder, and after every
``watermark_every`` events a watermark: its largest event time so far minus the allowed disorder (the
:class:`~controlmsg.core.watermarks.WatermarkPolicy` rule). Tasks run at different speeds, so the
consumer's watermark is held back by the slowest; at the end each task writes its end of stream and the
consumer stops by itself.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from controlmsg.core.events import PartitionEnded, StreamEnded, WatermarkAdvanced
from controlmsg.core.naming import demo_topic
from controlmsg.core.watermarks import WatermarkPolicy
from controlmsg.kafka.admin import create_topic
from controlmsg.kafka.data_records import DataRecord
from controlmsg.kafka.reader import ControlReader
from controlmsg.kafka.writer import ControlWriter

__all__ = ["run_demo"]

_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _upstream(config: Mapping[str, Any], topic: str, index: int, tasks: int, events: int, run_id: str,
              watermark_every: int, disorder_ms: int, delay: float) -> None:
    rng = random.Random(index)
    name = f"demo-task-{index}"
    cadence = WatermarkPolicy(allowed_lateness_ms=disorder_ms, every_rows=watermark_every).cadence(0)  # rows only
    with ControlWriter(config, topic, task_name=name, task_count=tasks, run_id=run_id, data_headers=True) as w:
        clock = _START_MS
        for n in range(events):
            clock += rng.randint(500, 1500)
            event_time = clock - rng.randint(0, disorder_ms)  # out of order, never beyond the disorder bound
            w.send({"user": f"user-{rng.randint(0, 49)}", "amount": rng.randint(1, 100), "ts": event_time,
                    "task": name}, key=f"user-{n % 50}")
            mark = cadence.observe(1, event_time, 0)
            if mark is not None:
                w.send_watermark(mark)
                w.flush()
                time.sleep(delay)
        w.send_end_of_stream()


def run_demo(config: Mapping[str, Any], out: TextIO, *, tasks: int = 3, partitions: int = 4, events: int = 2000,
             watermark_every: int = 250, disorder_ms: int = 5000) -> int:
    """Run the demo against ``config``'s cluster, print to ``out``; return the number of records read.
    Blocks until the consumer has seen end of stream (or raises after two minutes)."""
    run_id = uuid.uuid4().hex[:8]
    topic = demo_topic(run_id)
    create_topic(config, topic, partitions)
    print(f"topic {topic}: {partitions} partitions; run {run_id}; {tasks} upstream tasks x {events} events",
          file=out)
    threads = [
        threading.Thread(target=_upstream, daemon=True,
                         args=(config, topic, i, tasks, events, run_id, watermark_every, disorder_ms, 0.05 * (i + 1)))
        for i in range(tasks)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    records = 0
    late = 0
    mark: int | None = None  # the watermark as of the item being looked at
    with ControlReader(config, topic, run_id=run_id) as reader:
        for item in reader.read_until_end(timeout=120):
            elapsed = time.monotonic() - started
            if isinstance(item, DataRecord):
                records += 1
                if mark is not None and orjson.loads(item.payload)["ts"] < mark:
                    late += 1
            elif isinstance(item, WatermarkAdvanced):
                mark = item.timestamp
                print(f"{elapsed:6.2f}s  watermark -> {_iso(item.timestamp)}  ({records} records so far)", file=out)
            elif isinstance(item, PartitionEnded):
                print(f"{elapsed:6.2f}s  partition {item.partition}: every upstream task has ended", file=out)
            elif isinstance(item, StreamEnded):
                print(f"{elapsed:6.2f}s  end of stream: all {partitions} partitions ended", file=out)
        if not reader.tracker.is_ended:
            raise TimeoutError(f"demo topic {topic!r} did not reach end of stream")
    for t in threads:
        t.join()
    print(f"read {records} records ({late} behind the watermark) from {tasks} tasks; counters "
          f"{reader.tracker.counters}", file=out)
    return records
