"""The Kafka jar cache without a network: the lock, verification before use, and that a damaged, partial or
unexpected jar set is never installed or used. Resolvers are stand-ins that write files; the real
resolution through pyspark's Ivy is in tests/integration/test_kafka_jars.py."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from controlmsg.clusters import jar_resolvers, maven_jars
from controlmsg.clusters import kafka_jars as kj
from controlmsg.errors import BrokerError

JARS = {"a-1.0.jar": b"alpha" * 100, "b-2.0.jar": b"bravo" * 200, "kafka_2.13-x.jar": b"kafka" * 300}


def _lock_text(jars: dict[str, bytes]) -> str:
    lines = ["# test lock"]
    lines += [f"{hashlib.sha256(data).hexdigest()}  {len(data)}  {name}" for name, data in sorted(jars.items())]
    return "\n".join(lines) + "\n"


class FakeResolver:
    """Writes ``deliver(fresh_cache)`` (name -> bytes) into ``<work>/jars``; counts its calls."""

    def __init__(self, name: str, deliver: Callable[[bool], dict[str, bytes]] | None = None,
                 fail: bool = False) -> None:
        self.name = name
        self.deliver = deliver or (lambda fresh: dict(JARS))
        self.fail = fail
        self.calls: list[bool] = []

    def resolver(self) -> kj._Resolver:
        def resolve(work: Path, fresh_cache: bool) -> Path:
            self.calls.append(fresh_cache)
            if self.fail:
                raise BrokerError(f"{self.name} cannot reach its repository")
            out = work / "jars"
            out.mkdir()
            for name, data in self.deliver(fresh_cache).items():
                (out / name).write_bytes(data)
            return out

        return kj._Resolver(self.name, resolve)


@pytest.fixture
def lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "test.lock"
    path.write_text(_lock_text(JARS), encoding="utf-8")
    monkeypatch.setattr(kj, "LOCK_FILE", path)
    return path


def _use(monkeypatch: pytest.MonkeyPatch, *fakes: FakeResolver) -> None:
    monkeypatch.setattr(kj, "_resolvers", lambda: [f.resolver() for f in fakes])


def _libs(cache: Path) -> Path:
    return cache / f"kafka-{kj.KAFKA_VERSION}" / "libs"


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_lock_pins_the_brokers_whole_classpath() -> None:
    jars = {jar.name: jar for jar in kj.read_lock()}
    assert f"kafka_{kj.SCALA_VERSION}-{kj.KAFKA_VERSION}.jar" in jars
    assert f"kafka-clients-{kj.KAFKA_VERSION}.jar" in jars
    assert f"log4j-slf4j-impl-{kj.LOG4J_VERSION}.jar" in jars
    assert any(name.startswith("scala-library-") for name in jars)  # what Spark's own --packages leaves out
    assert len(jars) == 46 and all(jar.size > 0 and len(jar.sha256) == 64 for jar in jars.values())


def test_a_malformed_lock_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.lock"
    path.write_text(_lock_text(JARS) + "not-a-digest  12  c.jar\n", encoding="utf-8")
    with pytest.raises(BrokerError, match=r"bad\.lock, line 5: not"):
        kj.read_lock(path)


def test_only_a_complete_verified_set_is_installed_then_used_without_resolving(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeResolver("ivy", lambda fresh: {**JARS, "extra-9.jar": b"not locked"})
    _use(monkeypatch, fake)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    assert libs == _libs(tmp_path / "cache").resolve()
    assert sorted(os.listdir(libs)) == sorted(JARS)  # the resolver's extra jar stays out of the classpath
    assert kj.verify_jars(libs, kj.read_lock(lock)) == []
    assert sorted(os.listdir(libs.parent)) == [".fetch.lock", "libs"]  # no work directory is left
    assert kj.ensure_kafka_libs(tmp_path / "cache") == libs
    assert fake.calls == [False]


def test_a_corrupted_cached_jar_is_refused_and_fetched_again(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeResolver("ivy")
    _use(monkeypatch, fake)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    _flip_a_byte(libs / "b-2.0.jar")
    damaged = hashlib.sha256((libs / "b-2.0.jar").read_bytes()).hexdigest()
    with caplog.at_level(logging.WARNING, logger=maven_jars.__name__):
        assert kj.ensure_kafka_libs(tmp_path / "cache") == libs
    assert fake.calls == [False, False]
    assert kj.verify_jars(libs, kj.read_lock(lock)) == []
    expected = hashlib.sha256(JARS["b-2.0.jar"]).hexdigest()
    assert f"b-2.0.jar: expected sha256 {expected} ({len(JARS['b-2.0.jar'])} bytes), got sha256 {damaged}" \
        in caplog.text


def test_a_damaged_download_is_never_installed_and_is_reported(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {**JARS, "a-1.0.jar": JARS["a-1.0.jar"][:-7]}  # a download cut short
    fake = FakeResolver("ivy", lambda fresh: bad)
    _use(monkeypatch, fake)
    with pytest.raises(BrokerError) as info:
        kj.ensure_kafka_libs(tmp_path / "cache")
    message = str(info.value)
    assert fake.calls == [False, True]  # once more with a fresh private cache before giving up
    assert "nothing was installed" in message and "ivy (fresh cache) delivered" in message
    assert (f"a-1.0.jar: expected sha256 {hashlib.sha256(JARS['a-1.0.jar']).hexdigest()} (500 bytes), "
            f"got sha256 {hashlib.sha256(bad['a-1.0.jar']).hexdigest()} (493 bytes)") in message
    root = _libs(tmp_path / "cache").parent
    assert sorted(os.listdir(root)) == [".fetch.lock"]


def test_a_damaged_shared_cache_is_bypassed_by_a_fresh_one(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeResolver("ivy", lambda fresh: JARS if fresh else {**JARS, "b-2.0.jar": b"garbage"})
    _use(monkeypatch, fake)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    assert fake.calls == [False, True]
    assert kj.verify_jars(libs, kj.read_lock(lock)) == []


def test_a_partial_download_or_install_is_never_used(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _libs(tmp_path / "cache").parent
    # What killed fetches leave: a work directory with a staged set, the old code's partial directory, and a
    # libs/ that lacks a jar (copied or extracted half-way).
    for leftover in (root / ".fetch-killed" / "libs", root / "libs.partial", root / "libs"):
        leftover.mkdir(parents=True)
        (leftover / "a-1.0.jar").write_bytes(JARS["a-1.0.jar"])
    (root / ".fetch-killed" / "libs" / "b-2.0.jar").write_bytes(JARS["b-2.0.jar"][:10])
    fake = FakeResolver("ivy")
    _use(monkeypatch, fake)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    assert fake.calls == [False]
    assert sorted(os.listdir(root)) == [".fetch.lock", "libs"]
    assert kj.verify_jars(libs, kj.read_lock(lock)) == []


def test_a_stray_jar_in_the_cache_is_refused(tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeResolver("ivy")
    _use(monkeypatch, fake)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    (libs / "zz-evil-1.0.jar").write_bytes(b"x")  # the classpath is libs/*: it would be loaded
    assert kj.verify_jars(libs, kj.read_lock(lock)) == ["zz-evil-1.0.jar: not in the lock"]
    assert kj.ensure_kafka_libs(tmp_path / "cache") == libs
    assert sorted(os.listdir(libs)) == sorted(JARS) and fake.calls == [False, False]


def test_a_failing_resolver_falls_through_to_the_next(
        tmp_path: Path, lock: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ivy, maven = FakeResolver("ivy", fail=True), FakeResolver("maven")
    _use(monkeypatch, ivy, maven)
    libs = kj.ensure_kafka_libs(tmp_path / "cache")
    assert ivy.calls == [False, True] and maven.calls == [False]
    assert sorted(os.listdir(libs)) == sorted(JARS)


def _path_without_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, with_fake_mvn: bool = False) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if with_fake_mvn:
        mvn = bin_dir / "mvn"
        mvn.write_text("#!/bin/sh\nexit 1\n")
        mvn.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_without_pyspark_and_maven_the_error_names_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kj, "_pyspark_ivy_jar", lambda: None)
    monkeypatch.delenv(kj.RESOLVER_ENV, raising=False)
    _path_without_mvn(tmp_path, monkeypatch)
    with pytest.raises(BrokerError) as info:
        kj.ensure_kafka_libs(tmp_path / "cache")
    message = str(info.value)
    assert "pyspark is not installed" in message and "controlmsg[spark]" in message
    assert "Maven (`mvn`) is not on PATH" in message and "Java 17" in message


def test_the_resolver_can_be_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _path_without_mvn(tmp_path, monkeypatch, with_fake_mvn=True)
    assert kj._pyspark_ivy_jar() is not None  # the dev install has pyspark
    monkeypatch.delenv(kj.RESOLVER_ENV, raising=False)
    assert [r.name for r in kj._resolvers()] == ["ivy", "maven"]
    monkeypatch.setenv(kj.RESOLVER_ENV, "maven")
    assert [r.name for r in kj._resolvers()] == ["maven"]
    monkeypatch.setenv(kj.RESOLVER_ENV, "ivy")
    assert [r.name for r in kj._resolvers()] == ["ivy"]
    monkeypatch.setenv(kj.RESOLVER_ENV, "gradle")
    with pytest.raises(BrokerError, match="expected one of ivy, maven"):
        kj._resolvers()
    monkeypatch.setenv(kj.RESOLVER_ENV, "maven")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerError, match=r"=maven, but Apache Maven \(`mvn`\) is not on PATH"):
        kj._resolvers()


def test_no_registry_address_is_written_into_the_resolution() -> None:
    assert "http" not in kj._ivy_module_xml().replace("http://maven.apache.org/POM/4.0.0", "")
    assert "<repositor" not in kj._pom_xml() and "<repositor" not in kj._ivy_module_xml()


def test_the_ivy_command_uses_ivys_defaults_or_the_users_settings(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[list[str]] = []

    def fake_run_tool(cmd: list[str], what: str, timeout: float, cwd: Path | None) -> str:
        runs.append(list(cmd))
        cache = Path(cmd[cmd.index("-cache") + 1]) if "-cache" in cmd else None
        if cache is not None:  # what Ivy leaves in its cache after a resolution of this module
            module = Path(cmd[cmd.index("-ivy") + 1]).read_text().split('module="')[1].split('"')[0]
            cache.mkdir(parents=True, exist_ok=True)
            (cache / f"resolved-controlmsg.local-{module}-{kj.KAFKA_VERSION}.xml").write_text("x")
            (cache / f"controlmsg.local-{module}-default.xml").write_text("x")
        return ""

    monkeypatch.setattr(jar_resolvers, "run_tool", fake_run_tool)
    monkeypatch.setattr(jar_resolvers, "spark_ivy_cache", lambda: tmp_path / "spark-ivy" / "cache")
    monkeypatch.delenv(kj.IVY_SETTINGS_ENV, raising=False)
    resolver = kj._ivy_resolver(tmp_path / "ivy-2.5.3.jar")
    for name in ("w1", "w2", "w3"):
        (tmp_path / name).mkdir()
    resolver.resolve(tmp_path / "w1", False)
    monkeypatch.setenv(kj.IVY_SETTINGS_ENV, str(tmp_path / "ivysettings.xml"))
    resolver.resolve(tmp_path / "w2", False)
    resolver.resolve(tmp_path / "w3", True)
    shared, with_settings, fresh = runs
    assert shared[shared.index("-cache") + 1] == str(tmp_path / "spark-ivy" / "cache")
    assert "-settings" not in shared and "-Divy.maven.lookup.sources=false" in shared
    assert with_settings[with_settings.index("-settings") + 1] == str(tmp_path / "ivysettings.xml")
    assert "-cache" not in with_settings  # the settings file chooses its cache
    assert fresh[fresh.index("-cache") + 1] == str(tmp_path / "w3" / "ivy-cache")
    assert list((tmp_path / "spark-ivy" / "cache").iterdir()) == []  # its resolution files are removed
    assert all("http" not in arg for run in runs for arg in run)
