"""A local S3 endpoint (moto's server) on 127.0.0.1, and the Spark settings that put ``s3a://`` paths on it.

The endpoint is ``python -m moto.server`` (PyPI ``moto[server]``, in the ``test`` extra): S3's REST API in
one process, objects in memory, any access key accepted. Spark reaches it through Hadoop's S3A connector,
``org.apache.hadoop:hadoop-aws`` :data:`HADOOP_AWS_VERSION` (the Hadoop pyspark bundles) with its runtime
dependencies, above all the AWS SDK bundle (``software.amazon.awssdk:bundle``, about 655 MB). They are pinned
by SHA-256 in ``s3a-jars.lock`` next to this module, fetched once into ``<cache>/hadoop-aws-<version>/libs``
with a private resolver cache (so the bundle is on disk once), and verified before every use
(:mod:`controlmsg.clusters.maven_jars`; about 0.8 s to hash).

``python -m controlmsg.clusters.s3 start [--dir D] [--bucket B]`` starts the endpoint, creates the bucket and
prints the Spark settings as ``--conf key=value`` lines; ``stop`` ends it. Tests use :func:`start_s3`,
:func:`create_bucket`, :func:`s3a_spark_conf` and :func:`stop_s3`. The S3A settings must be given when the
Spark application starts (``spark.jars`` cannot be added to a running JVM's classpath).

POSIX only: the server is detached into its own session and stopped with signals to its process group.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlmsg.clusters.maven_jars import Coordinate, JarSet, ensure_jars, read_lock, write_lock
from controlmsg.clusters.processes import (
    file_lock,
    free_ports,
    is_process_of,
    log_tail,
    pid_alive,
    spawn_detached,
    terminate_group,
    write_text_atomic,
)
from controlmsg.errors import LocalClusterError

__all__ = [
    "ACCESS_KEY",
    "HADOOP_AWS_VERSION",
    "REGION",
    "S3A_JARS",
    "SECRET_KEY",
    "S3Endpoint",
    "S3Error",
    "create_bucket",
    "ensure_s3a_jars",
    "s3_status",
    "s3a_spark_conf",
    "start_s3",
    "stop_s3",
]

HADOOP_AWS_VERSION: Final = "3.5.0"
"""hadoop-aws's version: the Hadoop that pyspark bundles."""

LOCK_FILE: Final = Path(__file__).with_name("s3a-jars.lock")

ACCESS_KEY: Final = "controlmsg-local"
SECRET_KEY: Final = "controlmsg-local-secret"  # moto accepts any key; nothing is protected
REGION: Final = "us-east-1"


class S3Error(LocalClusterError):
    """The local S3 endpoint or its S3A jars cannot be fetched, started, used or stopped."""


S3A_JARS: Final = JarSet(
    title=f"hadoop-aws {HADOOP_AWS_VERSION} and the AWS SDK bundle",
    directory=f"hadoop-aws-{HADOOP_AWS_VERSION}",
    module="hadoop-aws-runtime",
    revision=HADOOP_AWS_VERSION,
    coordinates=(Coordinate("org.apache.hadoop", "hadoop-aws", HADOOP_AWS_VERSION),),
    lock_file=LOCK_FILE,
    error=S3Error,
    shared_cache=False,  # the 655 MB bundle: once on disk, in controlmsg's cache
)
"""What ``spark.jars`` gets for ``s3a://``."""

_HOST = "127.0.0.1"
_LOG_FILE = "s3.log"
_JSON_FILE = "s3.json"
_LOCK = ".s3.lock"
_SERVER_MODULE = "moto.server"
_STOP_TIMEOUT = 10.0
_REQUEST_TIMEOUT = 10.0

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class S3Endpoint:
    """A running local S3 endpoint.

    Attributes:
        url: ``http://127.0.0.1:PORT``, what ``fs.s3a.endpoint`` takes.
        port: Its port.
        pid: The server process, leader of its own process group.
        directory: Its log and record (the objects are in the server's memory).
    """

    url: str
    port: int
    pid: int
    directory: Path

    @property
    def log_path(self) -> Path:
        """The server's output."""
        return self.directory / _LOG_FILE


def ensure_s3a_jars(cache_dir: Path | None = None) -> Path:
    """The verified directory of :data:`S3A_JARS`, fetched the first time (about 690 MB; see
    :func:`controlmsg.clusters.maven_jars.ensure_jars`). Raises :class:`S3Error`."""
    return ensure_jars(S3A_JARS, cache_dir)


