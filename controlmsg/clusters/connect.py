"""A local Spark Connect server from the pyspark installation, on 127.0.0.1: for tests and for trying
controlmsg from a Connect client.

``python -m controlmsg.clusters.connect start [--dir D]`` prints the server's URL (``sc://127.0.0.1:PORT``);
``stop`` ends it. Tests use :func:`start_server`/:func:`stop_server`. The process is pyspark's own
``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` (what
``sbin/start-connect-server.sh`` runs, without its daemon wrapper), ``spark-connect_*.jar`` coming with
pyspark; its Python workers run ``PYSPARK_PYTHON``, this interpreter unless set, so they can import
controlmsg. Its working directory is its own directory, not a checkout: what the server finds, it finds
through the installed package.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from controlmsg.clusters.processes import descendants, free_ports, log_tail, pid_alive, tcp_accepts
from controlmsg.errors import ControlMsgError

__all__ = ["ConnectServer", "ConnectServerError", "start_server", "stop_server"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_HOST = "127.0.0.1"
_CLIENT_ONLY = frozenset({"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE"})


class ConnectServerError(ControlMsgError):
    """The local Spark Connect server cannot be started."""


@dataclass(frozen=True)
class ConnectServer:
    url: str  # what SparkSession.builder.remote() takes
    pid: int  # of spark-submit's JVM, the leader of its own process group
    directory: Path

    @property
    def log(self) -> Path:
        return self.directory / "server.log"


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def start_server(directory: Path, *, master: str = "local[2]", conf: Mapping[str, str] | None = None,
                 timeout: float = 180.0) -> ConnectServer:
    """Start a Connect server on a free port, its log and working files in ``directory``; block until it
    accepts connections (about 10-20 s; a first start on a machine builds the class archive of
    :mod:`controlmsg.spark.class_archive`, about 35 s more).

    ``master``: the server's Spark master; ``conf``: more Spark settings (over the defaults: UTC, no UI,
    4 shuffle partitions). Raises :class:`ConnectServerError`, with the tail of the server's log, when the
    server exits or does not answer within ``timeout`` seconds; it is stopped then.
    """
    from controlmsg.spark.class_archive import driver_java_options

    directory.mkdir(parents=True, exist_ok=True)
    home = _spark_home()
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    port = free_ports()
    settings = {
        "spark.connect.grpc.binding.address": _HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.executorEnv.PYSPARK_PYTHON": python,
        "spark.local.dir": str(directory / "tmp"),
        **(conf or {}),
    }
    options = driver_java_options(settings.get("spark.driver.extraJavaOptions", ""))
    if options:
        settings["spark.driver.extraJavaOptions"] = options
    argv = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "controlmsg Connect server",
            "--master", master]
    for key, value in settings.items():
        argv += ["--conf", f"{key}={value}"]
    # SPARK_CONNECT_MODE=0: what start-connect-server.sh sets, so that spark-submit starts a classic driver;
    # a client's Connect settings (a test process may have them) must not reach the server's Python workers.
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ONLY}
    env.update(SPARK_HOME=str(home), SPARK_CONNECT_MODE="0", SPARK_LOCAL_IP=_HOST, PYSPARK_PYTHON=python,
               PYSPARK_DRIVER_PYTHON=python)
    log = directory / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=directory, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    server = ConnectServer(f"sc://{_HOST}:{port}", proc.pid, directory)
    deadline = time.monotonic() + timeout
    while not tcp_accepts(_HOST, port):
        failure = (f"exited with code {proc.returncode}" if proc.poll() is not None
                   else f"did not accept connections on port {port} within {timeout:g} s"
                   if time.monotonic() > deadline else None)
        if failure is not None:
            stop_server(server)
            raise ConnectServerError(f"the Spark Connect server {failure}" + log_tail(log))
        time.sleep(0.5)
    (directory / "server.txt").write_text(f"{server.url}\n{server.pid}\n")
    return server


def stop_server(server: ConnectServer, timeout: float = 30.0) -> None:
    """Stop the server and its Python workers: its process group (SIGTERM, then SIGKILL after ``timeout``
    s), then any of its descendants left (the PySpark daemon makes a process group of its own). Returns at
    once if it has already gone."""
    workers = descendants(server.pid)
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:
            break
        if _group_gone(server.pid, wait):
            break
    for pid in workers:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _group_gone(pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)  # the leader, if it is our child, is a zombie until reaped
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.connect",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--dir", default=".controlmsg/connect-server")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    directory = Path(args.dir).resolve()
    if args.action == "start":
        print(start_server(directory, master=args.master).url)
        return 0
    record = directory / "server.txt"
    if not record.exists():
        print(f"no Connect server recorded in {directory}", file=sys.stderr)
        return 1
    url, pid = record.read_text().split()
    stop_server(ConnectServer(url, int(pid), directory))
    record.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
