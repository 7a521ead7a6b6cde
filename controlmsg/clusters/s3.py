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
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from controlmsg.clusters.jar_sets import Coordinate, JarSet, read_lock
from controlmsg.clusters.maven_jars import ensure_jars, write_lock
from controlmsg.clusters.processes import free_ports
from controlmsg.clusters.starter import CommandLine, Launch, Starter
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


@dataclass(frozen=True)
class _S3(Starter[S3Endpoint]):
    """moto's server on the skeleton of :class:`~controlmsg.clusters.starter.Starter`."""

    label: ClassVar[str] = "S3 endpoint"
    error: ClassVar[type[LocalClusterError]] = S3Error
    record_file: ClassVar[str] = _JSON_FILE
    log_file: ClassVar[str] = _LOG_FILE
    lock_file: ClassVar[str] = _LOCK
    stop_timeout: ClassVar[float] = _STOP_TIMEOUT
    late: ClassVar[str] = "did not answer"

    def check(self) -> None:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise S3Error(f"moto's server is not installed in this Python ({sys.executable}); install it with "
                          "pip install 'controlmsg[test]' (or 'moto[server]')")

    def launch(self, directory: Path) -> Launch[S3Endpoint]:
        port = free_ports()
        return Launch([sys.executable, "-m", _SERVER_MODULE, "-H", _HOST, "-p", str(port)],
                      lambda pid: S3Endpoint(f"http://{_HOST}:{port}", port, pid, directory))

    def serves(self, handle: S3Endpoint) -> bool:
        with contextlib.suppress(OSError):
            return _request(handle, "GET", "/")[0] == 200  # S3's ListBuckets
        return False

    def address(self, handle: S3Endpoint) -> str:
        return handle.url

    def markers(self, handle: S3Endpoint) -> tuple[str, ...]:
        return _SERVER_MODULE, f"-p {handle.port}"

    def to_record(self, handle: S3Endpoint) -> dict[str, object]:
        return {"url": handle.url, "port": handle.port, "pid": handle.pid}

    def from_record(self, record: Mapping[str, Any], directory: Path) -> S3Endpoint:
        return S3Endpoint(str(record["url"]), int(record["port"]), int(record["pid"]), directory)


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
    return _S3().start(directory, timeout)


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
    return _S3().status(directory)


def stop_s3(directory: Path) -> bool:
    """Stop the endpoint recorded in ``directory`` (its objects are gone with it). Returns False when none
    was running. Blocks until it is gone. Raises :class:`S3Error` when it survives SIGKILL."""
    return _S3().stop(directory)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bucket", default="controlmsg", help="with start: the bucket to create")


def _start(args: argparse.Namespace) -> None:
    """Start, create the bucket, print the Spark settings as ``--conf`` lines (and the bucket on stderr)."""
    endpoint = start_s3(args.dir)
    uri = create_bucket(endpoint, args.bucket)
    for key, value in s3a_spark_conf(endpoint).items():
        print(f"--conf {key}={value}")
    print(f"# bucket: {uri}/", file=sys.stderr)


_COMMAND: Final = CommandLine[S3Endpoint](
    prog="python -m controlmsg.clusters.s3",
    description="A local S3 endpoint (moto) and Spark's s3a settings for it.",
    label="local S3 endpoint",
    directory=".controlmsg/s3",
    directory_help="its log and record (default .controlmsg/s3)",
    start=_start,
    status=s3_status,
    address=lambda found: found.url,
    stop=stop_s3,
    options=_add_options,
    actions={"fetch": ensure_s3a_jars, "write-lock": lambda: write_lock(S3A_JARS)},
    actions_help="fetch: the S3A jars only; write-lock: resolve them anew and rewrite s3a-jars.lock "
                 "(maintainers, after a version change; review the diff)",
)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m controlmsg.clusters.s3 start|stop|status|fetch|write-lock [--dir D] [--bucket B]``
    (:class:`~controlmsg.clusters.starter.CommandLine`); returns the exit code."""
    return _COMMAND.main(argv)


if __name__ == "__main__":
    sys.exit(main())
