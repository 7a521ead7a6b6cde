"""The metrics controlmsg serves, and what makes them from what a reader reports. Pure: no I/O, no clock, no
client library; :mod:`controlmsg.metrics.board` turns samples into Prometheus' families.

One catalogue (:data:`METRICS`) for both engines, named by Prometheus' conventions: a ``controlmsg_`` prefix,
base units (seconds, not milliseconds), ``_total`` on counters, ``_info`` on the gauge whose labels are the
value. A Spark stage's samples carry the labels ``query`` and ``topic``, the streaming runtime's ``stage``,
``task`` and ``topic`` (docs/OPERATIONS.md, "Metrics"). ``job`` is never a label: Prometheus sets it on
every scraped series.

:func:`source_samples` reads the strings a ``controlmsg`` stream reader puts in each progress (the names of
:func:`controlmsg.spark.reading.source_metrics.source_metrics`); :func:`upstream_samples` reads an
:class:`~controlmsg.core.progress.UpstreamProgress` (the runtime's tasks). Both give the same samples for
the same state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from controlmsg.core.messages import MAX_TIMESTAMP, MIN_TIMESTAMP
from controlmsg.core.progress import UpstreamProgress

__all__ = [
    "END_OF_STREAM",
    "HOLDER_INFO",
    "LAG_RECORDS",
    "LATE_RECORDS",
    "METRICS",
    "OUTPUT_WATERMARK",
    "QUERY_WATERMARK",
    "RECORDS",
    "TASKS_ENDED",
    "TASKS_EXPECTED",
    "TASKS_NOT_HEARD_FROM",
    "WATERMARK",
    "Kind",
    "MetricSpec",
    "Sample",
    "labels_of",
    "seconds",
    "source_samples",
    "upstream_samples",
]


class Kind(Enum):
    """A metric's Prometheus type."""

    GAUGE = "gauge"
    COUNTER = "counter"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its type and its HELP text."""

    kind: Kind
    help: str


WATERMARK: Final = "controlmsg_watermark_seconds"
QUERY_WATERMARK: Final = "controlmsg_query_watermark_seconds"
OUTPUT_WATERMARK: Final = "controlmsg_output_watermark_seconds"
LAG_RECORDS: Final = "controlmsg_lag_records"
TASKS_ENDED: Final = "controlmsg_upstream_tasks_ended"
TASKS_EXPECTED: Final = "controlmsg_upstream_tasks_expected"
TASKS_NOT_HEARD_FROM: Final = "controlmsg_upstream_tasks_not_heard_from"
END_OF_STREAM: Final = "controlmsg_end_of_stream"
HOLDER_INFO: Final = "controlmsg_watermark_held_back_info"
LATE_RECORDS: Final = "controlmsg_late_records_total"
RECORDS: Final = "controlmsg_records_total"

METRICS: Final[Mapping[str, MetricSpec]] = {
    WATERMARK: MetricSpec(Kind.GAUGE, "The reconciled watermark of the input topic, Unix seconds (absent until every "
                          "upstream task has reported; it stays at its last value when the stream ends: see "
                          "controlmsg_end_of_stream)"),
    QUERY_WATERMARK: MetricSpec(Kind.GAUGE, "Spark's event-time watermark of the query, Unix seconds (on "
                                "with_watermark: the reconciled watermark, 253402300799.999 once the stream "
                                "ended; 0 before the first; absent for a query without one)"),
    OUTPUT_WATERMARK: MetricSpec(Kind.GAUGE, "The last watermark the task wrote to its output topic, Unix seconds"),
    LAG_RECORDS: MetricSpec(Kind.GAUGE, "Offsets the reader is behind the end (last stable) offset, on the "
                            "partition furthest behind; 0 on a partition whose end of stream was read"),
    TASKS_ENDED: MetricSpec(Kind.GAUGE, "Upstream tasks whose end of stream arrived on every partition read"),
    TASKS_EXPECTED: MetricSpec(Kind.GAUGE, "Upstream tasks of the run (absent until a control message said it)"),
    TASKS_NOT_HEARD_FROM: MetricSpec(Kind.GAUGE, "The most upstream tasks not yet heard from on any one partition "
                                     "(the watermark stays undefined while any is)"),
    END_OF_STREAM: MetricSpec(Kind.GAUGE, "1 once every upstream task ended on every partition read, else 0"),
    HOLDER_INFO: MetricSpec(Kind.GAUGE, "1, labelled with the upstream task whose watermark holds the reconciled "
                            "watermark back and the partition it does so on; absent when no task does"),
    LATE_RECORDS: MetricSpec(Kind.COUNTER, "Records behind the watermark, kept out of the windows (Spark: "
                             "with_watermark's late_rows; the runtime: its late topic)"),
    RECORDS: MetricSpec(Kind.COUNTER, "Records the task read and took (not control messages, not rejects)"),
}
"""Every metric, in the order it is served."""

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one metric of :data:`METRICS`, with its labels (name, value) in order."""

    name: str
    labels: Labels
    value: float

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise ValueError(f"{self.name!r} is not one of controlmsg's metrics")


