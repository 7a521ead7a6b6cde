"""controlmsg's metrics in Prometheus' text format, for both engines (docs/OPERATIONS.md, "Metrics").

The names and what makes them (:mod:`controlmsg.metrics.samples`, pure), the latest samples of a process and
the collector that serves them (:mod:`controlmsg.metrics.board`), and the HTTP endpoint with the reports that
fill it from the runtime's tasks (:mod:`controlmsg.metrics.server`). The engines turn them on in one line:
``controlmsg.spark.serve_metrics(spark, port)`` for Spark stages, ``--metrics-port`` for the runtime's jobs.

prometheus-client (``pip install 'controlmsg[metrics]'``) is imported only when an endpoint starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlmsg.lazy import lazy_getattr

if TYPE_CHECKING:
    from controlmsg.metrics.board import EXTRA, Board
    from controlmsg.metrics.samples import METRICS, Sample, source_samples, upstream_samples
    from controlmsg.metrics.server import MetricsServer, Reporter, serve

__all__ = ["EXTRA", "METRICS", "Board", "MetricsServer", "Reporter", "Sample", "serve", "source_samples",
           "upstream_samples"]

_WHERE = {
    "EXTRA": "controlmsg.metrics.board",
    "Board": "controlmsg.metrics.board",
    "METRICS": "controlmsg.metrics.samples",
    "Sample": "controlmsg.metrics.samples",
    "source_samples": "controlmsg.metrics.samples",
    "upstream_samples": "controlmsg.metrics.samples",
    "MetricsServer": "controlmsg.metrics.server",
    "Reporter": "controlmsg.metrics.server",
    "serve": "controlmsg.metrics.server",
}

__getattr__ = lazy_getattr(__name__, _WHERE)
