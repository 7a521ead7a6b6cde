"""The streaming runtime's metrics on a real Spark application and broker: a job's driver serves them
(:func:`~controlmsg.streaming.serve_job_metrics`, what a runtime job's ``--metrics-port`` starts), its window
tasks, long-running Spark tasks in Python workers, report to it, and the endpoint is scraped with urllib while
they run and after they ended, and parsed with prometheus-client's own parser."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from controlmsg.clusters.job_group import JobGroup
from controlmsg.clusters.processes import free_ports
from controlmsg.kafka import ControlWriter, create_topic
from controlmsg.streaming import run_long_running_tasks, run_window_task, serve_job_metrics, state_topic_config
from tests.spark.test_event_time import wait_for
from tests.spark.test_metrics_endpoint import Scraped, scrape

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.beside]  # the second lane of make test

ROOT = Path(__file__).resolve().parents[2]
RUN = "r1"
MINUTE = 60_000
T0 = 1_767_225_600_000


def labels(task: int, topic: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"stage": "stream_window", "task": str(task), "topic": topic, **more}.items()))


def test_a_runtime_jobs_driver_serves_what_its_window_tasks_report(
        spark: SparkSession, kafka_config: dict[str, Any], new_topic: Callable[..., str], tmp_path: Path) -> None:
    """Two window tasks, one per partition; three upstream tasks: fast-0 and fast-1 at minute 50, slow at 20.
    While they run each task's endpoint samples say watermark minute 20, held back by slow on its partition,
    0 of 3 upstream tasks ended, and the records it windowed. Then fast-0 sends a record of minute 5 (its
    window closed: late) and every upstream task ends: 3 of 3 ended, end of stream, 1 late record in all."""
    config = kafka_config
    source, output, late = new_topic(2, "rm-in"), new_topic(2, "rm-out"), new_topic(1, "rm-late")
    state = f"rm-state-{uuid.uuid4().hex[:8]}"
    create_topic(config, state, 1, topic_config=state_topic_config({}))
    writers = {name: ControlWriter(config, source, task_name=name, task_count=3, run_id=RUN, data_headers=True)
               for name in ("fast-0", "fast-1", "slow")}
    keys = [f"k{n}" for n in range(8)]
    for name, w in writers.items():
        for m in range(0, 40, 3):
            for key in keys:
                w.send({"key": key, "event_ms": T0 + m * MINUTE + 1, "amount": 1}, key=key)
        w.send_watermark(T0 + (20 if name == "slow" else 50) * MINUTE)
        w.flush()
    sent = len(writers) * len(range(0, 40, 3)) * len(keys)

    server = serve_job_metrics(0, "127.0.0.1")
    url, abort = server.url(), tmp_path / "abort"
    result: dict[str, Any] = {}

    def body(i: int, stopped: Callable[[], bool]) -> dict[str, Any]:
        summary = run_window_task(
            config, input_topic=source, partitions=[i], run_id=RUN, output_topic=output, late_topic=late,
            state_topic=state, task_index=i, task_count=2, window_ms=10 * MINUTE, sums=["amount"],
            commit_interval_s=0.5, stop=lambda: stopped() or abort.exists(), metrics_url=url)
        return {"late": summary.late, "records": summary.records, "ended": summary.ended}

    def run() -> None:
        try:
            result["summaries"] = run_long_running_tasks(spark, 2, body)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        mark = (T0 + 20 * MINUTE) / 1000
        last: list[Scraped] = [{}]

        def every_task(condition: Callable[[Scraped, int], bool]) -> Callable[[], bool]:
            def check() -> bool:
                assert "error" not in result, result["error"]
                last[0] = scrape(url)[1]
                return all(condition(last[0], i) for i in (0, 1))
            return check

        wait_for(every_task(lambda s, i: s.get(("controlmsg_watermark_seconds", labels(i, source))) == mark
                            and s.get(("controlmsg_records_total", labels(i, source)), 0) > 0),
                 240, "both tasks' watermark on the endpoint")
        running = last[0]
        for i in (0, 1):
            assert running[("controlmsg_upstream_tasks_ended", labels(i, source))] == 0
            assert running[("controlmsg_upstream_tasks_expected", labels(i, source))] == 3
            assert running[("controlmsg_end_of_stream", labels(i, source))] == 0
            assert running[("controlmsg_watermark_held_back_info",
                            labels(i, source, upstream_task="slow", partition=str(i)))] == 1
        wait_for(every_task(lambda s, i: s.get(("controlmsg_lag_records", labels(i, source))) is not None), 60,
                 "the lag, once each task's partition was fetched")
        writers["fast-0"].send({"key": "k0", "event_ms": T0 + 5 * MINUTE, "amount": 1}, key="k0")  # late
        for w in writers.values():
            w.send_end_of_stream()
            w.flush()
        thread.join(240)
        assert not thread.is_alive(), "the window tasks did not end"
        assert "error" not in result, result["error"]
        types, ended = scrape(url)
    finally:
        abort.touch()
        thread.join(60)
        server.close()
        for w in writers.values():
            w.close()
    summaries = result["summaries"]
    assert all(s["ended"] for s in summaries)
    for i in (0, 1):
        assert ended[("controlmsg_upstream_tasks_ended", labels(i, source))] == 3
        assert ended[("controlmsg_upstream_tasks_expected", labels(i, source))] == 3
        assert ended[("controlmsg_end_of_stream", labels(i, source))] == 1
        assert ended[("controlmsg_lag_records", labels(i, source))] == 0
        assert ended[("controlmsg_records_total", labels(i, source))] == summaries[i]["records"]
        assert ended[("controlmsg_output_watermark_seconds", labels(i, output))] >= mark
    assert sum(s["records"] for s in summaries) == sent + 1
    assert sum(ended[("controlmsg_late_records_total", labels(i, source))] for i in (0, 1)) == 1
    assert not [k for k in ended if k[0] == "controlmsg_watermark_held_back_info"]
    assert types == {"controlmsg_watermark_seconds": "gauge", "controlmsg_output_watermark_seconds": "gauge",
                     "controlmsg_lag_records": "gauge", "controlmsg_upstream_tasks_ended": "gauge",
                     "controlmsg_upstream_tasks_expected": "gauge", "controlmsg_upstream_tasks_not_heard_from": "gauge",
                     "controlmsg_end_of_stream": "gauge", "controlmsg_late_records": "counter",
                     "controlmsg_records": "counter"}


def test_a_runtime_job_serves_its_metrics_with_one_option(
        kafka_config: dict[str, Any], bootstrap_servers: str, new_topic: Callable[..., str], tmp_path: Path) -> None:
    """``python -m spark_jobs.runtime.window ... --metrics-port PORT``, its own Spark application: its
    driver's endpoint (reached by its tasks at ``spark.driver.host``) has each window task's watermark while
    the job waits for its upstream, then the job ends at the end of stream, exit 0."""
    source, output = new_topic(2, "rm-in"), new_topic(2, "rm-out")
    writer = ControlWriter(kafka_config, source, task_name="up-0", task_count=1, run_id=RUN, data_headers=True)
    for key in ("a", "b", "c", "d"):
        writer.send({"key": key, "event_ms": T0 + MINUTE, "amount": 1}, key=key)
    writer.send_watermark(T0 + 30 * MINUTE)
    writer.flush()
    port = free_ports()
    url = f"http://127.0.0.1:{port}"
    with JobGroup(tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}) as jobs:
        job = jobs.start("stream_window", [
            sys.executable, "-m", "spark_jobs.runtime.window", "--input-topic", source, "--output-topic", output,
            "--window", "10m", "--sum", "amount", "--partitions", "2", "--run-id", RUN, "--master", "local[2]",
            "--bootstrap-servers", bootstrap_servers, "--metrics-port", str(port)])
        try:
            def served() -> bool:
                assert job.running(), job.tail()
                try:
                    scraped = scrape(url)[1]
                except OSError:
                    return False  # the driver is starting
                mark = (T0 + 30 * MINUTE) / 1000
                return all(scraped.get(("controlmsg_watermark_seconds", labels(i, source))) == mark for i in (0, 1))
            wait_for(served, 300, "each window task's watermark on the job's endpoint")
            writer.send_end_of_stream()
            writer.flush()
            assert jobs.wait(300) == {"stream_window": 0}, job.tail()
        finally:
            writer.close()
            jobs.stop(10)
    assert f":{port}/metrics" in (tmp_path / "stream_window.log").read_text(), "the job says where it serves them"
