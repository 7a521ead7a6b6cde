"""The streaming sink on a real broker: rows appended as results arrive, exactly once across restarts
(a restart cuts the file back to the length its checkpoint recorded), nothing before end of stream lost."""

from __future__ import annotations

import csv
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from controlmsg.errors import CheckpointError
from controlmsg.kafka import ControlWriter, FileCheckpointStore
from spark_jobs.runtime.sink import checkpoint_path, iso_ms, run_stream_sink

RUN = "run-s"


def result(key: str, start: int, count: int, amount: float) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": start + 60_000, "count": count, "sum_amount": amount}


def write_results(config: dict[str, Any], topic: str, results: list[dict[str, Any]], end: bool = True) -> None:
    """Two upstream tasks split the results; each ends its stream when ``end``."""
    for i, name in enumerate(("w0", "w1")):
        with ControlWriter(config, topic, task_name=name, task_count=2, run_id=RUN) as w:
            for r in results[i::2]:
                w.send(r, key=r["key"])
            if end:
                w.send_end_of_stream()


def test_iso_format_matches_the_batch_sink() -> None:
    assert iso_ms(1_767_225_600_000) == "2026-01-01T00:00:00Z"
    assert iso_ms(1_767_225_600_123) == "2026-01-01T00:00:00.123Z"
    assert iso_ms(-1) == "1969-12-31T23:59:59.999Z"


def test_rows_exactly_once_across_a_restart(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                            tmp_path: Path) -> None:
    topic = new_topic(3)
    output = tmp_path / "out.csv"
    first = [result(f"u{i}", 1_767_225_600_000 + 60_000 * (i % 4), i + 1, i * 1.5) for i in range(40)]
    write_results(kafka_config, topic, first, end=False)
    summary = run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, sums=["amount"],
                              checkpoint_interval_s=0.1, timeout_s=3)
    assert summary["rows"] == 40 and not summary["ended"]  # no end of stream yet: stopped by the timeout
    saved = FileCheckpointStore(checkpoint_path(output)).load()
    assert saved is not None and saved.extra["outputBytes"] == output.stat().st_size
    with output.open("ab") as f:  # what a process killed after writing, before its checkpoint, leaves behind
        f.write(b"u99,2026-01-01T00:00:00Z,2026-01-01T00:01:00Z,1,1.0\nhalf a ro")
    second = [result(f"v{i}", 1_767_225_600_000, 1, 2.0) for i in range(10)]
    write_results(kafka_config, topic, second)
    summary = run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, sums=["amount"])
    assert summary["rows"] == 50 and summary["ended"] and summary["resumed"]
    with output.open() as f:
        got = list(csv.DictReader(f))
    want = [{"key": r["key"], "window_start": iso_ms(r["window_start"]), "window_end": iso_ms(r["window_end"]),
             "count": str(r["count"]), "sum_amount": str(r["sum_amount"])} for r in first + second]
    assert sorted(got, key=lambda r: r["key"]) == sorted(want, key=lambda r: r["key"])
    # Ended: a third start finds the end in its checkpoint and writes nothing.
    again = run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, sums=["amount"])
    assert again["rows"] == 50 and again["ended"] and output.read_text().count("\n") == 51


def test_rows_appear_before_end_of_stream(kafka_config: dict[str, Any], new_topic: Callable[..., str],
                                          tmp_path: Path) -> None:
    topic = new_topic(2)
    output = tmp_path / "out.jsonl"
    done: list[dict[str, Any]] = []
    sink = threading.Thread(target=lambda: done.append(run_stream_sink(
        kafka_config, input_topic=topic, output=str(output), run_id=RUN, checkpoint_interval_s=0.1, timeout_s=60)))
    sink.start()
    write_results(kafka_config, topic, [result("a", 0, 3, 1.0)], end=False)
    deadline = time.monotonic() + 20
    while not (output.exists() and output.read_bytes().endswith(b"\n")):
        assert time.monotonic() < deadline, "the row did not appear before end of stream"
        time.sleep(0.05)
    assert orjson.loads(output.read_bytes()) == {"key": "a", "window_start": "1970-01-01T00:00:00Z",
                                                 "window_end": "1970-01-01T00:01:00Z", "count": 3}
    write_results(kafka_config, topic, [], end=True)
    sink.join(30)
    assert done and done[0]["ended"] and done[0]["rows"] == 1


def test_refusals(kafka_config: dict[str, Any], new_topic: Callable[..., str], tmp_path: Path) -> None:
    topic = new_topic(1)
    with pytest.raises(ValueError, match=r"\.csv or \.jsonl"):
        run_stream_sink(kafka_config, input_topic=topic, output=str(tmp_path / "o.parquet"), run_id=RUN)
    output = tmp_path / "o.csv"
    run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, timeout_s=0.5)
    with pytest.raises(CheckpointError, match="belongs to run 'run-s', not 'other'"):
        run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id="other", timeout_s=0.5)
    output.write_bytes(b"")  # someone emptied the file the checkpoint accounts for
    with pytest.raises(CheckpointError, match="changed outside the sink"):
        run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, timeout_s=0.5)
    output.unlink()
    with pytest.raises(CheckpointError, match="missing, but its checkpoint"):
        run_stream_sink(kafka_config, input_topic=topic, output=str(output), run_id=RUN, timeout_s=0.5)
