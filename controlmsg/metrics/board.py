"""The latest samples of a process, and the Prometheus collector that serves them.

A :class:`Board` holds, per *group* (one source of one query, one task of a runtime job), the samples that
group last reported, and replaces them whole at each report: a label set a group no longer reports (an
upstream task that stopped holding the watermark back) goes at once. :func:`collector` turns the board into
Prometheus' metric families at each scrape (prometheus-client, imported here only when metrics are turned
on: :func:`prometheus_client_module` refuses in one line without it).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Final

from controlmsg.metrics.samples import METRICS, Kind, Sample

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["EXTRA", "Board", "collector", "prometheus_client_module", "registry"]

EXTRA: Final = "pip install 'controlmsg[metrics]'"
"""What installs the client library the metrics need."""


def prometheus_client_module() -> ModuleType:
    """``prometheus_client``; raises ``ModuleNotFoundError`` in one line naming :data:`EXTRA` without it."""
    try:
        import prometheus_client
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(f"controlmsg's metrics need prometheus-client, which is not installed: {EXTRA}",
                                  name="prometheus_client") from exc
    return prometheus_client


class Board:
    """The latest samples, by group. Thread-safe: Spark's listener thread and the HTTP server's threads
    share it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[Hashable, tuple[Sample, ...]] = {}

    def put(self, group: Hashable, samples: Iterable[Sample]) -> None:
        """Replace ``group``'s samples with ``samples``."""
        found = tuple(samples)
        with self._lock:
            self._groups[group] = found

    def samples(self) -> list[Sample]:
        """Every group's samples, groups in the order they first reported."""
        with self._lock:
            return [s for group in self._groups.values() for s in group]


def _families(samples: Iterable[Sample]) -> Iterator[Metric]:
    from prometheus_client.metrics_core import Metric

    by_name: dict[str, list[Sample]] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    for name, spec in METRICS.items():
        found = by_name.get(name)
        if not found:
            continue
        family = Metric(name.removesuffix("_total") if spec.kind is Kind.COUNTER else name, spec.help,
                        spec.kind.value)
        for sample in found:
            family.add_sample(name, dict(sample.labels), sample.value)
        yield family


def collector(board: Board) -> Collector:
    """A Prometheus collector that serves ``board``'s samples as they are at each scrape, in the order of
    :data:`~controlmsg.metrics.samples.METRICS`."""
    from prometheus_client.registry import Collector

    class _BoardCollector(Collector):
        def collect(self) -> Iterable[Metric]:
            return list(_families(board.samples()))

        def describe(self) -> Iterable[Metric]:
            return []  # nothing to check at registration: the board may be empty yet

    return _BoardCollector()


def registry(board: Board) -> CollectorRegistry:
    """A fresh ``CollectorRegistry`` with ``board``'s :func:`collector` alone in it (Python's process metrics
    are not controlmsg's to serve: a team's own client serves them)."""
    prometheus_client_module()
    from prometheus_client import CollectorRegistry

    out = CollectorRegistry(auto_describe=False)
    out.register(collector(board))
    return out
