"""The streaming ingest job on Spark: long-running tasks over a raw source topic, bounded by the source's
end offsets at start, read back through the batch data source: every event once, every task ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.generate import GeneratorConfig, generate
from spark_jobs.runtime import ingest as stream_ingest
from tests.spark.helpers import read


def test_stream_ingest_until_source_end(spark: SparkSession, kafka_config: dict[str, Any], bootstrap_servers: str,
                                        new_topic: Callable[..., str]) -> None:
    source = new_topic(4, prefix="raw")
    generate(kafka_config, source, GeneratorConfig(events=5000, rate=1e6, keys=50, start_ms=1_767_225_600_000,
                                                   speedup=60.0, seed=2))
    topic = f"{source}-events"
    args = stream_ingest.build_parser().parse_args(
        ["--source-topic", source, "--topic", topic, "--key", "user", "--event-time", "event_time",
         "--tasks", "2", "--partitions", "3", "--until-source-end", "--watermark-interval", "200ms",
         "--run-id", "s1", "--timeout", "60"])
    summary = stream_ingest.run(spark, args, {"bootstrap.servers": bootstrap_servers})
    assert summary["rows_out"] == 5000 and summary["rejects"] == 0
    assert all(task["ended"] for task in summary["tasks"])
    rows = read(spark, topic, bootstrap_servers, "s1", schema="key string, event_ms long, id string").collect()
    assert len(rows) == 5000 and len({r["id"] for r in rows}) == 5000
    assert all(r["key"].startswith("user-") and r["event_ms"] > 1_767_225_000_000 for r in rows)
