"""The docker-compose cluster's images, built here from a Debian base and rebuilt only when their inputs change.

``docker-compose.yml`` runs two images built from this project's Dockerfiles (``docker/``):

* :data:`KAFKA_IMAGE`: Apache Kafka's broker from the jars of ``kafka-jars.lock``
  (:mod:`controlmsg.clusters.kafka_jars` fetches and verifies them; they are copied into ``docker/kafka/libs``
  and the build checks them against the lock again), one KRaft node configured from ``KAFKA_*`` variables;
* :data:`SPARK_IMAGE`: Java 17, Python 3.11, pyspark and this project's dependencies, for the Spark master,
  worker and drivers; the project's checkout is mounted at ``/opt/controlmsg`` and on the image's Python path.

Both are built ``FROM`` a Debian bookworm image, the build argument ``BASE``. Where no image registry is
reachable, :func:`ensure_debian_base` makes one: ``debootstrap --variant=minbase bookworm`` and ``docker
import`` (root, ``debootstrap`` installed), with this machine's CA bundle inside so that ``apt-get`` and
``pip`` in the builds trust what this machine trusts. Elsewhere ``debian:bookworm-slim`` is the same base.

An image is rebuilt only when the SHA-256 of its inputs (the Dockerfile and the files its context sends, the
base image's id) is new: each build is tagged twice, ``controlmsg/spark:4.3.0`` and
``controlmsg/spark:4.3.0-<first 16 hex digits of the digest>``; when the second exists, the first is pointed at
it (if it is not already) and nothing is built. The image of the inputs before is removed after a build.
Needs a checkout of the project (the Dockerfiles and sources are the build contexts) and a running Docker
engine. Run ``python -m controlmsg.clusters.images``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlmsg.clusters.kafka_jars import KAFKA_VERSION, LOCK_FILE, ensure_kafka_libs, read_lock, verify_jars
from controlmsg.errors import BrokerError

__all__ = [
    "DEBIAN_BASE",
    "KAFKA_IMAGE",
    "SPARK_IMAGE",
    "Built",
    "ImageError",
    "build_images",
    "ensure_debian_base",
    "project_root",
]

SPARK_VERSION: Final = "4.3.0"
KAFKA_IMAGE: Final = f"controlmsg/kafka:{KAFKA_VERSION}"
SPARK_IMAGE: Final = f"controlmsg/spark:{SPARK_VERSION}"
DEBIAN_BASE: Final = "controlmsg/debian:bookworm"
"""The base :func:`ensure_debian_base` makes (``docker-compose.yml`` reads it from ``CONTROLMSG_BASE_IMAGE``)."""
_TAG_DIGITS = 16
_SPARK_CONTEXT: Final = ("docker/spark/requirements.txt", ".dockerignore", "controlmsg/paths.py",
                         "controlmsg/spark/class_archive.py")
"""What the Spark image's build reads from the project (/.dockerignore sends the same): its dependencies and
the class archive's builder with the cache path it imports (both import the standard library alone). The rest
of the code is mounted when the containers run, so a change there builds nothing."""

_SUITE = "bookworm"
# What debian:bookworm-slim's sources name: the release, its updates and its security updates.
_SOURCES = (f"deb http://deb.debian.org/debian {_SUITE} main\n"
            f"deb http://deb.debian.org/debian {_SUITE}-updates main\n"
            f"deb http://deb.debian.org/debian-security {_SUITE}-security main\n")
_HOST_CA_NAME = "host-bundle.crt"
_DEBOOTSTRAP_TIMEOUT = 1200.0
_BUILD_TIMEOUT = 2400.0

_logger = logging.getLogger(__name__)


class ImageError(BrokerError):
    """An image could not be made: no Docker engine, no debootstrap, a failed build. The message says which
    command failed and ends with its output's last lines."""


@dataclass(frozen=True)
class Built:
    """One image: its name, the digest of its inputs, and whether this call built it (False: reused)."""

    image: str
    inputs: str
    built: bool
    seconds: float


