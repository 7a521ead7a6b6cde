"""A local Spark Connect server from the pyspark installation, on 127.0.0.1: for tests and for trying
controlmsg from a Connect client.

``python -m controlmsg.clusters.connect start [--dir D]`` prints the server's URL (``sc://127.0.0.1:PORT``);
``status`` prints it while the server runs, ``stop`` ends it. Tests use :func:`start_server`/:func:`stop_server`.
The process is pyspark's own ``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``
(what ``sbin/start-connect-server.sh`` runs, without its daemon wrapper), ``spark-connect_*.jar`` coming with
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
from typing import Final

from controlmsg.clusters.processes import (
    descendants,
    free_ports,
    is_process_of,
    log_tail,
    pid_alive,
    tcp_accepts,
    terminate_group,
)
from controlmsg.clusters.starter import CommandLine, spark_home
from controlmsg.errors import LocalClusterError

__all__ = ["ConnectServer", "ConnectServerError", "server_status", "start_server", "stop_server"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_HOST = "127.0.0.1"
_CLIENT_ONLY = frozenset({"SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE"})
_RECORD_FILE = "server.txt"
_PORT_SETTING = "spark.connect.grpc.binding.port"


class ConnectServerError(LocalClusterError):
    """The local Spark Connect server cannot be started or stopped."""


@dataclass(frozen=True)
class ConnectServer:
    url: str  # what SparkSession.builder.remote() takes
    pid: int  # of spark-submit's JVM, the leader of its own process group
    directory: Path

    @property
    def log(self) -> Path:
        return self.directory / "server.log"


def start_server(directory: Path, *, master: str = "local[2]", conf: Mapping[str, str] | None = None,
                 timeout: float = 180.0) -> ConnectServer:
    """Start a Connect server on a free port, its log and working files in ``directory``; block until it
    accepts connections (about 10-20 s; a first start on a machine builds the class archive of
    :mod:`controlmsg.spark.class_archive`, about 35 s more).

    ``master``: the server's Spark master; ``conf``: more Spark settings (over the defaults: UTC, no UI,
    4 shuffle partitions). Raises :class:`ConnectServerError`, with the tail of the server's log, when the
    server exits or does not answer within ``timeout`` seconds (it is stopped then), or when pyspark is not
    installed.
    """
    from controlmsg.spark.class_archive import driver_java_options

    directory.mkdir(parents=True, exist_ok=True)
    try:
        home = spark_home("the Spark Connect server runs from its installation")
    except LocalClusterError as exc:
        raise ConnectServerError(str(exc)) from exc
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    port = free_ports()
    settings = {
        "spark.connect.grpc.binding.address": _HOST,
        _PORT_SETTING: str(port),
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
    (directory / _RECORD_FILE).write_text(f"{server.url}\n{server.pid}\n")
    return server


def _markers(server: ConnectServer) -> tuple[str, str]:
    return SERVER_CLASS, f"{_PORT_SETTING}={server.url.rpartition(':')[2]}"


def stop_server(server: ConnectServer, timeout: float = 30.0) -> None:
    """Stop the server and its Python workers: its process group (SIGTERM, then SIGKILL after ``timeout``
    s; :func:`~controlmsg.clusters.processes.terminate_group`), then any of its descendants left (the PySpark
    daemon makes a process group of its own). Returns at once if it has already gone. Blocks until the server
    is gone; raises :class:`ConnectServerError` when it survives SIGKILL."""
    workers = descendants(server.pid)
    try:
        terminate_group(server.pid, _markers(server), timeout, what="the Spark Connect server")
    except LocalClusterError as exc:
        raise ConnectServerError(str(exc)) from exc
    finally:
        for pid in workers:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _recorded(directory: Path) -> ConnectServer | None:
    """The server recorded in ``directory``, running or not."""
    try:
        url, pid = (directory / _RECORD_FILE).read_text().split()
        return ConnectServer(url, int(pid), directory)
    except (OSError, ValueError):
        return None


def server_status(directory: Path) -> ConnectServer | None:
    """The server recorded in ``directory`` if it runs, else None. Does not block, does not raise."""
    server = _recorded(directory.resolve())
    return server if server is not None and is_process_of(server.pid, *_markers(server)) else None


def _stop_recorded(directory: Path) -> bool:
    """Stop the server recorded in ``directory`` and remove its record; False when none is recorded."""
    directory = directory.resolve()
    server = _recorded(directory)
    if server is None:
        return False
    stop_server(server)
    (directory / _RECORD_FILE).unlink()
    return True


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[2]")


_COMMAND: Final = CommandLine[ConnectServer](
    prog="python -m controlmsg.clusters.connect",
    description=(__doc__ or "").split("\n")[0],
    label="Spark Connect server",
    directory=".controlmsg/connect-server",
    directory_help="its log, record and working files (default .controlmsg/connect-server)",
    start=lambda args: print(start_server(args.dir.resolve(), master=args.master).url),
    status=server_status,
    address=lambda found: found.url,
    stop=_stop_recorded,
    nothing_to_stop="no Connect server recorded in {dir}",
    nothing_to_stop_code=1,
    options=_add_options,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m controlmsg.clusters.connect start|stop|status [--dir D] [--master M]``
    (:class:`~controlmsg.clusters.starter.CommandLine`); returns the exit code."""
    return _COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
