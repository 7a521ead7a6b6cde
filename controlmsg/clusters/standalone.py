"""A Spark standalone cluster (one master, one worker) from the pyspark installation, on 127.0.0.1.

``python -m controlmsg.clusters.standalone start [--cores 6] [--dir D]`` prints the master URL (``spark://...``);
``stop`` ends both. Tests use :func:`start_cluster`/:func:`stop_cluster`. The processes are the real Spark
master and worker (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), started with
pyspark's ``bin/spark-class``; executors launched by the worker run Python with ``PYSPARK_PYTHON``.

A worker offers ``cores`` cores; give each application ``spark.cores.max`` so that several applications
(the pipeline's three jobs) fit at once: a downstream job holds its cores while it waits for upstream.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from controlmsg.clusters.processes import free_ports

__all__ = ["Cluster", "start_cluster", "stop_cluster"]


@dataclass(frozen=True)
class Cluster:
    master_url: str
    master_pid: int
    worker_pid: int
    directory: Path


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


def start_cluster(directory: Path, cores: int = 6, memory: str = "6g", timeout: float = 90.0) -> Cluster:
    """Start a master and one worker with ``cores`` cores; block until the worker has registered."""
    directory.mkdir(parents=True, exist_ok=True)
    home = _spark_home()
    spark_class = str(home / "bin" / "spark-class")
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOG_DIR": str(directory),
           "SPARK_WORKER_DIR": str(directory / "work"), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    port = free_ports()
    master_log = directory / "master.log"
    worker_log = directory / "worker.log"
    master_pid = _spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(free_ports())], master_log, env)
    url = f"spark://127.0.0.1:{port}"
    try:
        _wait_for_line(master_log, "I have been elected leader", timeout)
        worker_pid = _spawn([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                             "--cores", str(cores), "--memory", memory, "--webui-port", str(free_ports()),
                             "--work-dir", str(directory / "work")], worker_log, env)
        _wait_for_line(worker_log, "Successfully registered with master", timeout)
    except BaseException:
        _kill(master_pid)
        raise
    (directory / "cluster.txt").write_text(f"{url}\n{master_pid}\n{worker_pid}\n")
    return Cluster(url, master_pid, worker_pid, directory)


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop_cluster(cluster: Cluster) -> None:
    """Stop the worker, then the master (and their executors)."""
    _kill(cluster.worker_pid)
    _kill(cluster.master_pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.standalone",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default=".controlmsg/spark-cluster")
    parser.add_argument("--cores", type=int, default=6)
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    if args.action == "start":
        cluster = start_cluster(directory, args.cores)
        print(cluster.master_url)
        return 0
    record = directory / "cluster.txt"
    if not record.exists():
        print("no cluster recorded in " + str(directory), file=sys.stderr)
        return 1
    url, master, worker = record.read_text().split()
    stop_cluster(Cluster(url, int(master), int(worker), directory))
    record.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
