"""Apache Kafka's broker jars: resolved once from Maven Central artifacts, pinned, verified before every use.

The local broker (:mod:`controlmsg.clusters.broker`, :mod:`controlmsg.clusters.kraft_cluster`) runs
``org.apache.kafka:kafka_2.13`` with its runtime dependencies plus a log4j SLF4J binding. The exact jar set
is pinned in ``kafka-jars.lock`` next to this module: every jar's file name, size and SHA-256, and nothing
else is on the broker's classpath.

Prerequisites: Java 17+, and one resolver, tried in this order:

1. ``ivy``: Apache Ivy, the resolver Spark's ``--packages`` is built on, run from the ``ivy-*.jar`` that the
   pyspark installation ships (``org.apache.ivy.Main``; one small JVM, no SparkContext). It uses Ivy's own
   default settings (Maven Central) and cache (Spark's default Ivy cache, ``~/.ivy2.5.2/cache``, shared
   with ``spark-submit --packages``), or the Ivy settings file named by ``CONTROLMSG_IVY_SETTINGS`` (the
   same kind of file as Spark's ``spark.jars.ivySettings``: mirrors, credentials, its own cache); Java's
   proxy properties (``JAVA_TOOL_OPTIONS=-Dhttps.proxyHost=...``) apply too. Spark's
   own ``--packages`` resolution is not used because it always leaves out ``scala-library``, which the
   broker needs.
2. ``maven``: ``mvn dependency:copy-dependencies`` when ``mvn`` is on ``PATH``, with Maven's own settings
   (``~/.m2/settings.xml``) and local repository.

``CONTROLMSG_KAFKA_RESOLVER=ivy|maven`` picks one and only that one. No registry address is written here.

A resolution goes to a temporary directory inside ``<cache>/kafka-<version>/``; its jars are checked against
the lock (size and SHA-256), and only a complete, verified set is renamed into ``libs/`` in one step, so a
jar that does not match is never used. A resolution that fails or delivers another set is tried once more
with a fresh private cache (a damaged file in a shared Ivy cache or ``~/.m2`` cannot block it), then the
next resolver is. If none delivers, nothing is installed and :class:`BrokerError` names each jar with its
expected and actual checksum. A half-finished resolution (a killed process) stays in its temporary
directory, is never used, and is removed by the next one.

The cached ``libs/`` is verified in full (every jar's SHA-256; about 0.05 s for the 44 MB) each time it is
about to be used, and fetched again when it fails.

Maintainers: after a version change, ``python -m controlmsg.clusters.kafka_jars --write-lock`` resolves the
set anew (no verification) and rewrites the lock; review the diff.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from controlmsg.clusters.processes import file_lock, java_executable, run_tool
from controlmsg.errors import BrokerError
from controlmsg.paths import cache_dir as default_cache_dir

__all__ = [
    "IVY_SETTINGS_ENV",
    "KAFKA_VERSION",
    "LOCK_FILE",
    "RESOLVERS",
    "RESOLVER_ENV",
    "LockedJar",
    "ensure_kafka_libs",
    "read_lock",
    "verify_jars",
]

KAFKA_VERSION: Final = "4.1.1"
"""Apache Kafka version that is fetched and run."""

SCALA_VERSION: Final = "2.13"
# Kafka 4.1 resolves slf4j-api 1.7.x, so the SLF4J 1.x binding is the one that binds.
LOG4J_VERSION: Final = "2.24.3"
_DEPENDENCY_PLUGIN_VERSION: Final = "3.8.1"

COORDINATES: Final = (
    ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
)
"""What is resolved (runtime scope, transitively): group, artifact, version."""

LOCK_FILE: Final = Path(__file__).with_name("kafka-jars.lock")
"""The pinned jar set: ``<sha256>  <size>  <file name>`` lines."""

RESOLVER_ENV: Final = "CONTROLMSG_KAFKA_RESOLVER"
IVY_SETTINGS_ENV: Final = "CONTROLMSG_IVY_SETTINGS"
RESOLVERS: Final = ("ivy", "maven")

_RESOLVE_TIMEOUT = 900.0
_IVY_ORGANISATION = "controlmsg.local"
_WORK_PREFIX = ".fetch-"
_LIBS = "libs"
# Left by the Maven-only versions of this code; removed when a verified set is installed.
_LEGACY = ("libs.partial", "pom.xml", ".fetch-complete")

_logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- the lock


@dataclass(frozen=True)
class LockedJar:
    name: str
    size: int
    sha256: str


def read_lock(path: Path | None = None) -> tuple[LockedJar, ...]:
    """The jars pinned in ``path``, sorted by name. Raises :class:`BrokerError` when it is missing or a line is
    not ``<64 hex digits>  <size>  <file name>.jar`` (``#`` starts a comment). Default: :data:`LOCK_FILE`."""
    path = path if path is not None else LOCK_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BrokerError(f"cannot read the Kafka jar lock {path}: {exc}") from exc
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
            raise BrokerError(f"{path}, line {number}: not '<sha256>  <size>  <unique file name>.jar': {raw!r}")
        jars[fields[2]] = LockedJar(fields[2], int(fields[1]), fields[0])
    if not jars:
        raise BrokerError(f"the Kafka jar lock {path} names no jar")
    return tuple(sorted(jars.values(), key=lambda jar: jar.name))


def _sha256(path: Path) -> str:
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
            digest = _sha256(path)
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


def _summary(problems: Sequence[str], limit: int = 12) -> str:
    shown = [f"  {p}" for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f"  ... and {len(problems) - limit} more")
    return "\n".join(shown)


# ------------------------------------------------------------------------------------------- resolvers


@dataclass(frozen=True)
class _Resolver:
    """``resolve(work_dir, fresh_cache)`` fills a directory inside ``work_dir`` with jars and returns it;
    ``fresh_cache``: bypass the shared cache (a private one inside ``work_dir``)."""

    name: str
    resolve: Callable[[Path, bool], Path]


def _pyspark_ivy_jar() -> Path | None:
    """The Ivy jar shipped in pyspark's ``jars/``, found without importing pyspark."""
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        found = sorted(Path(location, "jars").glob("ivy-*.jar"))
        if found:
            return found[-1]
    return None


def _ivy_module_xml(module: str = "kafka-runtime") -> str:
    deps = "\n".join(
        f'    <dependency org="{group}" name="{artifact}" rev="{version}" conf="default->default(runtime)"/>'
        for group, artifact, version in COORDINATES
    )
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by controlmsg.clusters.kafka_jars; only used to fetch Kafka's runtime jars. -->
<ivy-module version="2.0">
  <info organisation="{_IVY_ORGANISATION}" module="{module}" revision="{KAFKA_VERSION}"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
{deps}
  </dependencies>
</ivy-module>
"""


def _spark_ivy_cache() -> Path:
    """Spark's default Ivy cache (``spark.jars.ivy`` unset): shared with ``spark-submit --packages``."""
    return Path.home() / ".ivy2.5.2" / "cache"


def _ivy_resolver(ivy_jar: Path) -> _Resolver:
    def resolve(work: Path, fresh_cache: bool) -> Path:
        # A module name of its own, as Spark does: resolutions running at once (other cache directories, the
        # same shared Ivy cache) never write the same resolution files there; they are removed afterwards.
        module = f"kafka-runtime-{uuid.uuid4().hex[:16]}"
        descriptor = work / "ivy.xml"
        descriptor.write_text(_ivy_module_xml(module), encoding="utf-8")
        out = work / "jars"
        # As Spark's --packages: no lookup of -sources and -javadoc jars (half the requests of Ivy's default).
        cmd = [java_executable(), "-Divy.maven.lookup.sources=false", "-Divy.maven.lookup.javadoc=false",
               "-jar", str(ivy_jar)]
        settings = os.environ.get(IVY_SETTINGS_ENV, "").strip()
        cache: Path | None = None
        if settings:
            cmd += ["-settings", str(Path(settings).expanduser())]
        if fresh_cache:
            cache = work / "ivy-cache"
        elif not settings:  # a settings file chooses its own cache
            cache = _spark_ivy_cache()
        if cache is not None:
            cmd += ["-cache", str(cache)]
        cmd += ["-ivy", str(descriptor), "-confs", "default", "-warn",
                "-retrieve", str(out / "[artifact]-[revision](-[classifier]).[ext]")]
        try:
            _run(cmd, work)
        finally:
            if cache is not None and cache.is_dir():
                for leftover in cache.glob(f"*{_IVY_ORGANISATION}-{module}-*"):
                    leftover.unlink(missing_ok=True)
        return out

    return _Resolver("ivy", resolve)


def _pom_xml() -> str:
    deps = "\n".join(
        f"""\
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>"""
        for group, artifact, version in COORDINATES
    )
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by controlmsg.clusters.kafka_jars; only used to fetch Kafka's runtime jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>controlmsg.local</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>{_DEPENDENCY_PLUGIN_VERSION}</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
"""


def _maven_resolver(mvn: str) -> _Resolver:
    def resolve(work: Path, fresh_cache: bool) -> Path:
        pom = work / "pom.xml"
        pom.write_text(_pom_xml(), encoding="utf-8")
        out = work / "jars"
        cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
        if fresh_cache:
            cmd.append(f"-Dmaven.repo.local={work / 'm2'}")
        _run(cmd, work)
        return out

    return _Resolver("maven", resolve)


def _run(cmd: Sequence[str], cwd: Path) -> None:
    _logger.info("fetching Apache Kafka %s jars: %s", KAFKA_VERSION, shlex.join(cmd))
    run_tool(cmd, f"fetching the Kafka {KAFKA_VERSION} jars", _RESOLVE_TIMEOUT, cwd)


def _resolvers() -> list[_Resolver]:
    """The resolvers to try, in order. Raises :class:`BrokerError` naming what to install when there is none."""
    wanted = os.environ.get(RESOLVER_ENV, "").strip().lower()
    if wanted and wanted not in RESOLVERS:
        raise BrokerError(f"{RESOLVER_ENV}={wanted!r}: expected one of {', '.join(RESOLVERS)} (or unset)")
    found: list[_Resolver] = []
    if wanted in ("", "ivy"):
        ivy_jar = _pyspark_ivy_jar()
        if ivy_jar is not None:
            found.append(_ivy_resolver(ivy_jar))
        elif wanted:
            raise BrokerError(f"{RESOLVER_ENV}=ivy, but pyspark (whose jars include Apache Ivy) is not installed "
                              "in this Python; install it (pip install 'controlmsg[spark]') or unset the variable")
    if wanted in ("", "maven"):
        mvn = shutil.which("mvn")
        if mvn is not None:
            found.append(_maven_resolver(mvn))
        elif wanted:
            raise BrokerError(f"{RESOLVER_ENV}=maven, but Apache Maven (`mvn`) is not on PATH; install it or unset "
                              "the variable")
    if not found:
        raise BrokerError(
            f"cannot fetch Apache Kafka {KAFKA_VERSION}'s jars: pyspark is not installed in this Python "
            f"({sys.executable}) and Apache Maven (`mvn`) is not on PATH. Install pyspark "
            "(pip install 'controlmsg[spark]'; it brings Apache Ivy, which fetches them), or Maven; "
            "either needs Java 17+"
        )
    return found


# ------------------------------------------------------------------------------------------ the cache


def ensure_kafka_libs(cache_dir: Path | None = None) -> Path:
    """Make sure the locked Kafka jars are in the cache, verified, and return their directory.

    The jars live in ``<cache_dir>/kafka-<KAFKA_VERSION>/libs`` (``cache_dir`` defaults to
    :func:`controlmsg.paths.cache_dir`). When that directory holds exactly the jars of the lock, each with
    its SHA-256, it is returned at once. Otherwise (first use, a damaged or half-written jar, a stray file)
    the set is resolved anew (see the module docstring) and installed only once complete and verified.
    Concurrent callers are serialised with a file lock.

    Blocks: while the jars are hashed (about 0.05 s); the first time, while a resolver downloads about
    44 MB (seconds to a minute; at most 15 minutes each), or while another process holds the lock.

    Raises:
        BrokerError: no resolver is available (the message names what to install), or none delivered
            the locked set (each jar that differed with its expected and actual SHA-256, or each
            resolver's failure with the tail of its output), or the cache cannot be written.
    """
    root = (cache_dir if cache_dir is not None else default_cache_dir()).expanduser().resolve()
    root = root / f"kafka-{KAFKA_VERSION}"
    libs = root / _LIBS
    lock = read_lock(LOCK_FILE)
    if libs.is_dir() and not verify_jars(libs, lock):
        return libs
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BrokerError(f"cannot create the Kafka cache directory {root}: {exc}") from exc
    with file_lock(root / ".fetch.lock"):
        if libs.is_dir():
            problems = verify_jars(libs, lock)
            if not problems:
                return libs
            _logger.warning("the cached Kafka jars in %s fail verification; fetching them again:\n%s",
                            libs, _summary(problems))
        _remove_leftovers(root)
        return _fetch(root, lock, _resolvers())


def _remove_leftovers(root: Path) -> None:
    """Remove what killed resolutions left (called with the fetch lock held: none is running)."""
    for entry in root.iterdir():
        if entry.name.startswith(_WORK_PREFIX) or entry.name in _LEGACY:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _fetch(root: Path, lock: Sequence[LockedJar], resolvers: Sequence[_Resolver]) -> Path:
    libs = root / _LIBS
    failures: list[str] = []
    for resolver in resolvers:
        for fresh_cache in (False, True):
            label = f"{resolver.name} (fresh cache)" if fresh_cache else resolver.name
            try:
                work = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=root))
            except OSError as exc:
                raise BrokerError(f"cannot create a temporary directory in {root}: {exc}") from exc
            try:
                started = time.monotonic()
                try:
                    jars = resolver.resolve(work, fresh_cache)
                except (BrokerError, OSError) as exc:
                    _logger.warning("%s could not fetch the Kafka jars: %s", label, str(exc).splitlines()[0])
                    failures.append(f"{label}: {exc}")
                    continue
                problems = verify_jars(jars, lock, exact=False)
                if not problems:
                    _install(jars, work, lock, libs)
                    _logger.info("fetched and verified %d Kafka jars with %s in %.1f s into %s",
                                 len(lock), label, time.monotonic() - started, libs)
                    return libs
                _logger.warning("the Kafka jars that %s delivered are refused:\n%s", label, _summary(problems))
                failures.append(f"{label} delivered jars that differ from the lock {LOCK_FILE}:\n"
                                + _summary(problems))
            finally:
                shutil.rmtree(work, ignore_errors=True)
    raise BrokerError(
        f"cannot fetch Apache Kafka {KAFKA_VERSION}'s jars into {libs}; nothing was installed:\n"
        + "\n".join(failures)
    )


def _install(jars: Path, work: Path, lock: Sequence[LockedJar], libs: Path) -> None:
    """Move the verified locked jars of ``jars`` (only those) into ``libs`` in one rename."""
    staged = work / _LIBS
    try:
        staged.mkdir()
        for jar in lock:
            os.replace(jars / jar.name, staged / jar.name)
        if libs.exists():
            old = work / "replaced"
            libs.rename(old)
        staged.rename(libs)
    except OSError as exc:
        raise BrokerError(f"cannot install the Kafka jars into {libs}: {exc}") from exc


# -------------------------------------------------------------------------------------- the lock writer


def write_lock(resolver_name: str | None = None, path: Path | None = None) -> Path:
    """Resolve the set anew with ``resolver_name`` (default: the first available) and write it to ``path``
    (default :data:`LOCK_FILE`)."""
    path = path if path is not None else LOCK_FILE
    candidates = _resolvers()
    if resolver_name is not None:
        candidates = [r for r in candidates if r.name == resolver_name]
        if not candidates:
            raise BrokerError(f"the {resolver_name} resolver is not available here")
    with tempfile.TemporaryDirectory(prefix="controlmsg-lock-") as tmp:
        jars = candidates[0].resolve(Path(tmp), True)
        lines = [
            f"# Apache Kafka {KAFKA_VERSION} broker classpath for controlmsg.clusters (kafka_jars.py): "
            "exactly these jars.",
            "# The runtime dependencies of " + ", ".join(":".join(c) for c in COORDINATES) + ".",
            f"# Written by `python -m controlmsg.clusters.kafka_jars --write-lock` ({candidates[0].name}); "
            "Ivy and Maven resolve the same set.",
            "# sha256  size  file",
        ]
        for jar in sorted(jars.iterdir(), key=lambda p: p.name):
            if jar.is_file():
                lines.append(f"{_sha256(jar)}  {jar.stat().st_size}  {jar.name}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controlmsg.clusters.kafka_jars",
                                     description="Fetch and verify the local broker's Kafka jars.")
    parser.add_argument("--cache-dir", type=Path, help="default: $CONTROLMSG_CACHE_DIR or ~/.cache/controlmsg")
    parser.add_argument("--write-lock", action="store_true",
                        help=f"resolve anew and rewrite {LOCK_FILE.name} instead (maintainers, after a version change)")
    parser.add_argument("--resolver", choices=RESOLVERS, help="with --write-lock: the resolver to use")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.write_lock:
            print(write_lock(args.resolver))
        else:
            print(ensure_kafka_libs(args.cache_dir))
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
