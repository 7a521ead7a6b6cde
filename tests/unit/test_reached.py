""":mod:`controlmsg.kafka.reached` on process trees of the test's own (``/proc/<pid>/stat`` files in a temporary
directory): which processes belong to a Spark application, and what the workers of one application share.
tests/spark/test_broker_faults.py runs it in a real Spark application."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from controlmsg.errors import ClusterRefused
from controlmsg.kafka import reached
from controlmsg.kafka.refusals import GRACE_ENV, ConnectionWatch

ME = os.getpid()


class Tree:
    """A fake ``/proc``: :meth:`add` writes a ``stat`` line as the kernel does (name in parentheses,
    then state, ppid, ..., start time as field 22)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, name: str, ppid: int, started: int) -> Tree:
        fields = ["S", str(ppid)] + ["0"] * 17 + [str(started), "0"]
        (self.root / str(pid)).mkdir(parents=True, exist_ok=True)
        (self.root / str(pid) / "stat").write_text(f"{pid} ({name}) {' '.join(fields)}\n")
        return self

    def use(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(reached, "PROC", self.root)


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


def _worker_of(temp: Path, name: str, jvm: int, jvm_started: int, *, me: str = "python3") -> Tree:
    """This process as a PySpark worker: it, its daemon (pid 900), the JVM ``jvm``, a shell."""
    return (Tree(temp / name).add(ME, me, 900, 5).add(900, "python", jvm, 4)
            .add(jvm, "java", 1, jvm_started).add(1, "bash", 0, 1))


def test_a_pyspark_worker_belongs_to_its_jvm_and_other_processes_to_none(temp: Path) -> None:
    assert reached._application(_worker_of(temp, "w", 400, 77).root, ME) == "400-77"
    assert reached._application(_worker_of(temp, "odd", 400, 77, me="python3.11").root, ME) == "400-77"
    # the CLI started by a shell under a JVM (a CI agent written in Java): a shell is in between
    under_shell = Tree(temp / "cli").add(ME, "python3", 800, 5).add(800, "bash", 400, 3).add(400, "java", 1, 77)
    assert reached._application(under_shell.root, ME) is None
    assert reached._application(Tree(temp / "jvm").add(ME, "java", 1, 2).root, ME) is None  # not Python
    assert reached._application(temp / "no-proc", ME) is None


def test_the_workers_of_one_application_share_what_they_reached(temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    servers = f"127.0.0.1:{uuid.uuid4().int % 50000 + 10000}"
    _worker_of(temp, "a", 400, 77).use(monkeypatch)
    assert not reached.remembered(servers)
    reached.remember(servers)
    assert reached.remembered(servers)
    assert not reached.remembered("127.0.0.1:1")  # another cluster

    _worker_of(temp, "b", 400, 77).use(monkeypatch)  # another worker (planner, task) of the same JVM
    assert reached.remembered(servers)
    _worker_of(temp, "c", 400, 78).use(monkeypatch)  # pid 400 again, another JVM (a recycled pid)
    assert not reached.remembered(servers)
    Tree(temp / "d").add(ME, "python3", 1, 5).add(1, "bash", 0, 1).use(monkeypatch)  # no application
    reached.remember(servers)
    assert not reached.remembered(servers)


def test_an_application_whose_jvm_ended_is_removed_by_the_next(temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _worker_of(temp, "a", 400, 77).use(monkeypatch)
    reached.remember("127.0.0.1:9092")
    [old] = list(reached._root().iterdir())
    assert old.name == "400-77"
    _worker_of(temp, "b", 401, 90).use(monkeypatch)  # JVM 400 is no longer in this tree: it ended
    reached.remember("127.0.0.1:9092")
    assert [p.name for p in reached._root().iterdir()] == ["401-90"]


def test_a_refused_connection_is_left_to_the_retries_once_another_worker_reached_the_cluster(
        temp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRACE_ENV, "0")
    refused = "{a}/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)"
    first, second = (f"127.0.0.1:{uuid.uuid4().int % 50000 + 10000}" for _ in range(2))
    _worker_of(temp, "a", 400, 77).use(monkeypatch)
    reached.remember(first)  # as mark_reached does in the worker that planned a write
    watch = ConnectionWatch({"bootstrap.servers": first}, unreachable=True)
    watch(KafkaError(KafkaError._TRANSPORT, refused.format(a=first)))
    watch.check()
    assert watch.refusal is None
    watch = ConnectionWatch({"bootstrap.servers": second}, unreachable=True)  # no worker reached this one
    with pytest.raises(ClusterRefused, match="connection refused"):
        watch(KafkaError(KafkaError._TRANSPORT, refused.format(a=second)))
