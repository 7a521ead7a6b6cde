"""A pinned jar set: its Maven coordinates, the lock that names every jar with its size and SHA-256, and the
check of a directory of jars against that lock. No network and no resolution: fetching a set is
:mod:`controlmsg.clusters.maven_jars`, with the resolvers of :mod:`controlmsg.clusters.jar_resolvers`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlmsg.errors import LocalClusterError
from controlmsg.paths import cache_dir as default_cache_dir

__all__ = [
    "JAR_RESOLVER_ENV",
    "Coordinate",
    "JarSet",
    "LockedJar",
    "read_lock",
    "verify_jars",
]

JAR_RESOLVER_ENV: Final = "CONTROLMSG_JAR_RESOLVER"
LIBS: Final = "libs"
"""The directory of a set's verified jars, inside its directory in the cache."""


# ------------------------------------------------------------------------------------------ the set


@dataclass(frozen=True)
class Coordinate:
    """A Maven artifact, resolved in runtime scope; ``transitive=False``: that jar alone."""

    group: str
    artifact: str
    version: str
    transitive: bool = True

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class JarSet:
    """One pinned set of jars.

    Attributes:
        title: What the set is, for messages and logs (``"Apache Kafka 4.1.1's broker jars"``).
        directory: Its directory under the cache (``"kafka-4.1.1"``); the jars go to ``<it>/libs``.
        module: The Ivy/Maven module name of the resolution (``"kafka-runtime"``) and its revision.
        revision: The version the module is named with.
        coordinates: What is resolved.
        lock_file: The pin: ``<sha256>  <size>  <file name>.jar`` lines.
        error: What :func:`ensure_jars` raises for this set.
        resolver_env: The variable that picks a resolver (``ivy`` or ``maven``).
        shared_cache: ``False``: never resolve through the shared Ivy cache or ``~/.m2`` (a private one,
            deleted afterwards), so big jars are not kept twice.
    """

    title: str
    directory: str
    module: str
    revision: str
    coordinates: tuple[Coordinate, ...]
    lock_file: Path
    error: type[LocalClusterError] = LocalClusterError
    resolver_env: str = JAR_RESOLVER_ENV
    shared_cache: bool = True

    def libs(self, cache_dir: Path | None = None) -> Path:
        """Where the verified jars live: ``<cache_dir>/<directory>/libs`` (default cache:
        :func:`controlmsg.paths.cache_dir`). Does not create or verify anything."""
        root = (cache_dir if cache_dir is not None else default_cache_dir()).expanduser().resolve()
        return root / self.directory / LIBS



# ----------------------------------------------------------------------------------------- the lock


@dataclass(frozen=True)
class LockedJar:
    name: str
    size: int
    sha256: str


def read_lock(path: Path, error: type[LocalClusterError] = LocalClusterError) -> tuple[LockedJar, ...]:
    """The jars pinned in ``path``, sorted by name. Raises ``error`` when it is missing or a line is not
    ``<64 hex digits>  <size>  <file name>.jar`` (``#`` starts a comment)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read the jar lock {path}: {exc}") from exc
    jars: dict[str, LockedJar] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        ok = (len(fields) == 3 and len(fields[0]) == 64 and all(c in "0123456789abcdef" for c in fields[0])
              and fields[1].isdigit() and fields[2].endswith(".jar") and "/" not in fields[2]
              and fields[2] not in jars)
        if not ok:
            raise error(f"{path}, line {number}: not '<sha256>  <size>  <unique file name>.jar': {raw!r}")
        jars[fields[2]] = LockedJar(fields[2], int(fields[1]), fields[0])
    if not jars:
        raise error(f"the jar lock {path} names no jar")
    return tuple(sorted(jars.values(), key=lambda jar: jar.name))


def file_sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex. Raises ``OSError`` when it cannot be read."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def verify_jars(directory: Path, lock: Sequence[LockedJar], *, exact: bool = True) -> list[str]:
    """What is wrong with the jars of ``directory`` against ``lock``; empty when every locked jar is there with
    its size and SHA-256 (and, ``exact``, nothing else is there). Each entry names one file."""
    problems: list[str] = []
    try:
        present = {entry.name for entry in os.scandir(directory)}
    except OSError as exc:
        return [f"{directory}: {exc.strerror or exc}"]
    for jar in lock:
        path = directory / jar.name
        if jar.name not in present:
            problems.append(f"{jar.name}: missing")
            continue
        try:
            size = path.stat().st_size
            digest = file_sha256(path)
        except OSError as exc:
            problems.append(f"{jar.name}: cannot be read ({exc.strerror or exc})")
            continue
        if size != jar.size or digest != jar.sha256:
            problems.append(f"{jar.name}: expected sha256 {jar.sha256} ({jar.size} bytes), "
                            f"got sha256 {digest} ({size} bytes)")
    if exact:
        locked = {jar.name for jar in lock}
        problems += [f"{name}: not in the lock" for name in sorted(present - locked)]
    return problems
