"""The JVM class-data archive of Spark drivers (controlmsg.spark.class_archive), with real JVMs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from controlmsg.paths import CACHE_ENV
from controlmsg.spark.class_archive import (
    ENV,
    KEEP,
    _keep_last_used,
    _remove_replaced,
    archive_path,
    build_archive,
    driver_java_options,
)


def test_the_test_session_driver_runs_with_the_archive(spark: SparkSession) -> None:
    """The session fixture came from spark_session(): its driver JVM was given the archive, which exists."""
    path = archive_path()
    assert path is not None and path.is_file()
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={path}" in arguments, arguments


SHARED = "source: shared objects file (top)"  # the class-load log's source of a class mapped from the archive


def class_loads(log: Path, master: str, key: str, action: str) -> list[str]:
    """The class-load log lines of the JVMs whose options ``key`` names (``spark.driver.extraJavaOptions`` or
    ``spark.executor.extraJavaOptions``), from a new application on ``master`` made by spark_session() in a
    child process (the archive on, whatever the environment says) that runs ``action`` on ``spark``."""
    script = textwrap.dedent(f"""
        from controlmsg.spark import spark_session
        spark = spark_session({master!r}, "class-archive-test", conf={{{key!r}: "-Xlog:class+load=info:file={log}"}})
        {action}
        spark.stop()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != ENV})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    return log.read_text(errors="replace").splitlines()


def test_a_driver_loads_spark_classes_from_the_archive(tmp_path: Path) -> None:
    """A new application started by spark_session() maps Spark's own classes from the archive: the JVM's
    class-load log names the archive ("shared objects file (top)": the dynamic archive) as their source."""
    lines = class_loads(tmp_path / "classes.log", "local[1]", "spark.driver.extraJavaOptions",
                        "assert spark.range(10).count() == 10")
    context = [line for line in lines if " org.apache.spark.SparkContext " in line]
    assert context and SHARED in context[0], context
    shared = sum(SHARED in line for line in lines)
    assert shared > 5000, f"only {shared} of {len(lines)} classes came from the archive"


def test_an_executor_of_a_cluster_on_this_machine_loads_spark_classes_from_the_archive(tmp_path: Path) -> None:
    """A master that is not local[...] runs executors in JVMs of their own: spark_session() gives them the
    archive too, and an executor (here of Spark's local-cluster master, a worker on this machine) maps most
    of its classes from it: those a driver loads too (5,419 of 7,905 measured; its backend's own are not in
    an archive made by a local driver)."""
    lines = class_loads(tmp_path / "executor-classes.log", "local-cluster[1,1,1024]",
                        "spark.executor.extraJavaOptions",
                        "assert spark.sparkContext.parallelize(range(10), 2).map(lambda x: x + 1).sum() == 55")
    conf = [line for line in lines if " org.apache.spark.SparkConf " in line]
    assert conf and SHARED in conf[0], conf
    shared = sum(SHARED in line for line in lines)
    assert shared > 4000, f"only {shared} of {len(lines)} classes came from the archive"


def test_an_archive_chosen_by_the_session_or_switched_off_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/elsewhere.jsa", "-XX:ArchiveClassesAtExit=/x.jsa -Dk=v"):
        assert driver_java_options(own) == own
    monkeypatch.setenv(ENV, "off")
    assert driver_java_options("-Dk=v") == "-Dk=v"
    assert driver_java_options() == ""


def test_a_failed_build_leaves_no_archive_and_is_not_retried_within_a_day(tmp_path: Path) -> None:
    """The build's child is stopped long before its JVM could write anything: no archive appears, the
    reason is kept, and the next call neither retries (the reason stays as it was) nor raises."""
    path = tmp_path / "jvm" / "spark-test.jsa"
    assert build_archive(path, timeout=0.01) is False
    failed = path.with_suffix(".failed")
    assert not path.exists() and "failed" in failed.read_text()
    before = failed.stat().st_mtime_ns, failed.read_text()
    assert build_archive(path) is False
    assert not path.exists() and (failed.stat().st_mtime_ns, failed.read_text()) == before
    assert not [p for p in path.parent.iterdir() if p.name.startswith("build-")]  # the work directory went


def test_spark_installed_again_in_place_gets_another_archive_and_the_old_one_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv made anew at the same path has the same Spark at the same place, but jars the JVM will not
    map an archive of the old ones for (seen in CI: every driver loaded its classes from the jars again).
    The archive's name follows the jars, and building the new one removes the replaced one's files."""
    home = tmp_path / "spark"
    (home / "jars").mkdir(parents=True)
    jar = home / "jars" / "spark-core.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv("SPARK_HOME", str(home))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    first = archive_path()
    assert first is not None and first.parent == tmp_path / "cache" / "jvm"
    assert archive_path() == first  # nothing changed: the same archive
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 1_000_000_000))
    second = archive_path()
    assert second is not None and second != first
    assert second.stem.rpartition("-")[0] == first.stem.rpartition("-")[0]  # the same place, other contents
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "elsewhere"))
    other = archive_path()
    assert other is not None and other.stem.rpartition("-")[0] != first.stem.rpartition("-")[0]

    second.parent.mkdir(parents=True)
    kept = [second, other, second.parent / "spark-4.3.0-aea81051de766d6a.jsa"]
    for name in (first, first.with_suffix(".lock"), first.with_suffix(".failed"), *kept):
        name.write_bytes(b"")
    _remove_replaced(second)
    assert sorted(second.parent.iterdir()) == sorted(kept)


def test_only_the_archives_used_last_are_kept(tmp_path: Path) -> None:
    """Every new venv gets an archive of its own (about 180 MB; CI makes two per run): the cache keeps the
    KEEP used last, by modification time, and removes the others with their lock and failure files."""
    names = [tmp_path / f"spark-4.3.0-place{i}-contents.jsa" for i in range(KEEP + 3)]
    for age, name in enumerate(names):  # names[0] used last
        for extra in (name, name.with_suffix(".lock"), name.with_suffix(".failed")):
            extra.write_bytes(b"")
            os.utime(extra, (1_700_000_000 - age * 60, 1_700_000_000 - age * 60))
    other = tmp_path / "hdfs-jars.lock"
    other.write_text("not an archive's")
    _keep_last_used(tmp_path, KEEP)
    left = sorted(p.name for p in tmp_path.iterdir())
    want = sorted([other.name, *(n.name for name in names[:KEEP]
                                 for n in (name, name.with_suffix(".lock"), name.with_suffix(".failed")))])
    assert left == want
