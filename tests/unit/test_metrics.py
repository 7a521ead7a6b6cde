"""controlmsg's metrics: the pure mapping from what a reader reports to samples, both engines' mappings
agreeing, the listener's sums, and the endpoint (a real HTTP server on a free port, scraped with urllib and
parsed with prometheus-client's own parser)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from controlmsg.core.bookkeeping import InputTracker
from controlmsg.core.messages import MAX_TIMESTAMP, EndOfStreamMessage, WatermarkMessage
from controlmsg.core.progress import upstream_progress
from controlmsg.metrics.board import Board
from controlmsg.metrics.samples import METRICS, Kind, Sample, labels_of, source_samples, upstream_samples
from controlmsg.metrics.server import Reporter, serve
from controlmsg.spark.metrics import MetricsListener, progress_samples
from controlmsg.spark.reading.source_metrics import upstream_metrics
from controlmsg.streaming.task_metrics import ingest_samples, window_samples

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600_000
LABELS = labels_of(query="hourly", topic="events")


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        out[f"{family.name} {family.type}"] = [(s.name, s.labels, s.value) for s in family.samples]
    return out


def test_an_intermediate_topics_report_maps_to_the_upstream_gauges_in_seconds() -> None:
    report = {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "12", "avgOffsetsBehindLatest": "6.0",
              "upstreamTasksEnded": "1", "upstreamTasksExpected": "3", "upstreamTasksNotHeardFrom": "0",
              "endOfStream": "false", "watermark": str(T0), "watermarkHeldBackBy": "ingest-r1-p2",
              "watermarkHeldBackOnPartition": "0", "watermarkHeldBackAt": str(T0)}
    assert source_samples(report, LABELS) == [
        Sample("controlmsg_watermark_seconds", LABELS, T0 / 1000),
        Sample("controlmsg_lag_records", LABELS, 12.0),
        Sample("controlmsg_upstream_tasks_ended", LABELS, 1),
        Sample("controlmsg_upstream_tasks_expected", LABELS, 3),
        Sample("controlmsg_upstream_tasks_not_heard_from", LABELS, 0),
        Sample("controlmsg_end_of_stream", LABELS, 0.0),
        Sample("controlmsg_watermark_held_back_info",
               (*LABELS, ("upstream_task", "ingest-r1-p2"), ("partition", "0")), 1.0),
    ]


def test_what_a_report_leaves_out_gives_no_sample() -> None:
    """A plain topic's lag alone; an undefined watermark, an unknown task count: nothing, never a 0."""
    assert source_samples({"maxOffsetsBehindLatest": "4"}, LABELS) == [Sample("controlmsg_lag_records", LABELS, 4.0)]
    assert source_samples({"latestOffsetsError": "timed out"}, LABELS) == []


def test_the_watermark_at_end_of_stream_is_plus_infinity() -> None:
    assert source_samples({"watermark": str(MAX_TIMESTAMP)}, LABELS) == [
        Sample("controlmsg_watermark_seconds", LABELS, math.inf)]


def test_a_sample_of_a_name_not_in_the_catalogue_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of controlmsg's metrics"):
        Sample("controlmsg_watermark_ms", LABELS, 1.0)


def test_the_names_follow_prometheus_conventions() -> None:
    for name, spec in METRICS.items():
        assert name.startswith("controlmsg_") and "_ms" not in name and name == name.lower()
        assert name.endswith("_total") == (spec.kind is Kind.COUNTER), name
        assert spec.help


_message = st.tuples(st.sampled_from([0, 1]), st.sampled_from(["up-p0", "up-p1", "up-p2"]),
                     st.one_of(st.integers(0, 10**6), st.none()))


@given(st.lists(_message, max_size=30))
def test_both_engines_give_the_same_samples_for_the_same_bookkeeping(
        messages: list[tuple[int, str, int | None]]) -> None:
    """The runtime maps a reader's bookkeeping (``upstream_samples``), a Spark stage the strings its source
    reported of the same bookkeeping (``source_samples``): the same samples, whatever the upstream did."""
    tracker = InputTracker([0, 1], run_id="r")
    for partition, task, ts in messages:
        message = (EndOfStreamMessage(task_name=task, task_count=3, run_id="r") if ts is None
                   else WatermarkMessage(task_name=task, task_count=3, timestamp=T0 + ts, run_id="r"))
        tracker.on_control(partition, message)
    assert upstream_samples(upstream_progress(tracker), LABELS) == source_samples(upstream_metrics(tracker), LABELS)


def _progress(topic: str, metrics: dict[str, str], **more: object) -> dict[str, object]:
    latest = {"source": "controlmsg", "topic": topic, "offsets": {"0": 10}, "metrics": metrics}
    return {"id": "4f0c", "name": None, "sources": [{"latestOffset": json.dumps(latest), "metrics": {}}], **more}


def test_a_progress_gives_a_group_per_source_and_sparks_watermark_per_query() -> None:
    progress = _progress("events", {"maxOffsetsBehindLatest": "2"},
                         eventTime={"watermark": "2026-01-01T01:00:00.000Z"})
    assert progress_samples(progress) == {
        ("source", "4f0c", "events"): [Sample("controlmsg_lag_records", labels_of(query="4f0c", topic="events"), 2.0)],
        ("query", "4f0c"): [Sample("controlmsg_query_watermark_seconds", labels_of(query="4f0c"),
                                   (T0 + 3_600_000) / 1000)],
    }
    assert progress_samples({"id": "x", "name": "q", "sources": []}) == {}