def s3a_spark_conf(endpoint: S3Endpoint, cache_dir: Path | None = None) -> dict[str, str]:
    """The Spark settings that make ``s3a://<bucket>/...`` paths of a new Spark application use ``endpoint``:
    ``spark.jars`` (the verified :data:`S3A_JARS`, fetched the first time) and ``spark.hadoop.fs.s3a.*``
    (endpoint, path-style access, plain HTTP, region, the static keys). Give them when the application
    starts: ``SparkSession.builder.config(...)`` before the first session of the process, or ``--conf``.
    Raises :class:`S3Error` when the jars cannot be fetched or verified."""
    libs = ensure_s3a_jars(cache_dir)
    jars = [str(libs / jar.name) for jar in read_lock(S3A_JARS.lock_file, S3Error)]
    prefix = "spark.hadoop.fs.s3a."
    return {
        "spark.jars": ",".join(jars),
        prefix + "endpoint": endpoint.url,
        prefix + "endpoint.region": REGION,
        prefix + "path.style.access": "true",
        prefix + "connection.ssl.enabled": "false",
        prefix + "access.key": ACCESS_KEY,
        prefix + "secret.key": SECRET_KEY,
        # The static keys only: no probe of environment variables, profiles or an instance metadata service.
        prefix + "aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }


# ------------------------------------------------------------------------------------- start / stop


def start_s3(directory: Path, *, timeout: float = 60.0) -> S3Endpoint:
    """Start moto's S3 server on a free port of 127.0.0.1, its log and record in ``directory`` (created if
    missing), and block until it answers an S3 request; return its handle. It starts empty.

    The server runs detached (own session: it outlives the caller) with its output in
    ``<directory>/s3.log``; ``<directory>/s3.json`` records it for :func:`s3_status` and :func:`stop_s3`.
    Idempotent: when the endpoint recorded in ``directory`` runs, its handle is returned.

    Blocks: a second or two; at most ``timeout`` s.

    Raises:
        S3Error: moto's server is not installed (the message names the extra), or it exits or does not
            answer within ``timeout`` (it is then killed, and the message ends with the last lines of its log).
        ValueError: ``timeout`` is not positive.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise S3Error(f"moto's server is not installed in this Python ({sys.executable}); install it with "
                      "pip install 'controlmsg[test]' (or 'moto[server]')")
    directory = directory.expanduser().resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise S3Error(f"cannot create the S3 endpoint's directory {directory}: {exc}") from exc
    with file_lock(directory / _LOCK):
        running = s3_status(directory)
        if running is not None:
            return running
        (directory / _JSON_FILE).unlink(missing_ok=True)
        port = free_ports()
        log = directory / _LOG_FILE
        with contextlib.suppress(FileNotFoundError):
            log.replace(directory / (_LOG_FILE + ".1"))
        started = time.monotonic()
        pid = spawn_detached([sys.executable, "-m", _SERVER_MODULE, "-H", _HOST, "-p", str(port)], log)
        endpoint = S3Endpoint(f"http://{_HOST}:{port}", port, pid, directory)
        try:
            _wait_until_serving(endpoint, started + timeout, timeout)
            write_text_atomic(directory / _JSON_FILE, json.dumps(
                {"url": endpoint.url, "port": port, "pid": pid}, indent=2) + "\n")
        except BaseException:
            with contextlib.suppress(LocalClusterError):
                terminate_group(pid, _markers(port), 5.0, what="the local S3 endpoint")
            raise
        _logger.info("S3 endpoint up at %s (pid %d) in %.1f s", endpoint.url, pid, time.monotonic() - started)
        return endpoint


def _markers(port: int) -> tuple[str, str]:
    return _SERVER_MODULE, f"-p {port}"


def _request(endpoint: S3Endpoint, method: str, path: str) -> tuple[int, str]:
    """The HTTP status and body of an unsigned ``method`` on ``path`` (moto does not check signatures)."""
    request = urllib.request.Request(endpoint.url + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT) as response:
            return int(response.status), response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", errors="replace")


def _s3_error(body: str) -> str:
    """``Code: Message`` of an S3 error document, or the body's start when it is none."""
    fields = [body.split(f"<{tag}>", 1)[1].split(f"</{tag}>", 1)[0] for tag in ("Code", "Message")
              if f"<{tag}>" in body and f"</{tag}>" in body]
    return ": ".join(fields) if fields else body.strip()[:200]


def _wait_until_serving(endpoint: S3Endpoint, deadline: float, timeout: float) -> None:
    while True:
        if not pid_alive(endpoint.pid):
            raise S3Error(f"the local S3 endpoint (pid {endpoint.pid}) exited during start-up"
                          + log_tail(endpoint.log_path))
        with contextlib.suppress(OSError):
            if _request(endpoint, "GET", "/")[0] == 200:  # S3's ListBuckets
                return
        if time.monotonic() >= deadline:
            raise S3Error(f"the local S3 endpoint at {endpoint.url} (pid {endpoint.pid}) did not answer within "
                          f"{timeout:g} s; it was killed" + log_tail(endpoint.log_path))
        time.sleep(0.2)


def create_bucket(endpoint: S3Endpoint, bucket: str) -> str:
    """Create ``bucket`` on ``endpoint`` (in :data:`REGION`; an existing one of ours is kept) and return
    ``s3a://<bucket>``. Raises :class:`S3Error` naming the bucket and S3's error code and message when it
    refuses (an invalid name: 3 to 63 lower-case letters, digits, dots and hyphens)."""
    try:
        status, body = _request(endpoint, "PUT", f"/{bucket}")
    except OSError as exc:
        raise S3Error(f"cannot create the bucket {bucket!r} on {endpoint.url}: {exc}") from exc
    if status != 200:
        raise S3Error(f"the local S3 endpoint at {endpoint.url} refused to create the bucket {bucket!r} "
                      f"(HTTP {status}, {_s3_error(body)})")
    return f"s3a://{bucket}"


def s3_status(directory: Path) -> S3Endpoint | None:
    """The endpoint recorded in ``directory`` if its server runs, else None. Does not block, does not raise."""
    directory = directory.expanduser().resolve()
    try:
        record = json.loads((directory / _JSON_FILE).read_text(encoding="utf-8"))
        endpoint = S3Endpoint(str(record["url"]), int(record["port"]), int(record["pid"]), directory)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return endpoint if is_process_of(endpoint.pid, *_markers(endpoint.port)) else None


def stop_s3(directory: Path) -> bool:
    """Stop the endpoint recorded in ``directory`` (its objects are gone with it). Returns False when none
    was running. Blocks until it is gone. Raises :class:`S3Error` when it survives SIGKILL."""
    directory = directory.expanduser().resolve()
    if not directory.is_dir():
        return False
    with file_lock(directory / _LOCK):
        endpoint = s3_status(directory)
        (directory / _JSON_FILE).unlink(missing_ok=True)
        if endpoint is None:
            return False
        try:
            return terminate_group(endpoint.pid, _markers(endpoint.port), _STOP_TIMEOUT,
                                   what="the local S3 endpoint")
        except LocalClusterError as exc:
            raise S3Error(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.s3",
                                     description="A local S3 endpoint (moto) and Spark's s3a settings for it.")
    parser.add_argument("action", choices=["start", "stop", "status", "fetch", "write-lock"],
                        help="fetch: the S3A jars only; write-lock: resolve them anew and rewrite s3a-jars.lock "
                             "(maintainers, after a version change; review the diff)")
    parser.add_argument("--dir", type=Path, default=Path(".controlmsg/s3"),
                        help="its log and record (default .controlmsg/s3)")
    parser.add_argument("--bucket", default="controlmsg", help="with start: the bucket to create")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.action == "fetch":
            print(ensure_s3a_jars())
        elif args.action == "write-lock":
            print(write_lock(S3A_JARS))
        elif args.action == "start":
            endpoint = start_s3(args.dir)
            uri = create_bucket(endpoint, args.bucket)
            for key, value in s3a_spark_conf(endpoint).items():
                print(f"--conf {key}={value}")
            print(f"# bucket: {uri}/", file=sys.stderr)
        elif args.action == "status":
            found = s3_status(args.dir)
            if found is None:
                print(f"no local S3 endpoint runs from {args.dir}", file=sys.stderr)
                return 1
            print(found.url)
        elif not stop_s3(args.dir):
            print(f"no local S3 endpoint ran from {args.dir}", file=sys.stderr)
    except LocalClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
