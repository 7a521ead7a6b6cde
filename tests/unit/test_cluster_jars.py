"""The jar sets of the local HDFS and S3 endpoint (controlmsg.clusters.jar_sets, jar_resolvers): what their locks
pin and how they are resolved. Their real fetch and use is in tests/spark/test_cluster_storage.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlmsg.clusters import hdfs, jar_resolvers, jar_sets, s3
from controlmsg.clusters.jar_sets import JarSet


def _names(jar_set: JarSet) -> set[str]:
    return {jar.name for jar in jar_sets.read_lock(jar_set.lock_file)}


def test_the_hdfs_lock_pins_the_minicluster_and_the_junit_apis_it_loads() -> None:
    names = _names(hdfs.HDFS_JARS)
    assert f"hadoop-client-minicluster-{hdfs.HADOOP_VERSION}.jar" in names
    for prefix in ("junit-4.", "hamcrest-core-", "junit-jupiter-api-", "opentest4j-", "apiguardian-api-"):
        assert any(name.startswith(prefix) for name in names), prefix
    # The minicluster comes alone: the Hadoop client it runs on is pyspark's, not a second copy.
    assert not any(name.startswith(("hadoop-client-api", "hadoop-client-runtime")) for name in names)


def test_the_s3a_lock_pins_hadoop_aws_and_the_aws_sdk_bundle() -> None:
    locked = {jar.name: jar for jar in jar_sets.read_lock(s3.S3A_JARS.lock_file)}
    assert f"hadoop-aws-{s3.HADOOP_AWS_VERSION}.jar" in locked
    bundle = [jar for name, jar in locked.items() if name.startswith("bundle-2.")]
    assert len(bundle) == 1 and bundle[0].size > 500_000_000


def test_a_jar_that_comes_alone_is_resolved_without_its_dependencies() -> None:
    ivy = jar_resolvers.ivy_module_xml(hdfs.HDFS_JARS)
    line = next(x for x in ivy.splitlines() if "hadoop-client-minicluster" in x)
    assert 'transitive="false"' in line
    assert 'transitive="false"' not in next(x for x in ivy.splitlines() if 'name="junit"' in x)
    pom = jar_resolvers.pom_xml(hdfs.HDFS_JARS)
    block = pom.split("<artifactId>hadoop-client-minicluster</artifactId>")[1].split("</dependency>")[0]
    assert "<exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>" in block


def test_the_big_set_never_goes_through_the_shared_ivy_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[list[str]] = []

    def fake_run_tool(cmd: list[str], what: str, timeout: float, cwd: Path | None) -> str:
        runs.append(list(cmd))
        return ""

    monkeypatch.setattr(jar_resolvers, "run_tool", fake_run_tool)
    monkeypatch.setattr(jar_resolvers, "spark_ivy_cache", lambda: tmp_path / "shared")
    monkeypatch.delenv(jar_resolvers.IVY_SETTINGS_ENV, raising=False)
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    jar_resolvers.ivy_resolver(s3.S3A_JARS, tmp_path / "ivy.jar").resolve(tmp_path / "w1", False)
    jar_resolvers.ivy_resolver(hdfs.HDFS_JARS, tmp_path / "ivy.jar").resolve(tmp_path / "w2", False)
    private, shared = runs
    assert private[private.index("-cache") + 1] == str(tmp_path / "w1" / "ivy-cache")
    assert shared[shared.index("-cache") + 1] == str(tmp_path / "shared")


def test_each_set_raises_its_own_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "empty.lock"
    bad.write_text("# nothing\n")
    with pytest.raises(hdfs.HdfsError, match="names no jar"):
        jar_sets.read_lock(bad, hdfs.HdfsError)
    monkeypatch.setenv(jar_sets.JAR_RESOLVER_ENV, "gradle")
    with pytest.raises(s3.S3Error, match=r"CONTROLMSG_JAR_RESOLVER='gradle': expected one of ivy, maven"):
        jar_resolvers.resolvers(s3.S3A_JARS)
