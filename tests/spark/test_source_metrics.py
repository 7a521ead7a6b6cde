"""Metrics in Spark's channels, on a real broker and SparkSession.

* Every ``StreamingQueryProgress`` of a ``controlmsg`` stream carries the source's latest offsets, its lag
  behind them under the Kafka connector's names, and (intermediate topic) its upstream tasks, in
  ``sources[i].latestOffset`` (:mod:`controlmsg.spark.reading.source_metrics`: Spark gives a Python source no
  ``metrics`` map).
* Spark's own per-query gauge ``eventTime-watermark``, scraped from Spark's Prometheus endpoint of a session
  of its own (UI on a free port), is the reconciled watermark of a query on
  :func:`~controlmsg.spark.with_watermark`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession

from controlmsg.spark import source_metrics
from tests.spark.helpers import options
from tests.spark.test_event_time import SCHEMA, Upstream, at, wait_for
from tests.spark.test_plain_topic import plain, produce

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]


def end_offsets(config: dict[str, Any], topic: str, partitions: int) -> dict[str, int]:
    consumer = Consumer({**config, "group.id": "test-end-offsets", "isolation.level": "read_committed"})
    try:
        return {str(p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def test_each_progress_of_an_intermediate_topic_carries_its_lag_and_its_upstream(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """Three upstream tasks: fast-0 ends, fast-1 is at minute 180, slow at 120 holds the watermark back.
    Read 40 of the 60 records per trigger: the first micro-batch lags behind the latest offsets, the last
    one, with everything read (commit markers after the last records included), lags by nothing."""
    topic = new_topic(2)
    up = Upstream(kafka_config, topic)
    try:
        for task in ("fast-0", "fast-1", "slow"):
            up.records(task, range(0, 60, 3))
        up.watermark("fast-0", 180)
        up.writers["fast-0"].send_end_of_stream()
        up.writers["fast-0"].flush()
        up.watermark("fast-1", 180)
        up.watermark("slow", 120)
    finally:
        for w in up.writers.values():
            w.close()
    query = (spark.readStream.format("controlmsg")
             .options(**options(topic, bootstrap_servers, timeout="300", maxOffsetsPerTrigger="40")).schema(SCHEMA)
             .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="100 milliseconds").start())
    latest = end_offsets(kafka_config, topic, 2)
    try:
        def caught_up() -> bool:
            last = source_metrics(query.lastProgress or {}).get(topic, {})
            return last.get("maxOffsetsBehindLatest") == "0" and last.get("watermark") == str(at(120))
        wait_for(caught_up, 120, "a progress with everything read")
        progress = list(query.recentProgress)
    finally:
        query.stop()
    reports = [json.loads(s["latestOffset"]) if isinstance(s["latestOffset"], str) else s["latestOffset"]
               for p in progress for s in p["sources"]]
    assert all(r["source"] == "controlmsg" and r["topic"] == topic for r in reports)
    assert reports[-1]["offsets"] == latest, "the latest offsets are the partitions' end offsets"
    metrics = [source_metrics(p)[topic] for p in progress]
    assert int(metrics[0]["maxOffsetsBehindLatest"]) > 0, "40 of 60 records per trigger: the first one lags"
    assert [int(m["maxOffsetsBehindLatest"]) for m in metrics] == sorted(
        (int(m["maxOffsetsBehindLatest"]) for m in metrics), reverse=True), "the lag shrinks as the query reads"
    last = metrics[-1]
    assert last == {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "0.0",
                    "upstreamTasksEnded": "1", "upstreamTasksExpected": "3", "upstreamTasksNotHeardFrom": "0",
                    "endOfStream": "false", "watermark": str(at(120)), "watermarkHeldBackBy": "slow",
                    "watermarkHeldBackOnPartition": "0", "watermarkHeldBackAt": str(at(120))}
    assert all(p["sources"][0]["metrics"] == {} for p in progress), "Spark gives a Python source no metrics map"


def test_each_progress_of_a_plain_topic_carries_its_lag(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str],
        tmp_path: Path) -> None:
    topic = new_topic(3)
    produce(kafka_config, topic, range(60), partitions=3)
    query = (spark.readStream.format("controlmsg").options(**plain(topic, bootstrap_servers, maxOffsetsPerTrigger="30"))
             .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert not query.isActive and query.exception() is None
        progress = list(query.recentProgress)
    finally:
        query.stop()
    lags = [int(source_metrics(p)[topic]["maxOffsetsBehindLatest"]) for p in progress]
    assert lags[0] == 10 and lags[-1] == 0, lags  # 20 per partition, 10 per partition and trigger
    assert sum(p["numInputRows"] for p in progress) == 60


# ------------------------------------------------------------------------------- Spark's Prometheus gauge


def test_the_reconciled_watermark_is_sparks_event_time_watermark_gauge(
        bootstrap_servers: str, kafka_config: dict[str, Any], new_topic: Callable[..., str], tmp_path: Path) -> None:
    """A driver of its own (a UI and a metrics system of its own: the test session has neither) runs an
    hourly window count on ``with_watermark`` with ``spark.sql.streaming.metricsEnabled`` and Spark's
    PrometheusServlet, and scrapes ``/metrics/prometheus`` once its progress shows the reconciled
    watermark: the query's ``eventTime-watermark`` gauge is that watermark, in epoch ms."""
    topic = new_topic(2)
    up = Upstream(kafka_config, topic)
    try:
        for task in ("fast-0", "fast-1", "slow"):
            up.records(task, range(0, 130, 7))
        up.watermark("fast-0", 180)
        up.watermark("fast-1", 180)
        up.watermark("slow", 120)
    finally:
        for w in up.writers.values():
            w.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.metrics_driver", "--topic", topic, "--servers", bootstrap_servers,
         "--watermark", str(at(120)), "--checkpoint", str(tmp_path / "ck")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    scraped = json.loads(done.stdout.strip().splitlines()[-1])
    text = scraped["prometheus"]
    # spark.metrics.namespace "controlmsg", the driver, the query's metrics source "spark.streaming.hourly"
    name = 'metrics_controlmsg_driver_spark_streaming_hourly_eventTime_watermark_Number{type="gauges"}'
    gauge = [line for line in text.splitlines() if line.startswith(name + " ")]
    assert gauge, f"no {name} in:\n{text[:3000]}"
    assert float(gauge[0].split()[-1]) == at(120), gauge
    assert scraped["sourceWatermark"] == str(at(120)), "the source's own report says the same"
