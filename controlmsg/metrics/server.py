"""The HTTP endpoint that serves a :class:`~controlmsg.metrics.board.Board` in Prometheus' text format, and
the reports that fill it from other processes.

:func:`serve` starts a server on a thread of its own: ``GET /metrics`` (or ``/``) is Prometheus' text format
(through prometheus-client's exposition, gzip and OpenMetrics when the scraper asks). With
``accept_reports``, ``PUT /report`` takes a group's samples as JSON (:func:`report_body`): the streaming
runtime's tasks run in Spark's Python workers, on executors, and report to their job's driver, so that a job
has one endpoint, as Spark's own metrics have. :class:`Reporter` is the tasks' side: a report that fails is
said once on stderr and never fails the task.
"""

from __future__ import annotations

import socketserver
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import orjson

from controlmsg.metrics.board import Board, prometheus_client_module, registry
from controlmsg.metrics.samples import Sample

__all__ = ["REPORT_PATH", "REPORT_TIMEOUT_S", "MetricsServer", "Reporter", "parse_report", "report_body", "serve"]

REPORT_PATH: Final = "/report"
REPORT_TIMEOUT_S: Final = 2.0
"""How long a task waits for its report to be taken: a report never holds a task's loop up for long."""
_MAX_REPORT: Final = 1 << 20


def report_body(group: Sequence[str], samples: Iterable[Sample]) -> bytes:
    """The JSON a :class:`Reporter` sends: ``{"group": [...], "samples": [[name, [[label, value]...], v]...]}``."""
    return orjson.dumps({"group": list(group),
                         "samples": [[s.name, [list(kv) for kv in s.labels], s.value] for s in samples]})


def parse_report(body: bytes) -> tuple[tuple[str, ...], list[Sample]]:
    """The group and samples of a :func:`report_body`; raises ``ValueError`` for anything else (an unknown
    metric name included)."""
    try:
        found = orjson.loads(body)
        group = tuple(str(g) for g in found["group"])
        samples = [Sample(str(name), tuple((str(k), str(v)) for k, v in labels), float(value))
                   for name, labels, value in found["samples"]]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a metrics report: {exc}") from exc
    return group, samples


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


class MetricsServer:
    """A running endpoint (:func:`serve`). ``port``: the port it listens on (the one asked for, or the one
    the system gave for 0); :meth:`close` stops it."""

    def __init__(self, board: Board, host: str, port: int, accept_reports: bool) -> None:
        make_wsgi_app = prometheus_client_module().make_wsgi_app
        self.board = board
        self._metrics = make_wsgi_app(registry(board))
        self._accept_reports = accept_reports
        self._server = make_server(host, port, self._app, _Server, handler_class=_Quiet)
        self.host = host
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="controlmsg-metrics", daemon=True)
        self._thread.start()

    def url(self, host: str = "127.0.0.1") -> str:
        """``http://<host>:<port>``: the endpoint as reached through ``host``."""
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and release the port; blocks until the server's loop ended."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterator[bytes]:
        if environ.get("PATH_INFO") == REPORT_PATH:
            return iter([self._take_report(environ, start)])
        return iter(self._metrics(environ, start))

    def _take_report(self, environ: dict[str, Any], start: Callable[..., Any]) -> bytes:
        if not self._accept_reports or environ.get("REQUEST_METHOD") != "PUT":
            start("405 Method Not Allowed", [("Content-Type", "text/plain")])
            return b"reports are not taken here\n"
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            if not 0 < length <= _MAX_REPORT:
                raise ValueError(f"a report of {length} bytes")
            group, samples = parse_report(environ["wsgi.input"].read(length))
        except ValueError as exc:
            start("400 Bad Request", [("Content-Type", "text/plain")])
            return f"{exc}\n".encode()
        self.board.put(("report", *group), samples)
        start("204 No Content", [])
        return b""


def serve(board: Board, port: int, host: str = "0.0.0.0", *, accept_reports: bool = False) -> MetricsServer:
    """Serve ``board`` on ``host:port`` (0: a free port) from a daemon thread, until :meth:`MetricsServer.close`
    or the process ends. Returns at once. Raises ``ModuleNotFoundError`` (one line naming the extra) without
    prometheus-client, ``OSError`` when the port cannot be had."""
    return MetricsServer(board, host, port, accept_reports)


class Reporter:
    """Sends one group's samples to a :func:`serve` endpoint's ``PUT /report`` (``url`` its base,
    ``http://host:port``). Blocks up to :data:`REPORT_TIMEOUT_S`; never raises: the first failure after a
    success is said on stderr in one line (``who`` names the sender), the rest are silent until one passes."""

    def __init__(self, url: str, group: Sequence[str], who: str) -> None:
        self.url = url.rstrip("/") + REPORT_PATH
        self.group = tuple(group)
        self.who = who
        self._failing = False

    def report(self, samples: Iterable[Sample]) -> bool:
        """Send ``samples``, replacing what this group sent before; returns whether they were taken."""
        request = urllib.request.Request(self.url, data=report_body(self.group, samples), method="PUT",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REPORT_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:
            if not self._failing:
                print(f"{self.who}: metrics not reported to {self.url} ({exc}); the task goes on, and says so "
                      "again only after a report passed", file=sys.stderr, flush=True)
            self._failing = True
            return False
        self._failing = False
        return True
