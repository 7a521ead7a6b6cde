"""What a ``controlmsg`` stream reader reports in every ``StreamingQueryProgress``: its latest offsets, its
lag behind them, and (intermediate topics) its upstream tasks. No I/O of its own: the readers give the
offsets, and the function that asks the cluster for the end offsets.

**The channel.** Spark's Kafka connector puts ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
``avgOffsetsBehindLatest`` into ``SourceProgress.metrics``; Spark fills that map only for a source that
implements the JVM interface ``ReportsSourceMetrics`` (``ProgressReporter.extractSourceProgress``), and the
JVM side of a Python data source's stream (``PythonMicroBatchStreamWithAdmissionControl`` in pyspark 4.2
and 4.3) implements ``SupportsAdmissionControl`` and ``SupportsTriggerAvailableNow`` but not
``ReportsSourceMetrics``: a Python source's ``metrics`` stays ``{}``, whatever the reader does. What the
Python API does carry is ``DataSourceStreamReader.reportLatestOffset()`` (pyspark 4.2+): Spark calls it
right after ``latestOffset(start, limit)`` at every trigger and shows what it returns, as JSON, in the
progress's ``sources[i].latestOffset``, and nowhere else (it is not written to the offset log). So the
readers return :func:`report` there::

    "latestOffset": {"source": "controlmsg", "topic": "events", "offsets": {"0": 1200, "1": 1188},
                     "metrics": {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "12",
                                 "avgOffsetsBehindLatest": "6.0", "upstreamTasksEnded": "1",
                                 "upstreamTasksExpected": "3", "watermarkHeldBackBy": "ingest-r1-p2", ...}}

``offsets`` has the shape of the reader's own offsets (partition -> next offset): each partition's end
offset (last stable offset, as the ``read_committed`` readers see it) when the micro-batch was planned.
``metrics`` holds strings, as ``SourceProgress.metrics`` does, under the Kafka connector's names where it
has one. :func:`source_metrics` reads them back from a progress, classic or Spark Connect.

The lag is the Kafka connector's: for each partition, its end offset minus where the micro-batch just
planned stops; a partition whose end of stream the reader has reached lags by 0 (what follows is not part of
the run).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from controlmsg.core.bookkeeping import InputTracker

__all__ = ["REPORT_TIMEOUT_S", "SOURCE", "lag_metrics", "lag_report", "report", "source_metrics", "upstream_metrics"]

SOURCE: Final = "controlmsg"
"""The ``source`` field of a :func:`report`: what tells a ``controlmsg`` reader's ``latestOffset`` apart."""
REPORT_TIMEOUT_S: Final = 5.0
"""How long a reader asks for the end offsets of a report: a report never holds a trigger up for long."""


def lag_metrics(consumed: Mapping[int, int], latest: Mapping[int, int],
                caught_up: Iterable[int] = ()) -> dict[str, str]:
    """``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``, ``avgOffsetsBehindLatest`` (formatted as
    the Kafka connector formats them: integers, and the average as a float) over the partitions of
    ``latest``: ``latest[p] - consumed[p]``, at least 0; a partition in ``caught_up`` lags by 0. Empty when
    ``latest`` is."""
    done = set(caught_up)
    behind = [0 if p in done else max(end - consumed.get(p, end), 0) for p, end in latest.items()]
    if not behind:
        return {}
    return {"minOffsetsBehindLatest": str(min(behind)), "maxOffsetsBehindLatest": str(max(behind)),
            "avgOffsetsBehindLatest": str(sum(behind) / len(behind))}


def upstream_metrics(tracker: InputTracker) -> dict[str, str]:
    """An intermediate topic's upstream, from the reader's bookkeeping at the micro-batch's end:
    ``upstreamTasksEnded`` (ended on every partition) and ``upstreamTasksExpected`` (the run's task
    count, once a control message told it), ``upstreamTasksNotHeardFrom`` (the most on any partition),
    ``watermark`` (the reconciled watermark, epoch ms; absent while undefined), ``watermarkHeldBackBy``,
    ``watermarkHeldBackOnPartition`` and ``watermarkHeldBackAt`` (the task with the lowest watermark that
    counts, where, and its watermark in epoch ms), and ``endOfStream``."""
    from controlmsg.core.progress import upstream_progress

    up = upstream_progress(tracker)
    out = {"upstreamTasksEnded": str(up.ended_tasks), "upstreamTasksNotHeardFrom": str(up.unheard),
           "endOfStream": "true" if up.ended else "false"}
    if up.task_count is not None:
        out["upstreamTasksExpected"] = str(up.task_count)
    if up.watermark is not None:
        out["watermark"] = str(up.watermark)
    if up.holding_task is not None:
        out["watermarkHeldBackBy"] = up.holding_task
        out["watermarkHeldBackOnPartition"] = str(up.holding_partition)
        out["watermarkHeldBackAt"] = str(up.holding_watermark)
    return out


def report(topic: str, latest: Mapping[int, int] | None, metrics: Mapping[str, str]) -> dict[str, Any]:
    """What a reader's ``reportLatestOffset`` returns (see the module docstring). ``latest`` ``None``: the
    end offsets could not be had (``metrics`` then says why, under ``latestOffsetsError``)."""
    out: dict[str, Any] = {"source": SOURCE, "topic": topic}
    if latest is not None:
        out["offsets"] = {str(p): o for p, o in sorted(latest.items())}
    out["metrics"] = dict(metrics)
    return out


def lag_report(topic: str, ask: Callable[[list[int]], dict[int, int]], consumed: Mapping[int, int], *,
               caught_up: Iterable[int] = (), metrics: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`report` of ``topic`` with ``metrics`` and the lag of ``consumed`` (partition -> where the
    micro-batch just planned stops) behind the end offsets ``ask(partitions)`` returns. When ``ask`` raises
    a :class:`~controlmsg.errors.ControlMsgError` (the cluster does not answer), the report says so under
    ``latestOffsetsError`` instead of failing the query: Spark asks at every trigger, and a trigger that
    cannot plan fails by itself."""
    from controlmsg.errors import ControlMsgError

    out = dict(metrics or {})
    try:
        latest: dict[int, int] | None = ask(sorted(consumed))
    except ControlMsgError as exc:
        latest = None
        out["latestOffsetsError"] = str(exc)
    if latest is not None:
        out.update(lag_metrics(consumed, latest, caught_up))
    return report(topic, latest, out)


def source_metrics(progress: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The metrics of each ``controlmsg`` source of one ``StreamingQueryProgress`` (an entry of
    ``query.recentProgress``, ``query.lastProgress``, or a listener's ``event.progress``), by topic: the
    lag behind the latest offsets and, for an intermediate topic, its upstream tasks (see the module
    docstring). Works with a classic and a Spark Connect query alike (``latestOffset`` arrives as a JSON
    string or as a parsed object). A progress whose trigger asked no source for its latest offset has
    none: ``{}``."""
    found: dict[str, dict[str, str]] = {}
    for source in progress.get("sources") or []:
        latest = source.get("latestOffset") if hasattr(source, "get") else None
        if isinstance(latest, str):
            try:
                latest = json.loads(latest)
            except ValueError:
                continue
        if isinstance(latest, Mapping) and latest.get("source") == SOURCE:
            metrics = latest.get("metrics")
            found[str(latest.get("topic"))] = {str(k): str(v) for k, v in (metrics or {}).items()}
    return found
