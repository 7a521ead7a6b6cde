"""What a controlmsg stream reader reports in each StreamingQueryProgress (``latestOffset``): the lag behind
the latest offsets under the Kafka connector's names, the upstream tasks, and reading them back."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.messages import EndOfStreamMessage, WatermarkMessage
from controlmsg.errors import TopicError
from controlmsg.spark.reading.source_metrics import lag_metrics, lag_report, report, source_metrics, upstream_metrics

T0 = 1_767_225_600_000


def test_the_lag_is_the_kafka_connectors_min_max_and_average_over_the_partitions() -> None:
    metrics = lag_metrics({0: 10, 1: 20, 2: 5}, {0: 10, 1: 26, 2: 8})
    assert metrics == {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "6", "avgOffsetsBehindLatest": "3.0"}


def test_a_partition_at_its_end_of_stream_lags_by_nothing_and_none_lags_below_zero() -> None:
    # partition 0 ended (a commit marker and later runs' records follow); 1's end was read past the latest asked
    metrics = lag_metrics({0: 10, 1: 30}, {0: 14, 1: 29}, caught_up={0})
    assert metrics["maxOffsetsBehindLatest"] == "0"
    assert lag_metrics({}, {}) == {}


@given(st.dictionaries(st.integers(0, 50), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1))
def test_min_avg_max_are_ordered_and_zero_when_caught_up(spans: dict[int, tuple[int, int]]) -> None:
    consumed = {p: a for p, (a, _) in spans.items()}
    latest = {p: a + b for p, (a, b) in spans.items()}
    m = lag_metrics(consumed, latest)
    assert int(m["minOffsetsBehindLatest"]) <= float(m["avgOffsetsBehindLatest"]) <= int(m["maxOffsetsBehindLatest"])
    assert int(m["maxOffsetsBehindLatest"]) == max(b for _, b in spans.values())
    assert lag_metrics(latest, latest)["maxOffsetsBehindLatest"] == "0"


def _wm(task: str, ts: int) -> WatermarkMessage:
    return WatermarkMessage(task_name=task, task_count=3, timestamp=ts, run_id="r")


def test_the_upstream_tasks_ended_out_of_expected_and_the_task_holding_the_watermark_back() -> None:
    tracker = InputTracker([0, 1], run_id="r")
    assert upstream_metrics(tracker) == {"upstreamTasksEnded": "0", "upstreamTasksNotHeardFrom": "0",
                                         "endOfStream": "false"}
    for p in (0, 1):
        tracker.on_control(p, _wm("up-p0", T0 + 60_000))
        tracker.on_control(p, _wm("up-p1", T0 + 10_000))
        tracker.on_control(p, EndOfStreamMessage(task_name="up-p2", task_count=3, run_id="r"))
    assert upstream_metrics(tracker) == {
        "upstreamTasksEnded": "1", "upstreamTasksExpected": "3", "upstreamTasksNotHeardFrom": "0",
        "endOfStream": "false", "watermark": str(T0 + 10_000), "watermarkHeldBackBy": "up-p1",
        "watermarkHeldBackOnPartition": "0", "watermarkHeldBackAt": str(T0 + 10_000)}


def _progress(*latest: object) -> dict[str, object]:
    return {"sources": [{"description": "x", "latestOffset": off, "metrics": {}} for off in latest]}


def test_source_metrics_reads_a_classic_and_a_connect_progress_and_skips_other_sources() -> None:
    ours = report("events", {1: 7, 0: 5}, {"maxOffsetsBehindLatest": "2"})
    assert ours["offsets"] == {"0": 5, "1": 7}
    kafka = {"events": {"0": 5}}
    want = {"events": {"maxOffsetsBehindLatest": "2"}}
    assert source_metrics(_progress(json.dumps(ours), json.dumps(kafka))) == want  # JSON strings
    assert source_metrics(_progress(ours, kafka, None)) == want  # parsed objects
    assert source_metrics(_progress("null", "not json")) == {}
    assert source_metrics({"sources": []}) == {}


def test_a_cluster_that_does_not_answer_is_reported_not_raised() -> None:
    def refuse(partitions: list[int]) -> dict[int, int]:
        raise TopicError("cannot list the end offsets of topic 'events': timed out")

    got = lag_report("events", refuse, {0: 3}, metrics={"endOfStream": "false"})
    assert "offsets" not in got
    assert got["metrics"] == {"endOfStream": "false",
                              "latestOffsetsError": "cannot list the end offsets of topic 'events': timed out"}
    asked: list[list[int]] = []

    def answer(partitions: list[int]) -> dict[int, int]:
        asked.append(partitions)
        return {p: 10 for p in partitions}

    got = lag_report("events", answer, {1: 4, 0: 10})
    assert asked == [[0, 1]] and got["offsets"] == {"0": 10, "1": 10}
    assert got["metrics"]["maxOffsetsBehindLatest"] == "6"
