"""The benchmarks use the project as its users do: no benchmark imports a private name (one with a leading
underscore, dunders aside) of controlmsg, spark_jobs or another benchmark module, nor reaches one as an
attribute of such a module (``pipeline._job_args``). A private name can change without notice; what a
benchmark needs of it wants a public name. Reads the scripts as text: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
PACKAGES = ("controlmsg", "spark_jobs", "benchmarks")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(module: str, siblings: set[str]) -> bool:
    """A module of the project's: under one of :data:`PACKAGES`, or a benchmark script's sibling module
    (``from common import ...``: the scripts run with their folder first on ``sys.path``)."""
    top = module.partition(".")[0]
    return top in PACKAGES or top in siblings


def _is_module(dotted: str, siblings: set[str]) -> bool:
    """Whether ``dotted`` names a module (a file or a package) of the project's, by the files alone."""
    parts = dotted.split(".")
    base = BENCHMARKS if parts[0] in siblings else ROOT
    path = base.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_uses(source: str, siblings: set[str]) -> list[str]:
    """Where ``source`` imports a private name of a module of the project's, or takes one as an attribute
    of a name bound to such a module, at any depth (lazy imports inside functions too): ``line: what``."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # a name bound by an import -> the project's module it is
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _ours(alias.name, siblings):
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
                bound = alias.asname or alias.name.partition(".")[0]
                modules[bound] = alias.name if alias.asname else bound
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if not _ours(node.module, siblings):
                continue
            for alias in node.names:
                if _private(alias.name) or any(_private(part) for part in node.module.split(".")):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                target = f"{node.module}.{alias.name}"
                if _is_module(target, siblings):
                    modules[alias.asname or alias.name] = target
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda x: int(x.partition(":")[0]))


def _siblings() -> set[str]:
    return {p.stem for p in BENCHMARKS.glob("*.py")}


def test_no_benchmark_uses_a_private_name_of_the_project() -> None:
    siblings = _siblings()
    offences = [f"benchmarks/{path.name}:{where}" for path in sorted(BENCHMARKS.glob("*.py"))
                for where in private_uses(path.read_text(encoding="utf-8"), siblings)]
    assert not offences, "benchmarks use private names (give what they need a public name):\n" + "\n".join(offences)


@pytest.mark.parametrize(("source", "expected"), [
    ("from spark_jobs.pipeline import _job_args\n", ["1: from spark_jobs.pipeline import _job_args"]),
    ("from common import _given\n", ["1: from common import _given"]),
    ("def f():\n    from controlmsg.kafka import _x as y\n", ["2: from controlmsg.kafka import _x"]),
    ("import spark_jobs.pipeline\nspark_jobs.pipeline._job_args(1)\n", ["2: spark_jobs.pipeline._job_args"]),
    ("import spark_jobs.pipeline as p\np._job_args(1)\n", ["2: p._job_args"]),
    ("from spark_jobs import pipeline\npipeline._job_args(1)\n", ["2: pipeline._job_args"]),
    ("import common\ncommon._given(a)\n", ["2: common._given"]),
    ("from controlmsg.kafka._secret import x\n", ["1: from controlmsg.kafka._secret import x"]),
])
def test_the_check_sees_private_imports_and_attributes(source: str, expected: list[str]) -> None:
    assert private_uses(source, {"common"}) == expected


@pytest.mark.parametrize("source", [
    "from spark_jobs.job_commands import job_args\n",
    "import controlmsg\nprint(controlmsg.__version__)\n",
    "from controlmsg.kafka import ControlWriter\nw = ControlWriter()\nw._data_headers = []\n",  # an object's
    "from confluent_kafka import KafkaError\nKafkaError._PARTITION_EOF\n",  # not the project's
    "from pyspark import TaskContext\nTaskContext._getOrCreate()\n",
    "class C:\n    def f(self):\n        return self._x\n",
])
def test_the_check_leaves_public_names_and_other_packages_alone(source: str) -> None:
    assert private_uses(source, {"common"}) == []
