"""A Spark standalone cluster (one master, one or more workers) from the pyspark installation, on 127.0.0.1.

``python -m controlmsg.clusters.standalone start [--cores 6] [--workers N] [--dir D]`` prints the master URL
(``spark://...``); ``stop`` ends them all. Tests use :func:`start_cluster`/:func:`stop_cluster`. The processes
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
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from controlmsg.clusters.processes import free_ports, pid_alive

__all__ = ["Cluster", "start_cluster", "stop_cluster"]


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


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


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
    raise RuntimeError(f"{needle!r} did not appear in {log} within {timeout:g} s:\n" + "\n".join(tail))


def start_cluster(directory: Path, cores: int = 6, memory: str = "6g", timeout: float = 90.0, *,
                  workers: int = 1) -> Cluster:
    """Start a master and ``workers`` workers with ``cores`` cores and ``memory`` each; block until every
    worker has registered with the master. Raises ``RuntimeError`` with the tail of the log of the process
    that did not come up (the processes started so far are stopped), ``ValueError`` when ``workers`` < 1."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    directory.mkdir(parents=True, exist_ok=True)
    home = _spark_home()
    spark_class = str(home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(directory),
           "SPARK_WORKER_DIR": str(directory / "work"), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    port = free_ports()
    web_port = free_ports(exclude={port})
    master_log = directory / "master.log"
    master_pid = _spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
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
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--cores", str(cores), "--memory", memory, "--webui-port", str(ui_port),
                 "--work-dir", str(work)], worker_logs[-1], env))
            worker_dirs.append(work)
        for worker_log in worker_logs:
            _wait_for_line(worker_log, "Successfully registered with master", timeout)
    except BaseException:
        for pid in (*worker_pids, master_pid):
            _kill(pid)
        raise
    cluster = Cluster(url, master_pid, tuple(worker_pids), directory, f"http://127.0.0.1:{web_port}",
                      tuple(worker_dirs))
    (directory / "cluster.json").write_text(json.dumps(
        {"master_url": url, "master_pid": master_pid, "worker_pids": worker_pids,
         "master_web_url": cluster.master_web_url, "worker_dirs": [str(d) for d in worker_dirs]}) + "\n")
    return cluster


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        # pid_alive, not kill(pid, 0): a dead child of ours stays a zombie, which kill(pid, 0) finds alive,
        # until it is reaped (which pid_alive does).
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop_cluster(cluster: Cluster) -> None:
    """Stop the workers, then the master (and their executors)."""
    for pid in cluster.worker_pids:
        _kill(pid)
    _kill(cluster.master_pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.standalone",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default=".controlmsg/spark-cluster")
    parser.add_argument("--cores", type=int, default=6, help="per worker")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    if args.action == "start":
        cluster = start_cluster(directory, args.cores, workers=args.workers)
        print(cluster.master_url)
        return 0
    record, older = directory / "cluster.json", directory / "cluster.txt"  # older: one worker, before N
    if record.exists():
        found = json.loads(record.read_text())
        stop_cluster(Cluster(found["master_url"], int(found["master_pid"]),
                             tuple(int(pid) for pid in found["worker_pids"]), directory))
        record.unlink()
    elif older.exists():
        url, master, worker = older.read_text().split()
        stop_cluster(Cluster(url, int(master), (int(worker),), directory))
        older.unlink()
    else:
        print("no cluster recorded in " + str(directory), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
