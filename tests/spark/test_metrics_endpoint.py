"""controlmsg's metrics endpoint on a real SparkSession: ``serve_metrics(spark, port)``, one line, and a
streaming query on ``with_watermark`` over a real intermediate topic; the endpoint is scraped with urllib
while the query runs and parsed with prometheus-client's own parser."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from controlmsg.spark import serve_metrics, source_metrics, with_watermark
from controlmsg.spark.metrics import stop_metrics
from tests.spark.test_event_time import Upstream, at, stream, wait_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.beside]  # the second lane of make test

Scraped = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> tuple[dict[str, str], Scraped]:
    """The families' types by name, and every sample by (name, sorted labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    types: dict[str, str] = {}
    samples: Scraped = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def test_the_endpoint_serves_the_watermark_the_upstream_the_holding_task_and_the_late_rows(
        spark: SparkSession, bootstrap_servers: str, kafka_config: dict[str, Any],
        new_topic: Callable[..., str], tmp_path: Path) -> None:
    """Three upstream tasks on two partitions: fast-0 and fast-1 at minute 180, slow at 120. While the query
    runs, the endpoint's watermark is the reconciled one (minute 120, in seconds), Spark's watermark of the
    query the same, slow holds it back, 0 of 3 tasks ended. Then fast-0 writes a record behind its own
    promise (late) and every task ends: the endpoint says end of stream, 3 of 3 ended, 1 late row."""
    topic = new_topic(2)
    up = Upstream(kafka_config, topic)
    server = serve_metrics(spark, 0, "127.0.0.1")
    url = server.url()
    query = None
    try:
        assert serve_metrics(spark, 0) is server, "one endpoint per session"
        for task in ("fast-0", "fast-1", "slow"):
            up.records(task, range(0, 130, 7))
        up.watermark("fast-0", 180)
        up.watermark("fast-1", 180)
        up.watermark("slow", 120)
        query = (with_watermark(stream(spark, topic, bootstrap_servers), "ts").groupBy(F.window("ts", "1 hour"), "user")
                 .count().writeStream.queryName("hourly").outputMode("append").format("noop")
                 .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds")
                 .start())
        src = (("query", "hourly"), ("topic", topic))
        last: list[Scraped] = [{}]

        def scraped(condition: Callable[[Scraped], bool]) -> Callable[[], bool]:
            def check() -> bool:
                assert query is not None and query.isActive, query.exception() if query else None
                last[0] = scrape(url)[1]
                return condition(last[0])
            return check

        wait_for(scraped(lambda s: s.get(("controlmsg_watermark_seconds", src)) == at(120) / 1000
                         and s.get(("controlmsg_query_watermark_seconds", (("query", "hourly"),))) == at(120) / 1000),
                 180, "the reconciled watermark on the endpoint, and Spark's")
        running = last[0]
        assert running[("controlmsg_upstream_tasks_ended", src)] == 0
        assert running[("controlmsg_upstream_tasks_expected", src)] == 3
        assert running[("controlmsg_upstream_tasks_not_heard_from", src)] == 0
        assert running[("controlmsg_end_of_stream", src)] == 0
        holders = {k: v for k, v in running.items() if k[0] == "controlmsg_watermark_held_back_info"}
        assert list(holders) == [("controlmsg_watermark_held_back_info",
                                  tuple(sorted([*src, ("upstream_task", "slow"), ("partition", "0")])))], holders
        assert ("controlmsg_lag_records", src) in running
        reported = source_metrics(query.lastProgress or {})[topic]
        assert reported["watermark"] == str(at(120)), "the endpoint says what the progress says"

        up.records("fast-0", range(100, 101), late=True)  # fast-0 promised 180: a late record
        up.end()
        wait_for(scraped(lambda s: s.get(("controlmsg_end_of_stream", src)) == 1), 180,
                 "the end of stream on the endpoint")
        types, ended = scrape(url)
    finally:
        if query is not None:
            query.stop()
        for w in up.writers.values():
            w.close()
        stop_metrics(spark)
    assert ended[("controlmsg_upstream_tasks_ended", src)] == ended[("controlmsg_upstream_tasks_expected", src)] == 3
    assert ended[("controlmsg_lag_records", src)] == 0
    assert ended[("controlmsg_watermark_seconds", src)] == at(120) / 1000, "the last watermark stays at the end"
    assert not [k for k in ended if k[0] == "controlmsg_watermark_held_back_info"], "no task holds it back now"
    assert ended[("controlmsg_late_records_total", (("observation", "controlmsg"), ("query", "hourly")))] == 1
    assert types == {"controlmsg_watermark_seconds": "gauge", "controlmsg_query_watermark_seconds": "gauge",
                     "controlmsg_lag_records": "gauge", "controlmsg_upstream_tasks_ended": "gauge",
                     "controlmsg_upstream_tasks_expected": "gauge", "controlmsg_upstream_tasks_not_heard_from": "gauge",
                     "controlmsg_end_of_stream": "gauge", "controlmsg_late_records": "counter"}
    with pytest.raises(OSError):
        scrape(url)  # stop_metrics freed the port
