"""Jar sets from Maven Central artifacts in the cache: resolved once, verified against their lock before use.

What the local clusters run from (Kafka's broker, :mod:`controlmsg.clusters.kafka_jars`; HDFS's minicluster,
:mod:`controlmsg.clusters.hdfs`; S3A's ``hadoop-aws`` and AWS SDK bundle, :mod:`controlmsg.clusters.s3`) is a
:class:`~controlmsg.clusters.jar_sets.JarSet`: Maven coordinates, a lock file next to the module that names
every jar of the set with its size and SHA-256, and a directory of its own in the cache
(:func:`controlmsg.paths.cache_dir`).

The set and its lock are :mod:`controlmsg.clusters.jar_sets`; the resolvers that fetch it (pyspark's Ivy, or
Maven; Java 17+) and the variables that pick one are :mod:`controlmsg.clusters.jar_resolvers`.

A resolution goes to a temporary directory inside ``<cache>/<set directory>/``; its jars are checked against
the lock (size and SHA-256), and only a complete, verified set is renamed into ``libs/`` in one step, so a jar
that does not match is never used. A resolution that fails or delivers another set is tried once more with a
fresh private cache (a damaged file in a shared Ivy cache or ``~/.m2`` cannot block it), then the next
resolver is. If none delivers, nothing is installed and the set's error names each jar with its expected and
actual checksum. A half-finished resolution (a killed process) stays in its temporary directory, is never
used, and is removed by the next one.

The cached ``libs/`` is verified in full (every jar's SHA-256) each time it is about to be used, and fetched
again when it fails: about 0.05 s for Kafka's 44 MB, about 0.8 s for S3A's 690 MB.

Maintainers: after a version change, ``python -m <module> --write-lock`` (each set's module) resolves the
set anew (no verification) and rewrites its lock; review the diff.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from controlmsg.clusters.jar_resolvers import RESOLVERS, Resolver, resolvers
from controlmsg.clusters.jar_sets import LIBS, JarSet, LockedJar, file_sha256, read_lock, verify_jars
from controlmsg.clusters.processes import file_lock
from controlmsg.errors import LocalClusterError

__all__ = [
    "ensure_jars",
    "lock_main",
    "write_lock",
]

_WORK_PREFIX = ".fetch-"
# Left by the Maven-only versions of the Kafka fetch; removed when a verified set is installed.
_LEGACY = ("libs.partial", "pom.xml", ".fetch-complete")

_logger = logging.getLogger(__name__)


def _summary(problems: Sequence[str], limit: int = 12) -> str:
    shown = [f"  {p}" for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f"  ... and {len(problems) - limit} more")
    return "\n".join(shown)


# ---------------------------------------------------------------------------------------- the cache


def ensure_jars(jar_set: JarSet, cache_dir: Path | None = None, *,
                find_resolvers: Callable[[], Sequence[Resolver]] | None = None) -> Path:
    """Make sure the locked jars of ``jar_set`` are in the cache, verified, and return their directory.

    The jars live in :meth:`JarSet.libs` (``cache_dir`` defaults to :func:`controlmsg.paths.cache_dir`).
    When that directory holds exactly the jars of the lock, each with its SHA-256, it is returned at once,
    without any network access. Otherwise (first use, a damaged or half-written jar, a stray file) the set is
    resolved anew (see the module docstring) and installed only once complete and verified. Concurrent
    callers are serialised with a file lock. ``find_resolvers`` (default :func:`resolvers` of the set) is
    called only when a resolution is needed.

    Blocks: while the jars are hashed; the first time, while a resolver downloads them (at most 15 minutes
    each), or while another process holds the lock.

    Raises:
        LocalClusterError: (the set's ``error`` class) no resolver is available (the message names what to
            install), or none delivered the locked set (each jar that differed with its expected and actual
            SHA-256, or each resolver's failure with the tail of its output), or the cache cannot be written.
    """
    libs = jar_set.libs(cache_dir)
    root = libs.parent
    lock = read_lock(jar_set.lock_file, jar_set.error)
    if libs.is_dir() and not verify_jars(libs, lock):
        return libs
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise jar_set.error(f"cannot create the cache directory {root} for {jar_set.title}: {exc}") from exc
    with file_lock(root / ".fetch.lock"):
        if libs.is_dir():
            problems = verify_jars(libs, lock)
            if not problems:
                return libs
            _logger.warning("the cached %s in %s fail verification; fetching them again:\n%s",
                            jar_set.title, libs, _summary(problems))
        _remove_leftovers(root)
        found = find_resolvers() if find_resolvers is not None else resolvers(jar_set)
        return _fetch(jar_set, root, lock, found)


def _remove_leftovers(root: Path) -> None:
    """Remove what killed resolutions left (called with the fetch lock held: none is running)."""
    for entry in root.iterdir():
        if entry.name.startswith(_WORK_PREFIX) or entry.name in _LEGACY:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _fetch(jar_set: JarSet, root: Path, lock: Sequence[LockedJar], found: Sequence[Resolver]) -> Path:
    libs = root / LIBS
    failures: list[str] = []
    for resolver in found:
        for fresh_cache in (False, True):
            label = f"{resolver.name} (fresh cache)" if fresh_cache else resolver.name
            try:
                work = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=root))
            except OSError as exc:
                raise jar_set.error(f"cannot create a temporary directory in {root}: {exc}") from exc
            try:
                started = time.monotonic()
                try:
                    jars = resolver.resolve(work, fresh_cache)
                except (LocalClusterError, OSError) as exc:
                    _logger.warning("%s could not fetch %s: %s", label, jar_set.title, str(exc).splitlines()[0])
                    failures.append(f"{label}: {exc}")
                    continue
                problems = verify_jars(jars, lock, exact=False)
                if not problems:
                    _install(jar_set, jars, work, lock, libs)
                    _logger.info("fetched and verified %s (%d jars) with %s in %.1f s into %s",
                                 jar_set.title, len(lock), label, time.monotonic() - started, libs)
                    return libs
                _logger.warning("the jars that %s delivered for %s are refused:\n%s", label, jar_set.title,
                                _summary(problems))
                failures.append(f"{label} delivered jars that differ from the lock {jar_set.lock_file}:\n"
                                + _summary(problems))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    raise jar_set.error(f"cannot fetch {jar_set.title} into {libs}; nothing was installed:\n" + "\n".join(failures))


def _install(jar_set: JarSet, jars: Path, work: Path, lock: Sequence[LockedJar], libs: Path) -> None:
    """Move the verified locked jars of ``jars`` (only those) into ``libs`` in one rename."""
    staged = work / LIBS
    try:
        staged.mkdir()
        for jar in lock:
            os.replace(jars / jar.name, staged / jar.name)
        if libs.exists():
            old = work / "replaced"
            libs.rename(old)
        staged.rename(libs)
    except OSError as exc:
        raise jar_set.error(f"cannot install {jar_set.title} into {libs}: {exc}") from exc


# ---------------------------------------------------------------------------------- the lock writer


def write_lock(jar_set: JarSet, resolver_name: str | None = None, path: Path | None = None) -> Path:
    """Resolve ``jar_set`` anew with ``resolver_name`` (default: the first available) and write its lock to
    ``path`` (default: the set's ``lock_file``). No verification: review the diff."""
    path = path if path is not None else jar_set.lock_file
    candidates = resolvers(jar_set)
    if resolver_name is not None:
        candidates = [r for r in candidates if r.name == resolver_name]
        if not candidates:
            raise jar_set.error(f"the {resolver_name} resolver is not available here")
    with tempfile.TemporaryDirectory(prefix="controlmsg-lock-") as tmp:
        jars = candidates[0].resolve(Path(tmp), True)
        lines = [
            f"# {jar_set.title} for controlmsg.clusters: exactly these jars.",
            "# The runtime dependencies of " + ", ".join(
                str(c) + ("" if c.transitive else " (alone)") for c in jar_set.coordinates) + ".",
            f"# Written by `--write-lock` ({candidates[0].name}) of controlmsg.clusters.maven_jars.",
            "# sha256  size  file",
        ]
        for jar in sorted(jars.iterdir(), key=lambda p: p.name):
            if jar.is_file():
                lines.append(f"{file_sha256(jar)}  {jar.stat().st_size}  {jar.name}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def lock_main(jar_set: JarSet, prog: str, ensure: Callable[[Path | None], Path],
              argv: Sequence[str] | None = None) -> int:
    """A command line for one set: fetch and verify it (``ensure(cache_dir)``) and print its directory, or
    ``--write-lock``. Returns the exit code (1 with ``error: ...`` on stderr when it fails)."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Fetch and verify {jar_set.title}.")
    parser.add_argument("--cache-dir", type=Path, help="default: $CONTROLMSG_CACHE_DIR or ~/.cache/controlmsg")
    parser.add_argument("--write-lock", action="store_true",
                        help=f"resolve anew and rewrite {jar_set.lock_file.name} instead "
                             "(maintainers, after a version change)")
    parser.add_argument("--resolver", choices=RESOLVERS, help="with --write-lock: the resolver to use")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.write_lock:
            print(write_lock(jar_set, args.resolver))
        else:
            print(ensure(args.cache_dir))
    except LocalClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