def labels_of(**labels: str | int) -> Labels:
    """``labels_of(query="q", topic="t")`` -> the labels of a :class:`Sample`, values as text."""
    return tuple((k, str(v)) for k, v in labels.items())


def seconds(ms: int | float) -> float:
    """Epoch milliseconds as Unix seconds; the protocol's infinities (a watermark at end of stream, or before
    anything) as Prometheus' ``+Inf`` and ``-Inf``."""
    if ms >= MAX_TIMESTAMP:
        return math.inf
    if ms <= MIN_TIMESTAMP:
        return -math.inf
    return ms / 1000


def _upstream(labels: Labels, *, watermark: float | None, ended: int | None, expected: int | None,
              unheard: int | None, end_of_stream: bool | None, holder: str | None, holder_partition: str | None,
              lag: float | None) -> list[Sample]:
    out = []
    if watermark is not None:
        out.append(Sample(WATERMARK, labels, seconds(watermark)))
    if lag is not None:
        out.append(Sample(LAG_RECORDS, labels, lag))
    if ended is not None:
        out.append(Sample(TASKS_ENDED, labels, ended))
    if expected is not None:
        out.append(Sample(TASKS_EXPECTED, labels, expected))
    if unheard is not None:
        out.append(Sample(TASKS_NOT_HEARD_FROM, labels, unheard))
    if end_of_stream is not None:
        out.append(Sample(END_OF_STREAM, labels, 1.0 if end_of_stream else 0.0))
    if holder is not None:
        out.append(Sample(HOLDER_INFO, (*labels, ("upstream_task", holder), ("partition", holder_partition or "")),
                          1.0))
    return out


def _number(metrics: Mapping[str, str], key: str) -> float | None:
    text = metrics.get(key)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _count(metrics: Mapping[str, str], key: str) -> int | None:
    found = _number(metrics, key)
    return None if found is None else int(found)


def source_samples(metrics: Mapping[str, str], labels: Labels) -> list[Sample]:
    """The samples of one ``controlmsg`` source's metrics in a progress (``source_metrics(progress)[topic]``):
    what it reports, nothing for what it leaves out (a plain topic has no upstream tasks; a watermark is
    absent while undefined). ``labels`` go on every sample."""
    eos = metrics.get("endOfStream")
    return _upstream(
        labels, watermark=_number(metrics, "watermark"), ended=_count(metrics, "upstreamTasksEnded"),
        expected=_count(metrics, "upstreamTasksExpected"), unheard=_count(metrics, "upstreamTasksNotHeardFrom"),
        end_of_stream=None if eos is None else eos == "true", holder=metrics.get("watermarkHeldBackBy"),
        holder_partition=metrics.get("watermarkHeldBackOnPartition"),
        lag=_number(metrics, "maxOffsetsBehindLatest"))


def upstream_samples(up: UpstreamProgress, labels: Labels, lag: int | None = None) -> list[Sample]:
    """The samples of a reader's bookkeeping summed up (:func:`~controlmsg.core.progress.upstream_progress`),
    as :func:`source_samples` gives them for the same state; ``lag`` the records behind, when known."""
    return _upstream(
        labels, watermark=up.watermark, ended=up.ended_tasks,
        expected=up.task_count, unheard=up.unheard, end_of_stream=up.ended,
        holder=up.holding_task, holder_partition=None if up.holding_partition is None else str(up.holding_partition),
        lag=lag)
