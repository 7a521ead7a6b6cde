"""Rescaling a streaming pipeline between runs (docs/PROTOCOL.md, "Generations"): the ingest runs with
``--tasks 2``, is killed with ``kill -9`` mid-stream, starts again with ``--tasks 4``, is killed again,
and ends the run with ``--tasks 3``, while the window job and the sink keep running. The window job
learns each new task set from the control messages themselves (a higher generation with its own
``taskCount``); the output equals the oracle, no record is late, and on the wire every generation's
watermarks only go up and the last generation's tasks end the stream once on every partition.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage

from .test_pipeline_oracle import assert_matches_oracle
from .test_streaming_pipeline import generated_source
from .test_streaming_restarts import EVENTS, Chain, wait_for_records
from .topic_dump import dump_topic


def _with_tasks(command: list[str], tasks: int) -> list[str]:
    at = command.index("--tasks")
    return [*command[:at + 1], str(tasks), *command[at + 2:]]


def test_rescale_the_ingest_2_4_3_with_kill_9_in_between(spark: SparkSession, kafka_config: dict[str, Any],
                                                         bootstrap_servers: str, new_topic: Callable[..., str],
                                                         tmp_path: Path) -> None:
    source = new_topic(4, prefix="raw")
    events = generated_source(kafka_config, source, tmp_path, events=EVENTS, keys=40, disorder_ms=5000, seed=23)
    chain = Chain(bootstrap_servers, source, tmp_path)
    ingest = chain.commands["stream_ingest"]
    try:
        for job in ("stream_sink", "stream_window"):
            chain.start(job)
        for tasks, through in ((2, EVENTS // 4), (4, EVENTS // 2)):
            chain.commands["stream_ingest"] = _with_tasks(ingest, tasks)
            chain.start("stream_ingest")
            wait_for_records(kafka_config, chain.events_topic, chain.run_id, through)
            chain.kill9("stream_ingest")
        chain.commands["stream_ingest"] = _with_tasks(ingest, 3)
        chain.start("stream_ingest")
        chain.wait()
    finally:
        chain.close()
    rows = assert_matches_oracle(spark, str(chain.output), input_path=str(events), key="user",
                                 event_time="event_time", window="1m", sums=["amount"])
    assert rows > 200
    ingest_summary = json.loads((chain.run_dir / "stream_ingest.json").read_text())
    assert ingest_summary["generation"] == 2 and len(ingest_summary["tasks"]) == 3
    window = json.loads((chain.run_dir / "stream_window.json").read_text())
    assert sum(t["windows_emitted"] for t in window["tasks"]) == rows  # each window written once in all
    assert sum(t["late"] for t in window["tasks"]) == 0  # no window closed early for a task not heard from

    # The wire of the events topic: three generations, each with its own taskCount, and watermarks that
    # never go back within a generation.
    counts: dict[int, set[int]] = {}
    marks: dict[tuple[int, str, int], list[int]] = {}
    ended: Counter[tuple[int, str, int]] = Counter()
    for rec in dump_topic(kafka_config, chain.events_topic):
        message = rec.value
        if isinstance(message, WatermarkMessage | EndOfStreamMessage):
            counts.setdefault(message.generation, set()).add(message.task_count)
            key = (message.generation, message.task_name, rec.partition)
            if isinstance(message, WatermarkMessage):
                marks.setdefault(key, []).append(message.timestamp)
            else:
                ended[key] += 1
    assert counts == {0: {2}, 1: {4}, 2: {3}}
    for key, seq in marks.items():
        assert seq == sorted(seq), f"watermarks of {key} go back: {seq}"
    # A task of an older generation may have ended its own stream (its source partitions reached their end
    # before the kill); the stream ends with generation 2's, each once on each of the 3 partitions.
    assert set(ended.values()) == {1}, ended
    assert len([key for key in ended if key[0] == 2]) == 3 * 3, ended