def test_the_listener_adds_up_the_late_rows_of_each_observation() -> None:
    board = Board()
    listener = MetricsListener(board)
    for late in (2, 0, 5):
        listener.take({**_progress("events", {}), "name": "hourly",
                       "observedMetrics": {"controlmsg": {"late_rows": late, "watermark_rows": 1},
                                           "mine": {"rows": 3}}})
    totals = [s for s in board.samples() if s.name == "controlmsg_late_records_total"]
    assert totals == [Sample("controlmsg_late_records_total", labels_of(query="hourly", observation="controlmsg"), 7)]


def test_the_endpoint_serves_the_board_and_takes_task_reports() -> None:
    board = Board()
    server = serve(board, 0, "127.0.0.1", accept_reports=True)
    try:
        url = server.url()
        assert _families(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()) == {}
        reporter = Reporter(url, ["stream_window", "0"], "test")
        first = labels_of(stage="stream_window", task=0, topic="events")
        assert reporter.report([Sample("controlmsg_watermark_seconds", first, 1767225600.0),
                                Sample("controlmsg_watermark_held_back_info", (*first, ("upstream_task", "a")), 1),
                                Sample("controlmsg_late_records_total", first, 3)])
        scraped = _families(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
        assert scraped == {
            "controlmsg_watermark_seconds gauge": [("controlmsg_watermark_seconds", dict(first), 1767225600.0)],
            "controlmsg_watermark_held_back_info gauge": [
                ("controlmsg_watermark_held_back_info", {**dict(first), "upstream_task": "a"}, 1.0)],
            "controlmsg_late_records counter": [("controlmsg_late_records_total", dict(first), 3.0)],
        }
        # a report replaces the group's samples: a task no longer holding the watermark back is gone
        assert reporter.report([Sample("controlmsg_watermark_seconds", first, 1767225660.0)])
        scraped = _families(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
        assert scraped == {
            "controlmsg_watermark_seconds gauge": [("controlmsg_watermark_seconds", dict(first), 1767225660.0)]}
        bad = urllib.request.Request(url + "/report", data=b'{"group": ["x"], "samples": [["nope", [], 1]]}',
                                     method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=10)
        assert refused.value.code == 400
    finally:
        server.close()


def test_an_endpoint_without_reports_refuses_them_and_a_failed_report_never_raises(
        capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(Board(), 0, "127.0.0.1")
    reporter = Reporter(server.url(), ["g"], "task 0")
    try:
        assert not reporter.report([])
    finally:
        server.close()
    assert not reporter.report([])  # nothing listens there now: said once only
    err = capsys.readouterr().err
    assert err.count("task 0: metrics not reported") == 1 and "405" in err, err


BLOCKED = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "prometheus_client":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, Blocker())
from controlmsg.metrics import Board, serve
try:
    serve(Board(), 0)
except ModuleNotFoundError as exc:
    print(exc)
"""


def test_without_the_client_library_it_refuses_in_one_line_naming_the_extra() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCKED], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == ("controlmsg's metrics need prometheus-client, which is not installed: "
                           "pip install 'controlmsg[metrics]'\n")


def test_a_runtime_tasks_samples_name_the_topic_each_value_is_about() -> None:
    """The window task's upstream, lag, records and late records are about its input, its own watermark
    about its output; an ingest task without a lag yet has no lag sample."""
    tracker = InputTracker([0], run_id="r")
    tracker.on_control(0, WatermarkMessage(task_name="up-p0", task_count=1, timestamp=T0, run_id="r"))
    into = labels_of(stage="stream_window", task=1, topic="in")
    samples = window_samples(1, "in", "out", upstream_progress(tracker), lag=3, records=10, late=2,
                             output_watermark=T0)
    assert Sample("controlmsg_watermark_seconds", into, T0 / 1000) in samples
    assert Sample("controlmsg_lag_records", into, 3) in samples
    assert Sample("controlmsg_late_records_total", into, 2) in samples
    assert samples[-1] == Sample("controlmsg_output_watermark_seconds",
                                 labels_of(stage="stream_window", task=1, topic="out"), T0 / 1000)
    assert ingest_samples(0, "src", "out", lag=None, records=4, output_watermark=None) == [
        Sample("controlmsg_records_total", labels_of(stage="stream_ingest", task=0, topic="src"), 4)]


def test_the_runtime_jobs_and_the_stages_take_a_metrics_port() -> None:
    from spark_jobs.runtime import ingest, window
    from spark_jobs.stages import sink as stage_sink

    argv = ["--input-topic", "a", "--output-topic", "b", "--window", "1m", "--bootstrap-servers", "127.0.0.1:1",
            "--run-id", "r1"]
    assert window.check_arguments(window.build_parser().parse_args([*argv, "--metrics-port", "9464"])) == []
    assert window.check_arguments(window.build_parser().parse_args([*argv, "--metrics-port", "70000"])) == [
        "--metrics-port 70000: must be between 0 and 65535"]
    assert "--metrics-port PORT" in ingest.build_parser().format_help()
    stage = stage_sink.build_parser().parse_args(["--input-topic", "w", "--output", "o", "--checkpoint", "c",
                                                  "--run-id", "r1", "--metrics-port", "-1"])
    assert stage_sink.check_arguments(stage) == ["--metrics-port -1: must be between 0 and 65535"]
