"""A JVM class-data archive for Spark drivers: every Spark application after the first starts in about
half the CPU.

A Spark driver loads some 13,000 classes before its first query ends; parsing and verifying them is most of
its start-up. Java's class-data sharing (CDS) can map them from an archive instead. Measured on the
project's 2-core machine (a ``local[2]`` session and one small aggregation, JVM CPU of the application):
17-19 s without the archive, 9-10 s with it; the session starts in 3.4 s instead of 6.3-6.9 s. Three jobs of
a pipeline start at once on shared cores, so what one start saves, the others get.

How (``-XX:ArchiveClassesAtExit``, Java 13+): the first :func:`driver_java_options` on a machine runs one
small Spark application in a child process with that option, waits until its JVM has written the archive
(about 35 s, once per Spark and Java installation) and moves it into place under :func:`controlmsg.paths.
cache_dir` (``jvm/``); concurrent first starts wait for that one build (a file lock). Every Spark driver
started through :func:`controlmsg.spark.spark_session` then gets ``-XX:SharedArchiveFile`` with it.

Safety: the archive is named after the pyspark version and installation, the ``java`` executable (path
and modification time) and Spark's jars (each one's name, size and modification time, which the JVM checks
before it maps an archive), so another Spark or Java gets another archive, and so does a Spark installed
again at the same place (a venv made anew: an archive of the jars it replaced would be ignored by every
JVM); once that one is built, the archive of the installation it replaced is removed. Each archive is about
180 MB and every new venv gets its own, so a build also removes all but the :data:`KEEP` archives used
last (a use touches the archive's modification time); an installation whose archive went builds it again.
An archive the JVM cannot use all the same (a JDK changed in place) is ignored by the JVM, which then
loads classes as usual; its CDS log lines are switched off. An archive is taken only once the JVM's own
log says it was written whole: a truncated archive would crash the JVM that maps it. A build that fails is
not retried for a day (a ``.failed`` file says why), and no start ever fails because of the archive.

Off with ``CONTROLMSG_CLASS_ARCHIVE=off`` (or ``spark_session(..., class_archive=False)``), and for a
session whose ``spark.driver.extraJavaOptions`` already chooses a CDS archive (``SharedArchiveFile``,
``ArchiveClassesAtExit``, ``-Xshare``).

Imports no pyspark until an archive is looked for or built, and nothing of controlmsg but
:mod:`controlmsg.paths`: the Spark image (docker/spark/Dockerfile) builds the archive with this module, the
package's root, ``errors``, ``paths``, ``core`` and ``controlmsg/spark/__init__.py`` (which imports no
pyspark) alone. ``controlmsg.clusters.class_archive`` is its deprecated old name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

from controlmsg.paths import cache_dir

__all__ = ["ENV", "KEEP", "archive_path", "build_archive", "driver_java_options"]

ENV: Final = "CONTROLMSG_CLASS_ARCHIVE"
"""``off`` (or ``0``, ``false``, ``no``): no archive is built or used."""
KEEP: Final = 4
"""How many archives (the ones used last) a build leaves in the cache, its own included."""
_QUIET: Final = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_WRITTEN: Final = "Written dynamic archive"  # the JVM's log line once the archive file is complete
_BUILD_TIMEOUT_S: Final = 300.0
_RETRY_AFTER_S: Final = 86_400.0
_OWN_CHOICE: Final = ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")


def _java() -> Path | None:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not Path(found).exists():
        return None
    return Path(found).resolve()


def archive_path() -> Path | None:
    """Where the archive for this pyspark, its jars and this ``java`` is (or would be); ``None`` without
    ``java``. The name is ``spark-<version>-<place>-<contents>.jsa``: ``place`` digests where Spark and
    ``java`` are installed, ``contents`` what is there now (``java``'s and every jar's modification time,
    the jars' names and sizes)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    home = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent).resolve()
    place = hashlib.sha256(f"{pyspark.__version__}|{home}|{java}".encode()).hexdigest()[:12]
    contents = hashlib.sha256(str(java.stat().st_mtime_ns).encode())
    for jar in sorted((home / "jars").glob("*.jar")):
        found = jar.stat()
        contents.update(f"|{jar.name}|{found.st_size}|{found.st_mtime_ns}".encode())
    return cache_dir() / "jvm" / f"spark-{pyspark.__version__}-{place}-{contents.hexdigest()[:12]}.jsa"


def _remove_replaced(path: Path) -> None:
    """Remove the archives (and their lock and failure files) of the installation ``path``'s replaced:
    the same version and place (:func:`archive_path`), other contents. No JVM can use them any more."""
    place = path.stem.rpartition("-")[0]
    for old in path.parent.glob(f"{place}-*"):
        if old.stem != path.stem and old.suffix in (".jsa", ".lock", ".failed"):
            with contextlib.suppress(OSError):
                old.unlink()


def _keep_last_used(directory: Path, keep: int) -> None:
    """Remove every archive in ``directory`` but the ``keep`` used last (by modification time), with their
    lock and failure files. A JVM that has one mapped keeps reading it: the file goes when it lets go."""
    used: list[tuple[int, Path]] = []
    for archive in directory.glob("spark-*.jsa"):
        with contextlib.suppress(OSError):  # gone meanwhile: another build removed it
            used.append((archive.stat().st_mtime_ns, archive))
    for _, old in sorted(used, reverse=True)[keep:]:
        for name in (old, old.with_suffix(".lock"), old.with_suffix(".failed")):
            with contextlib.suppress(OSError):
                name.unlink()


def _enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("off", "0", "false", "no")


def driver_java_options(existing: str = "") -> str:
    """The driver JVM options that make a Spark application start from the class archive, building the
    archive first if this machine has none (see the module docstring): ``existing`` (the session's
    ``spark.driver.extraJavaOptions``) with the archive's options added, or ``existing`` unchanged when
    the archive is off, chosen by ``existing`` already, or cannot be had. Never raises."""
    if not _enabled() or any(choice in existing for choice in _OWN_CHOICE):
        return existing
    try:
        path = archive_path()
        if path is None:
            return existing
        if not path.exists() and not build_archive(path):
            return existing
        os.utime(path)  # used now: the archives used last are the ones a build keeps
    except OSError:
        return existing
    return f"{existing} -XX:SharedArchiveFile={path} {_QUIET}".strip()


def build_archive(path: Path, timeout: float = _BUILD_TIMEOUT_S) -> bool:
    """Build the archive at ``path`` unless it exists: one small Spark application in a child process
    whose JVM writes it at exit. Holds ``<path>.lock`` meanwhile, so concurrent callers wait for one build.
    Returns whether the archive is there. A failure writes ``<path>.failed`` (its reason) and is not
    retried before a day has passed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    failed = path.with_suffix(".failed")
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if path.exists():
            return True  # another process built it while this one waited
        with contextlib.suppress(OSError):
            if time.time() - failed.stat().st_mtime < _RETRY_AFTER_S:
                return False
        with tempfile.TemporaryDirectory(prefix="build-", dir=path.parent) as work:
            partial, log = Path(work) / "spark.jsa", Path(work) / "dump.log"
            options = f"-XX:ArchiveClassesAtExit={partial} {_QUIET} -Xlog:cds+dynamic=info:file={log}"
            try:
                done = subprocess.run([sys.executable, "-m", __name__, options, work], capture_output=True,
                                      timeout=timeout, env={**os.environ, ENV: "off"})
                complete = log.exists() and _WRITTEN in log.read_text(errors="replace")
            except (OSError, subprocess.TimeoutExpired) as exc:
                failed.write_text(f"building the class archive failed: {exc}\n")
                return False
            if done.returncode != 0 or not complete or not partial.exists():
                tail = done.stderr.decode(errors="replace")[-2000:]
                failed.write_text(f"building the class archive failed (exit {done.returncode}, archive "
                                  f"{'written' if complete else 'not written'}):\n{tail}\n")
                return False
            os.replace(partial, path)  # the same file system: whole or not at all
        failed.unlink(missing_ok=True)
        _remove_replaced(path)
        _keep_last_used(path.parent, KEEP)
    return True


def _train(options: str, work: str) -> None:
    """The build's Spark application: the work most drivers start with (SQL planning and code generation,
    a shuffle, Python rows and an Arrow UDF in Python workers, files written and read), then a JVM exit
    this process waits for, since the archive is written as the JVM exits."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("controlmsg-class-archive")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.extraJavaOptions", options).getOrCreate())
    rows = spark.createDataFrame([(f"k{i % 7}", i, i * 0.5) for i in range(1000)], "key string, n long, x double")
    counted = rows.groupBy("key").agg(F.count("n"), F.sum("x")).orderBy("key")
    counted.write.mode("overwrite").json(f"{work}/json")
    counted.write.mode("overwrite").parquet(f"{work}/parquet")
    back = spark.read.json(f"{work}/json").unionByName(spark.read.parquet(f"{work}/parquet"))
    back = back.select(F.from_json(F.to_json(F.struct("*")), "key string").alias("j"), "*")
    back.mapInArrow(lambda batches: batches, back.schema).collect()
    proc = getattr(SparkContext._gateway, "proc", None)
    spark.stop()
    if proc is not None:  # pyspark's JVM exits when its stdin closes; the archive is written on the way out
        proc.stdin.close()
        proc.wait(_BUILD_TIMEOUT_S)


if __name__ == "__main__":
    _train(sys.argv[1], sys.argv[2])
