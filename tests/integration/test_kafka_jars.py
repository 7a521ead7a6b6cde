"""The first run of a Python user with Java and pyspark but no Maven: Kafka's jars are resolved for real
through the Apache Ivy that pyspark ships (from Maven Central, or Spark's Ivy cache ``~/.ivy2.5.2`` when it
holds them), verified against the lock, and a broker starts from them. Needs Java and, unless Spark's Ivy
cache is warm, the network."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlmsg.clusters import kafka_jars as kj
from controlmsg.clusters import maven_jars
from controlmsg.clusters.processes import free_ports, java_executable


@pytest.fixture(scope="module")
def java_only_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH with ``java`` and nothing else: no ``mvn``."""
    bin_dir = tmp_path_factory.mktemp("java-only-bin")
    (bin_dir / "java").symlink_to(Path(java_executable()).resolve())
    return str(bin_dir)


@pytest.fixture(scope="module")
def ivy_cache(tmp_path_factory: pytest.TempPathFactory, java_only_path: str) -> Iterator[Path]:
    """A controlmsg cache filled by the Ivy resolver with Maven out of reach."""
    cache = tmp_path_factory.mktemp("controlmsg-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", java_only_path)
        mp.delenv("JAVA_HOME", raising=False)
        mp.delenv(kj.RESOLVER_ENV, raising=False)
        mp.delenv(kj.IVY_SETTINGS_ENV, raising=False)
        assert shutil.which("mvn") is None
        assert [r.name for r in kj._resolvers()] == ["ivy"]
        started = time.monotonic()
        libs = kj.ensure_kafka_libs(cache)
        print(f"Kafka jars resolved through pyspark's Ivy in {time.monotonic() - started:.1f} s")
    yield libs


def test_pyspark_and_java_suffice_to_fetch_the_locked_jars(ivy_cache: Path) -> None:
    lock = kj.read_lock()
    assert sorted(os.listdir(ivy_cache)) == sorted(jar.name for jar in lock)
    assert kj.verify_jars(ivy_cache, lock) == []
    assert sorted(os.listdir(ivy_cache.parent)) == [".fetch.lock", "libs"]


def test_a_corrupted_jar_in_a_copied_cache_is_refused_and_fetched_again(
        ivy_cache: Path, tmp_path: Path, java_only_path: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    copy = tmp_path / "cache"
    shutil.copytree(ivy_cache.parent.parent, copy)
    libs = copy / ivy_cache.parent.name / "libs"
    jar = libs / f"kafka-clients-{kj.KAFKA_VERSION}.jar"
    data = bytearray(jar.read_bytes())
    data[len(data) // 2] ^= 0x40
    jar.write_bytes(bytes(data))
    damaged = hashlib.sha256(data).hexdigest()
    monkeypatch.setenv("PATH", java_only_path)
    monkeypatch.delenv(kj.RESOLVER_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger=maven_jars.__name__):
        assert kj.ensure_kafka_libs(copy) == libs
    assert f"{jar.name}: expected sha256 " in caplog.text and f"got sha256 {damaged}" in caplog.text
    assert f"fetched and verified Apache Kafka {kj.KAFKA_VERSION}'s jars (46 jars) with ivy" in caplog.text
    assert kj.verify_jars(libs, kj.read_lock()) == []


@pytest.mark.kafka
def test_the_broker_starts_from_the_ivy_resolved_jars(ivy_cache: Path, tmp_path: Path,
                                                      java_only_path: str) -> None:
    from confluent_kafka.admin import AdminClient

    env = {**os.environ, "PATH": java_only_path, "CONTROLMSG_CACHE_DIR": str(ivy_cache.parent.parent)}
    env.pop("JAVA_HOME", None)
    data_dir = tmp_path / "kafka"
    cli = [sys.executable, "-m", "controlmsg", "broker"]
    started = subprocess.run([*cli, "start", "--port", str(free_ports()), "--data-dir", str(data_dir)],
                             env=env, capture_output=True, text=True, timeout=180, check=False)
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
        assert list(metadata.brokers) == [1]
        java_cmdline = Path(f"/proc/{_recorded_pid(data_dir)}/cmdline")
        if java_cmdline.exists():  # Linux: the broker's classpath is the verified cache
            assert str(ivy_cache / "*") in java_cmdline.read_bytes().decode().split("\0")
    finally:
        stopped = subprocess.run([*cli, "stop", "--data-dir", str(data_dir)], env=env, capture_output=True,
                                 text=True, timeout=120, check=False)
    assert stopped.returncode == 0, stopped.stderr


def _recorded_pid(data_dir: Path) -> int:
    return int((data_dir / "broker.pid").read_text(encoding="utf-8"))


@pytest.mark.skipif(shutil.which("mvn") is None, reason="Maven is optional: this checks it when it is installed")
def test_maven_stays_an_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kj.RESOLVER_ENV, "maven")
    assert [r.name for r in kj._resolvers()] == ["maven"]
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    assert kj.verify_jars(libs, kj.read_lock()) == []
