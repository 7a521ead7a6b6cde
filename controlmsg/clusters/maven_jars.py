"""Jar sets from Maven Central artifacts: resolved once, pinned by SHA-256 in a lock file, verified before use.

What the local clusters run from (Kafka's broker, :mod:`controlmsg.clusters.kafka_jars`; HDFS's minicluster,
:mod:`controlmsg.clusters.hdfs`; S3A's ``hadoop-aws`` and AWS SDK bundle, :mod:`controlmsg.clusters.s3`) is a
:class:`JarSet`: Maven coordinates, a lock file next to the module that names every jar of the set with its
size and SHA-256, and a directory of its own in the cache (:func:`controlmsg.paths.cache_dir`).

Prerequisites: Java 17+, and one resolver, tried in this order:

1. ``ivy``: Apache Ivy, the resolver Spark's ``--packages`` is built on, run from the ``ivy-*.jar`` that the
   pyspark installation ships (``org.apache.ivy.Main``; one small JVM, no SparkContext). It uses Ivy's own
   default settings (Maven Central) and cache (Spark's default Ivy cache, ``~/.ivy2.5.2/cache``, shared
   with ``spark-submit --packages``), or the Ivy settings file named by ``CONTROLMSG_IVY_SETTINGS`` (the
   same kind of file as Spark's ``spark.jars.ivySettings``: mirrors, credentials, its own cache); Java's
   proxy properties (``JAVA_TOOL_OPTIONS=-Dhttps.proxyHost=...``) apply too.
2. ``maven``: ``mvn dependency:copy-dependencies`` when ``mvn`` is on ``PATH``, with Maven's own settings
   (``~/.m2/settings.xml``) and local repository.

The set's ``resolver_env`` variable (``CONTROLMSG_JAR_RESOLVER``; Kafka's set keeps its own
``CONTROLMSG_KAFKA_RESOLVER``) set to ``ivy`` or ``maven`` picks one and only that one. No registry address
is written here. A set with ``shared_cache=False`` (the 650 MB AWS SDK bundle) is always resolved with a
private cache that is deleted afterwards, so its jars are on disk once, in controlmsg's cache.

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
from controlmsg.errors import LocalClusterError
from controlmsg.paths import cache_dir as default_cache_dir

__all__ = [
    "IVY_SETTINGS_ENV",
    "JAR_RESOLVER_ENV",
    "RESOLVERS",
    "Coordinate",
    "JarSet",
    "LockedJar",
    "Resolver",
    "ensure_jars",
    "ivy_module_xml",
    "ivy_resolver",
    "lock_main",
    "maven_resolver",
    "pom_xml",
    "pyspark_ivy_jar",
    "read_lock",
    "resolvers",
    "spark_ivy_cache",
    "verify_jars",
    "write_lock",
]

JAR_RESOLVER_ENV: Final = "CONTROLMSG_JAR_RESOLVER"
IVY_SETTINGS_ENV: Final = "CONTROLMSG_IVY_SETTINGS"
RESOLVERS: Final = ("ivy", "maven")

_RESOLVE_TIMEOUT = 900.0
_IVY_ORGANISATION = "controlmsg.local"
_WORK_PREFIX = ".fetch-"
_LIBS = "libs"
_DEPENDENCY_PLUGIN_VERSION: Final = "3.8.1"
# Left by the Maven-only versions of the Kafka fetch; removed when a verified set is installed.
_LEGACY = ("libs.partial", "pom.xml", ".fetch-complete")

_logger = logging.getLogger(__name__)


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
        return root / self.directory / _LIBS


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


# ---------------------------------------------------------------------------------------- resolvers


@dataclass(frozen=True)
class Resolver:
    """``resolve(work_dir, fresh_cache)`` fills a directory inside ``work_dir`` with jars and returns it;
    ``fresh_cache``: bypass the shared cache (a private one inside ``work_dir``)."""

    name: str
    resolve: Callable[[Path, bool], Path]


def pyspark_ivy_jar() -> Path | None:
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


def ivy_module_xml(jar_set: JarSet, module: str | None = None) -> str:
    """The Ivy module descriptor that resolves ``jar_set`` (named ``module``, default the set's)."""
    deps = "\n".join(
        f'    <dependency org="{c.group}" name="{c.artifact}" rev="{c.version}" conf="default->default(runtime)"'
        + ('' if c.transitive else ' transitive="false"') + "/>"
        for c in jar_set.coordinates
    )
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by controlmsg.clusters.maven_jars; only used to fetch {jar_set.title}. -->
<ivy-module version="2.0">
  <info organisation="{_IVY_ORGANISATION}" module="{module or jar_set.module}" revision="{jar_set.revision}"/>
  <configurations><conf name="default"/></configurations>
  <dependencies>
{deps}
  </dependencies>
</ivy-module>
"""


def spark_ivy_cache() -> Path:
    """Spark's default Ivy cache (``spark.jars.ivy`` unset): shared with ``spark-submit --packages``."""
    return Path.home() / ".ivy2.5.2" / "cache"


def ivy_resolver(jar_set: JarSet, ivy_jar: Path) -> Resolver:
    """Resolve ``jar_set`` with ``java -jar ivy_jar`` (see the module docstring)."""

    def resolve(work: Path, fresh_cache: bool) -> Path:
        # A module name of its own, as Spark does: resolutions running at once (other cache directories, the
        # same shared Ivy cache) never write the same resolution files there; they are removed afterwards.
        module = f"{jar_set.module}-{uuid.uuid4().hex[:16]}"
        descriptor = work / "ivy.xml"
        descriptor.write_text(ivy_module_xml(jar_set, module), encoding="utf-8")
        out = work / "jars"
        # As Spark's --packages: no lookup of -sources and -javadoc jars (half the requests of Ivy's default).
        cmd = [java_executable(), "-Divy.maven.lookup.sources=false", "-Divy.maven.lookup.javadoc=false",
               "-jar", str(ivy_jar)]
        settings = os.environ.get(IVY_SETTINGS_ENV, "").strip()
        cache: Path | None = None
        if settings:
            cmd += ["-settings", str(Path(settings).expanduser())]
        if fresh_cache or not jar_set.shared_cache:
            cache = work / "ivy-cache"
        elif not settings:  # a settings file chooses its own cache
            cache = spark_ivy_cache()
        if cache is not None:
            cmd += ["-cache", str(cache)]
        cmd += ["-ivy", str(descriptor), "-confs", "default", "-warn",
                "-retrieve", str(out / "[artifact]-[revision](-[classifier]).[ext]")]
        try:
            _run(jar_set, cmd, work)
        finally:
            if cache is not None and cache.is_dir():
                for leftover in cache.glob(f"*{_IVY_ORGANISATION}-{module}-*"):
                    leftover.unlink(missing_ok=True)
        return out

    return Resolver("ivy", resolve)


def pom_xml(jar_set: JarSet) -> str:
    """The Maven project that resolves ``jar_set`` with ``dependency:copy-dependencies``."""
    exclude_all = """
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"""
    deps = "\n".join(
        f"""\
    <dependency>
      <groupId>{c.group}</groupId>
      <artifactId>{c.artifact}</artifactId>
      <version>{c.version}</version>{'' if c.transitive else exclude_all}
    </dependency>"""
        for c in jar_set.coordinates
    )
    return f"""\
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by controlmsg.clusters.maven_jars; only used to fetch {jar_set.title}. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>{_IVY_ORGANISATION}</groupId>
  <artifactId>{jar_set.module}</artifactId>
  <version>{jar_set.revision}</version>
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


def maven_resolver(jar_set: JarSet, mvn: str) -> Resolver:
    """Resolve ``jar_set`` with ``mvn dependency:copy-dependencies`` (see the module docstring)."""

    def resolve(work: Path, fresh_cache: bool) -> Path:
        pom = work / "pom.xml"
        pom.write_text(pom_xml(jar_set), encoding="utf-8")
        out = work / "jars"
        cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={out}", "-DincludeScope=runtime"]
        if fresh_cache or not jar_set.shared_cache:
            cmd.append(f"-Dmaven.repo.local={work / 'm2'}")
        _run(jar_set, cmd, work)
        return out

    return Resolver("maven", resolve)


def _run(jar_set: JarSet, cmd: Sequence[str], cwd: Path) -> None:
    _logger.info("fetching %s: %s", jar_set.title, shlex.join(cmd))
    run_tool(cmd, f"fetching {jar_set.title}", _RESOLVE_TIMEOUT, cwd)


def resolvers(jar_set: JarSet, ivy_jar: Callable[[], Path | None] = pyspark_ivy_jar) -> list[Resolver]:
    """The resolvers to try for ``jar_set``, in order (``ivy_jar``: where pyspark's Ivy is). Raises the set's
    error naming what to install when there is none, or when its ``resolver_env`` asks for one that is not
    there."""
    error, env = jar_set.error, jar_set.resolver_env
    wanted = os.environ.get(env, "").strip().lower()
    if wanted and wanted not in RESOLVERS:
        raise error(f"{env}={wanted!r}: expected one of {', '.join(RESOLVERS)} (or unset)")
    found: list[Resolver] = []
    if wanted in ("", "ivy"):
        jar = ivy_jar()
        if jar is not None:
            found.append(ivy_resolver(jar_set, jar))
        elif wanted:
            raise error(f"{env}=ivy, but pyspark (whose jars include Apache Ivy) is not installed "
                        "in this Python; install it (pip install 'controlmsg[spark]') or unset the variable")
    if wanted in ("", "maven"):
        mvn = shutil.which("mvn")
        if mvn is not None:
            found.append(maven_resolver(jar_set, mvn))
        elif wanted:
            raise error(f"{env}=maven, but Apache Maven (`mvn`) is not on PATH; install it or unset the variable")
    if not found:
        raise error(
            f"cannot fetch {jar_set.title}: pyspark is not installed in this Python "
            f"({sys.executable}) and Apache Maven (`mvn`) is not on PATH. Install pyspark "
            "(pip install 'controlmsg[spark]'; it brings Apache Ivy, which fetches them), or Maven; "
            "either needs Java 17+"
        )
    return found


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
    libs = root / _LIBS
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
                lines.append(f"{_sha256(jar)}  {jar.stat().st_size}  {jar.name}")
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
