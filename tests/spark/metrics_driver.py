"""A Spark driver of its own for ``test_source_metrics``: a session with its UI on a free port, Spark's
streaming metrics and its PrometheusServlet on, runs an hourly window count on
:func:`~controlmsg.spark.with_watermark` (query name ``hourly``) until its progress shows ``--watermark``,
scrapes ``/metrics/prometheus`` and prints one JSON line: ``{"prometheus": <text>, "sourceWatermark": ...}``
(the source's own report of the watermark, from the same progress). Exits 1 when the watermark does not
come within ``--wait`` seconds."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from datetime import UTC, datetime

from pyspark.sql import functions as F

from controlmsg.clusters.processes import free_ports
from controlmsg.spark import source_metrics, spark_session, with_watermark
from tests.spark.helpers import options
from tests.spark.test_event_time import SCHEMA

# Spark's own metrics: the per-query gauges (spark.streaming.<query>.*) and the servlet that serves them.
METRICS_CONF = {
    "spark.sql.streaming.metricsEnabled": "true",
    "spark.ui.prometheus.enabled": "true",
    "spark.metrics.conf.*.sink.prometheusServlet.class": "org.apache.spark.metrics.sink.PrometheusServlet",
    "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
    "spark.metrics.namespace": "controlmsg",  # in place of the application id, in every metric's name
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--watermark", type=int, required=True, help="epoch ms to wait for")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--wait", type=float, default=120.0)
    args = parser.parse_args()
    port = free_ports()
    spark = spark_session("local[2]", app_name="controlmsg-metrics",
                          conf={**METRICS_CONF, "spark.ui.enabled": "true", "spark.ui.port": str(port),
                                "spark.port.maxRetries": "0"})
    spark.sparkContext.setLogLevel("ERROR")
    events = (spark.readStream.format("controlmsg").options(**options(args.topic, args.servers, timeout="300"))
              .schema(SCHEMA).load())
    query = (with_watermark(events, "ts").groupBy(F.window("ts", "1 hour"), "user").count()
             .writeStream.queryName("hourly").outputMode("append").format("noop")
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="200 milliseconds").start())
    want = datetime.fromtimestamp(args.watermark / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    deadline = time.monotonic() + args.wait
    try:
        while True:
            progress = query.lastProgress
            if progress is not None and progress["eventTime"].get("watermark") == want:
                break
            if time.monotonic() > deadline or not query.isActive:
                print(f"no progress with the watermark {want}: {progress}", file=sys.stderr)
                return 1
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics/prometheus", timeout=30) as answer:
            text = answer.read().decode()
        reported = source_metrics(progress).get(args.topic, {}).get("watermark")
        print(json.dumps({"prometheus": text, "sourceWatermark": reported}))
        return 0
    finally:
        query.stop()
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
