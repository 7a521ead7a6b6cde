"""A Spark standalone cluster (one master, one or more workers) from the pyspark installation, on 127.0.0.1.

``python -m controlmsg.clusters.standalone start [--cores 6] [--workers N] [--dir D]`` prints the master URL
(``spark://...``); ``status`` prints it while the master runs, ``stop`` ends them all (an error is a
:class:`StandaloneError`). Tests use :func:`start_cluster`/:func:`stop_cluster`. The processes
are the real Spark master and workers (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), started with
pyspark's ``bin/spark-class``; executors launched by the worker run Python with ``PYSPARK_PYTHON``.

Each worker has a work directory of its own (``work`` for the first, ``work-2``, ... for the others; an
executor runs in ``<work dir>/<app id>/<executor id>``) and a log of its own (``worker.log``, ``worker-2.log``,
...). The master's web UI answers ``<master_web_url>/json/`` (its workers and applications).

A worker offers ``cores`` cores; give each application ``spark.cores.max`` so that several applications
(the pipeline's three jobs) fit at once: a downstream job holds its cores while it waits for upstream.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlmsg.clusters.processes import free_ports, is_process_of, terminate_group
from controlmsg.clusters.starter import CommandLine, spark_home
from controlmsg.errors import LocalClusterError

__all__ = ["Cluster", "StandaloneError", "standalone_status", "start_cluster", "stop_cluster"]

MASTER_CLASS: Final = "org.apache.spark.deploy.master.Master"
WORKER_CLASS: Final = "org.apache.spark.deploy.worker.Worker"
_RECORD_FILE = "cluster.json"
_OLDER_RECORD_FILE = "cluster.txt"  # one worker, before N
_STOP_TIMEOUT = 5.0


class StandaloneError(LocalClusterError, RuntimeError):
    """The standalone cluster cannot be started or stopped (the message says which process, with the tail of
    its log). Also a ``RuntimeError``, what :func:`start_cluster` raised before it had a class of its own."""


@dataclass(frozen=True)
class Cluster:
    """A running standalone cluster: ``master_url`` (``spark://...``) for applications, ``master_web_url``
    (``http://...``) for the master's web UI and its JSON API, the process ids, the work directory of each
    worker (same order as ``worker_pids``)."""

    master_url: str
    master_pid: int
    worker_pids: tuple[int, ...]
    directory: Path
    master_web_url: str = ""
    worker_dirs: tuple[Path, ...] = ()

    @property
    def worker_pid(self) -> int:
        """The first worker's process id."""
        return self.worker_pids[0]


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    return proc.pid


def _wait_for_line(log: Path, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and needle in log.read_text(errors="replace"):
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
    raise StandaloneError(f"{needle!r} did not appear in {log} within {timeout:g} s:\n" + "\n".join(tail))


def start_cluster(directory: Path, cores: int = 6, memory: str = "6g", timeout: float = 90.0, *,
                  workers: int = 1) -> Cluster:
    """Start a master and ``workers`` workers with ``cores`` cores and ``memory`` each; block until every
    worker has registered with the master. Raises :class:`StandaloneError` (a ``RuntimeError`` too) with the
    tail of the log of the process that did not come up (the processes started so far are stopped), or when
    pyspark is not installed; ``ValueError`` when ``workers`` < 1."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        home = spark_home("a Spark standalone cluster runs from its installation")
    except LocalClusterError as exc:
        raise StandaloneError(str(exc)) from exc
    spark_class = str(home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(directory),
           "SPARK_WORKER_DIR": str(directory / "work"), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    port = free_ports()
    web_port = free_ports(exclude={port})
    master_log = directory / "master.log"
    master_pid = _spawn([spark_class, MASTER_CLASS, "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(web_port)], master_log, env)
    url = f"spark://127.0.0.1:{port}"
    worker_pids: list[int] = []
    worker_dirs: list[Path] = []
    try:
        _wait_for_line(master_log, "I have been elected leader", timeout)
        worker_logs: list[Path] = []
        taken = {port, web_port}
        for number in range(1, workers + 1):  # all at once, then wait for each to register
            suffix = "" if number == 1 else f"-{number}"
            work = directory / f"work{suffix}"
            worker_logs.append(directory / f"worker{suffix}.log")
            ui_port = free_ports(exclude=taken)
            taken.add(ui_port)
            worker_pids.append(_spawn(
                [spark_class, WORKER_CLASS, url, "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", memory, "--webui-port", str(ui_port),
                 "--work-dir", str(work)], worker_logs[-1], env))
            worker_dirs.append(work)
        for worker_log in worker_logs:
            _wait_for_line(worker_log, "Successfully registered with master", timeout)
    except BaseException:
        with contextlib.suppress(LocalClusterError):
            stop_cluster(Cluster(url, master_pid, tuple(worker_pids), directory))
        raise
    cluster = Cluster(url, master_pid, tuple(worker_pids), directory, f"http://127.0.0.1:{web_port}",
                      tuple(worker_dirs))
    (directory / _RECORD_FILE).write_text(json.dumps(
        {"master_url": url, "master_pid": master_pid, "worker_pids": worker_pids,
         "master_web_url": cluster.master_web_url, "worker_dirs": [str(d) for d in worker_dirs]}) + "\n")
    return cluster


def _master_markers(master_url: str) -> tuple[str, str]:
    return MASTER_CLASS, f"--port {master_url.rpartition(':')[2]}"


def _stop(pid: int, markers: tuple[str, ...]) -> None:
    """SIGTERM to the process group that ``pid`` leads, SIGKILL after 5 s (:func:`terminate_group`); nothing
    when it no longer runs a command line with ``markers``."""
    try:
        terminate_group(pid, markers, _STOP_TIMEOUT, what="a Spark standalone process")
    except LocalClusterError as exc:
        raise StandaloneError(str(exc)) from exc


def stop_cluster(cluster: Cluster) -> None:
    """Stop the workers, then the master (and their executors: a worker's process group): SIGTERM, SIGKILL
    after 5 s. A process already gone is skipped. Blocks until they are gone; raises :class:`StandaloneError`
    when one survives SIGKILL."""
    for pid in cluster.worker_pids:
        _stop(pid, (WORKER_CLASS, cluster.master_url))
    _stop(cluster.master_pid, _master_markers(cluster.master_url))


def _recorded(directory: Path) -> tuple[Cluster, Path] | None:
    """The cluster recorded in ``directory`` and its record file, running or not."""
    record, older = directory / _RECORD_FILE, directory / _OLDER_RECORD_FILE
    try:
        if record.exists():
            found = json.loads(record.read_text())
            return Cluster(found["master_url"], int(found["master_pid"]),
                           tuple(int(pid) for pid in found["worker_pids"]), directory,
                           str(found.get("master_web_url", "")),
                           tuple(Path(d) for d in found.get("worker_dirs", ()))), record
        if older.exists():
            url, master, worker = older.read_text().split()
            return Cluster(url, int(master), (int(worker),), directory), older
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def standalone_status(directory: Path) -> Cluster | None:
    """The cluster recorded in ``directory`` if its master runs, else None. Does not block, does not raise."""
    found = _recorded(directory)
    if found is None or not is_process_of(found[0].master_pid, *_master_markers(found[0].master_url)):
        return None
    return found[0]


def _stop_recorded(directory: Path) -> bool:
    """Stop the cluster recorded in ``directory`` and remove its record; False when none is recorded."""
    found = _recorded(directory)
    if found is None:
        return False
    stop_cluster(found[0])
    found[1].unlink()
    return True


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cores", type=int, default=6, help="per worker")
    parser.add_argument("--workers", type=int, default=1)


_COMMAND: Final = CommandLine[Cluster](
    prog="python -m controlmsg.clusters.standalone",
    description=(__doc__ or "").split("\n")[0],
    label="Spark standalone cluster",
    directory=".controlmsg/spark-cluster",
    directory_help="its logs, work directories and record (default .controlmsg/spark-cluster)",
    start=lambda args: print(start_cluster(args.dir, args.cores, workers=args.workers).master_url),
    status=standalone_status,
    address=lambda found: found.master_url,
    stop=_stop_recorded,
    nothing_to_stop="no cluster recorded in {dir}",
    nothing_to_stop_code=1,
    options=_add_options,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m controlmsg.clusters.standalone start|stop|status [--dir D] [--cores N] [--workers N]``
    (:class:`~controlmsg.clusters.starter.CommandLine`); returns the exit code."""
    return _COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