def project_root() -> Path:
    """The checkout this module belongs to. Raises :class:`ImageError` when it is an installed copy without
    the Dockerfiles (``docker/``), which only a checkout has."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "docker" / "spark" / "Dockerfile").is_file():
        raise ImageError(f"{root} is not a checkout of controlmsg (no docker/spark/Dockerfile): the images are "
                         "built from a checkout")
    return root


def _docker(*args: str, timeout: float = 120.0, stdin: bytes | None = None, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[bytes]:
    cmd = ["docker", *args]
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, check=False,
                              env={**os.environ, **(env or {})})
    except FileNotFoundError as exc:
        raise ImageError("no docker command on PATH (Debian: apt-get install docker.io)") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{' '.join(cmd[:3])} ...: no answer within {timeout:.0f} s") from exc
    return done


def _check(done: subprocess.CompletedProcess[bytes], what: str) -> subprocess.CompletedProcess[bytes]:
    if done.returncode != 0:
        raise _failed(what, done)
    return done


def _failed(what: str, done: subprocess.CompletedProcess[bytes]) -> ImageError:
    tail = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()[-25:]
    return ImageError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(tail))


def _image_field(image: str, template: str) -> str | None:
    """``docker image inspect`` of one field; None when there is no such image."""
    done = _docker("image", "inspect", "--format", template, image)
    if done.returncode != 0:
        if b"No such image" in done.stderr or b"no such image" in done.stderr.lower():
            return None
        raise _failed(f"docker image inspect {image}", done)
    return done.stdout.decode().strip()


def _host_ca_bundle() -> Path | None:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def ensure_debian_base(name: str = DEBIAN_BASE) -> str:
    """Make the Debian bookworm image ``name`` unless it exists, and return its name.

    ``debootstrap --variant=minbase bookworm`` into a temporary directory, this machine's CA bundle copied in
    (as ``/usr/local/share/ca-certificates/host-bundle.crt``, which ``update-ca-certificates`` keeps, and as
    the bundle itself), the apt sources of ``debian:bookworm-slim``, then ``docker import``. Needs root and
    debootstrap. Blocks for the download (about 30 s here). Raises :class:`ImageError`.
    """
    if _image_field(name, "{{.Id}}") is not None:
        return name
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (Debian: apt-get install debootstrap); or build FROM "
                         "debian:bookworm-slim where a registry is reachable (--base debian:bookworm-slim)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="controlmsg-debootstrap-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            done = subprocess.run([debootstrap, "--variant=minbase", _SUITE, str(rootfs)], capture_output=True,
                                  timeout=_DEBOOTSTRAP_TIMEOUT, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ImageError(f"debootstrap did not finish within {_DEBOOTSTRAP_TIMEOUT:.0f} s") from exc
        if done.returncode != 0:
            raise _failed("debootstrap --variant=minbase bookworm", done)
        (rootfs / "etc" / "apt" / "sources.list").write_text(_SOURCES, encoding="utf-8")
        bundle = _host_ca_bundle()
        if bundle is not None:
            local = rootfs / "usr" / "local" / "share" / "ca-certificates"
            local.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(bundle, local / _HOST_CA_NAME)
            (rootfs / "etc" / "ssl" / "certs").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(bundle, rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            imported = subprocess.run(["docker", "import", "--change",
                                       "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt", "-", name],
                                      stdin=tar.stdout, capture_output=True, timeout=600.0, check=False)
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait()
        if imported.returncode != 0:
            raise _failed(f"docker import {name}", imported)
    _logger.info("made %s with debootstrap in %.0f s", name, time.monotonic() - started)
    return name


def _files(root: Path, names: Iterable[str]) -> list[Path]:
    """The files named (directories: every file below, bytecode left out), sorted."""
    out: list[Path] = []
    for name in names:
        path = root / name
        if path.is_dir():
            out += [p for p in path.rglob("*")
                    if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
        else:
            out.append(path)
    return sorted(out)


def _digest(root: Path, files: Sequence[Path], *extra: str) -> str:
    h = hashlib.sha256()
    for value in extra:
        h.update(value.encode() + b"\0")
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _build(image: str, dockerfile: Path, context: Path, base: str, inputs: str, rebuild: bool) -> Built:
    started = time.monotonic()
    by_inputs = f"{image}-{inputs[:_TAG_DIGITS]}"
    if not rebuild:
        built = _image_field(by_inputs, "{{.Id}}")
        if built is not None:
            if _image_field(image, "{{.Id}}") != built:
                _check(_docker("tag", by_inputs, image), f"docker tag {by_inputs} {image}")
            return Built(image, inputs, False, time.monotonic() - started)
    _logger.info("building %s (%s)", image, by_inputs)
    # The classic builder: the engines of Debian bookworm (20.10) have no buildx plugin beside them. No
    # --label: under vfs it would be one more step copying the whole file system; the tag holds the digest.
    _check(_docker("build", "--build-arg", f"BASE={base}", "--tag", image, "--tag", by_inputs,
                   "--file", str(dockerfile), str(context), timeout=_BUILD_TIMEOUT, env={"DOCKER_BUILDKIT": "0"}),
           f"docker build {image}")
    # The images of earlier inputs: untagged and, under vfs where each costs gigabytes, removed.
    repository, _, version = image.rpartition(":")
    listed = _check(_docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repository), "docker image ls")
    stale = [name for name in listed.stdout.decode().split()
             if name.startswith(f"{repository}:{version}-") and name != by_inputs]
    if stale:
        _docker("image", "rm", *stale)
    return Built(image, inputs, True, time.monotonic() - started)


def _kafka_context(root: Path) -> Path:
    """docker/kafka with the lock and its verified jars in ``libs/`` (both ignored by git)."""
    context = root / "docker" / "kafka"
    libs = context / "libs"
    lock = read_lock()
    if not libs.is_dir() or verify_jars(libs, lock):
        cached = ensure_kafka_libs()
        shutil.rmtree(libs, ignore_errors=True)
        shutil.copytree(cached, libs)
        problems = verify_jars(libs, lock)
        if problems:
            raise ImageError("the Kafka jars copied into the build context do not match the lock:\n"
                             + "\n".join(problems[:12]))
    shutil.copyfile(LOCK_FILE, context / LOCK_FILE.name)
    return context


def build_images(base: str | None = None, *, rebuild: bool = False, root: Path | None = None,
                 ) -> tuple[Built, Built]:
    """Make :data:`KAFKA_IMAGE` and :data:`SPARK_IMAGE`, each only when its inputs changed (or ``rebuild``).

    ``base``: the Debian bookworm image to build from; None makes (once) and uses :data:`DEBIAN_BASE`. Blocks
    while it builds: a cold build of both takes minutes (apt-get and pip download about 600 MB), a warm call
    about a second. Raises :class:`ImageError` (no engine, a failed build) and
    :class:`~controlmsg.errors.BrokerError` (the Kafka jars cannot be fetched).
    """
    root = root if root is not None else project_root()
    base = base if base is not None else ensure_debian_base()
    base_id = _image_field(base, "{{.Id}}")
    if base_id is None:
        raise ImageError(f"no base image {base}: `docker pull {base}` where a registry is reachable, or omit "
                         "--base to make one with debootstrap")
    kafka_context = _kafka_context(root)
    kafka_files = _files(kafka_context, ["Dockerfile", ".dockerignore", "start-kafka", "log4j2.properties",
                                         LOCK_FILE.name])
    kafka = _build(KAFKA_IMAGE, kafka_context / "Dockerfile", kafka_context, base,
                   _digest(kafka_context, kafka_files, base_id), rebuild)
    spark_files = _files(root, ["docker/spark/Dockerfile", *_SPARK_CONTEXT])
    spark = _build(SPARK_IMAGE, root / "docker" / "spark" / "Dockerfile", root, base,
                   _digest(root, spark_files, base_id), rebuild)
    return kafka, spark


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.images",
                                     description="Build the docker-compose cluster's images unless unchanged.")
    parser.add_argument("--base", help=f"the Debian bookworm image to build FROM (default: {DEBIAN_BASE}, made "
                                       "with debootstrap; elsewhere debian:bookworm-slim)")
    parser.add_argument("--rebuild", action="store_true", help="build even when the inputs are unchanged")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for image in build_images(args.base, rebuild=args.rebuild):
            state = "built" if image.built else "unchanged"
            print(f"{image.image}: {state} in {image.seconds:.1f} s (inputs {image.inputs[:_TAG_DIGITS]})")
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
