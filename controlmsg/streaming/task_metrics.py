"""What the runtime's tasks serve as metrics (docs/OPERATIONS.md, "Metrics"): the samples of a window task
and of an ingest task, pure, and where the job's driver serves them.

The tasks run in Spark's Python workers, on executors; each reports its samples to its job's driver
(:class:`~controlmsg.metrics.server.Reporter`, at each progress line and when it returns), which serves every
task's on one endpoint (:func:`serve_job_metrics`). Labels: ``stage`` (``stream_window``, ``stream_ingest``),
``task`` (the logical task's index) and ``topic`` (the topic the value is about: the input for the
upstream, the lag, the records and the late records; the output for the task's own watermark). The names are
the Spark stages' where they mean the same (:mod:`controlmsg.metrics.samples`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from controlmsg.metrics.samples import (
    LAG_RECORDS,
    LATE_RECORDS,
    OUTPUT_WATERMARK,
    RECORDS,
    Sample,
    labels_of,
    seconds,
    upstream_samples,
)

if TYPE_CHECKING:
    from controlmsg.core.progress import UpstreamProgress
    from controlmsg.metrics.server import MetricsServer

__all__ = ["INGEST_STAGE", "WINDOW_STAGE", "ingest_samples", "serve_job_metrics", "window_samples"]

WINDOW_STAGE: Final = "stream_window"
INGEST_STAGE: Final = "stream_ingest"


def window_samples(task: int, input_topic: str, output_topic: str, up: UpstreamProgress, *, lag: int | None,
                   records: int, late: int, output_watermark: int | None) -> list[Sample]:
    """A window task's samples: its input's upstream (as a Spark stage's source gives them) and lag, the
    records it windowed and those late, and the watermark it wrote to its output."""
    into = labels_of(stage=WINDOW_STAGE, task=task, topic=input_topic)
    out = [*upstream_samples(up, into, lag), Sample(RECORDS, into, records), Sample(LATE_RECORDS, into, late)]
    if output_watermark is not None:
        out.append(Sample(OUTPUT_WATERMARK, labels_of(stage=WINDOW_STAGE, task=task, topic=output_topic),
                          seconds(output_watermark)))
    return out


def ingest_samples(task: int, source_topic: str, output_topic: str, *, lag: int | None, records: int,
                   output_watermark: int | None) -> list[Sample]:
    """An ingest task's samples: its lag on the source topic, the records it took, and the watermark it wrote
    to its output."""
    into = labels_of(stage=INGEST_STAGE, task=task, topic=source_topic)
    out = [Sample(RECORDS, into, records)]
    if lag is not None:
        out.insert(0, Sample(LAG_RECORDS, into, lag))
    if output_watermark is not None:
        out.append(Sample(OUTPUT_WATERMARK, labels_of(stage=INGEST_STAGE, task=task, topic=output_topic),
                          seconds(output_watermark)))
    return out


def serve_job_metrics(port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Serve the metrics of a runtime job's tasks on ``host:port`` of its driver (0: a free port), taking the
    tasks' reports there too. Give the tasks ``server.url(driver_host)`` (the driver's address as the
    executors reach it: Spark's ``spark.driver.host``) as their ``metrics_url``. Returns at once; raises
    ``ModuleNotFoundError`` in one line without prometheus-client, ``OSError`` when the port cannot be had."""
    from controlmsg.metrics.board import Board
    from controlmsg.metrics.server import serve

    return serve(Board(), port, host, accept_reports=True)
