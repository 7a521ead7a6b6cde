"""The layout holds: controlmsg imports without pyspark (the Spark side is optional, and so is the
streaming runtime's), the modules of controlmsg import each other without cycles, and no module imports
from a layer above its own (docs/DEVELOPMENT.md#layout)."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "controlmsg"

# Runs in a fresh interpreter: a finder first on sys.meta_path refuses the Spark stack, as if absent.
WITHOUT_SPARK = """
import importlib.abc
import sys

BLOCKED = {"pyspark", "pyarrow", "pandas"}


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: controlmsg must import without it")
        return None


sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.partition(".")[0] in BLOCKED:
        del sys.modules[name]

import controlmsg
import controlmsg.cli
import controlmsg.core
import controlmsg.kafka
import controlmsg.kafka.periodic_log
import controlmsg.kafka.settings
import controlmsg.metrics
import controlmsg.metrics.server
import controlmsg.spark
import controlmsg.spark.class_archive
import controlmsg.spark.options
import controlmsg.spark.positions
import controlmsg.spark.reading  # the reading and writing parts load their modules when a name is used
import controlmsg.spark.reading.source_metrics
import controlmsg.spark.writing
import controlmsg.spark.writing.run_control
import controlmsg.streaming
import controlmsg.streaming.ingest
import controlmsg.streaming.log
import controlmsg.streaming.stopping
import controlmsg.streaming.window
import controlmsg.clusters
import controlmsg.clusters.broker
import controlmsg.clusters.connect
import controlmsg.clusters.hdfs
import controlmsg.clusters.s3
import controlmsg.clusters.images
import controlmsg.clusters.local_address
import controlmsg.clusters.standalone

assert controlmsg.__file__.startswith(sys.argv[1]), controlmsg.__file__
try:
    controlmsg.spark.ControlMsgDataSource  # the Spark face needs pyspark only when it is used
except ImportError as exc:
    assert "pyspark" in str(exc), exc
else:
    raise AssertionError("controlmsg.spark.ControlMsgDataSource imported without pyspark")
try:
    controlmsg.streaming.run_long_running_tasks  # the runtime's Spark side too
except ImportError as exc:
    assert "pyspark" in str(exc), exc
else:
    raise AssertionError("controlmsg.streaming.run_long_running_tasks imported without pyspark")
leaked = sorted(n for n in sys.modules if n.partition(".")[0] in BLOCKED)
assert not leaked, leaked
print("ok")
"""


def test_controlmsg_imports_without_pyspark() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_SPARK, str(PACKAGE)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str], module_level_only: bool, root: Path = ROOT) -> set[str]:
    """The controlmsg modules that ``path`` imports (at module level only, or anywhere in it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    this = _module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules and name != this}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_in_controlmsg() -> None:
    """Neither at import time (module-level imports) nor counting the lazy imports inside functions."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    for module_level_only in (True, False):
        graph = {_module_name(p): _imports(p, modules, module_level_only) for p in paths}
        assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


# The layers, bottom to top (docs/DEVELOPMENT.md#layout): each top-level module or subpackage of controlmsg
# -> the top-level names it may import from (its own always), or None: any. Lazy imports inside functions
# and imports under TYPE_CHECKING count too. A top-level name missing here fails the test: place it.
_BASE = frozenset({"controlmsg", "controlmsg.core", "controlmsg.errors", "controlmsg.lazy", "controlmsg.paths"})
MAY_IMPORT: dict[str, frozenset[str] | None] = {
    # the pure core, the errors, the cache path, and the package's root that re-exports them
    "controlmsg": _BASE,
    "controlmsg.core": _BASE,
    "controlmsg.errors": _BASE,
    "controlmsg.lazy": _BASE,
    "controlmsg.paths": _BASE,
    # the Kafka adapters, and the metrics endpoint (both engines serve it)
    "controlmsg.kafka": _BASE,
    "controlmsg.metrics": _BASE,
    # the two engines, side by side: neither imports the other
    "controlmsg.spark": _BASE | {"controlmsg.kafka", "controlmsg.metrics"},
    "controlmsg.streaming": _BASE | {"controlmsg.kafka", "controlmsg.metrics"},
    # on top: the local clusters (tools for tests, demos, users) and the command
    "controlmsg.clusters": None,
    "controlmsg.cli": None,
    "controlmsg.demo": None,
    "controlmsg.__main__": None,
}
DEPRECATED_ALIASES: dict[str, str] = {
    "controlmsg.clusters.class_archive": "controlmsg.spark.class_archive",
}
"""Old module -> the module that replaced it, which the old one may import (whatever the layers say)."""


def _top(module: str) -> str:
    """``controlmsg.kafka.settings`` -> ``controlmsg.kafka``; ``controlmsg`` -> ``controlmsg``."""
    return ".".join(module.split(".")[:2])


def _layer_violations(root: Path, aliases: dict[str, str] = DEPRECATED_ALIASES) -> list[str]:
    """``"<module> imports <module>"`` for each import in ``root``'s controlmsg package that goes from a layer
    to one it may not import (:data:`MAY_IMPORT`), or from a module whose top-level name the table lacks.
    A deprecated alias (``aliases``: old -> new) may import its replacement (and the packages above it)."""
    package = root / "controlmsg"
    paths = sorted(package.rglob("*.py"))
    modules = {_module_name(p, root) for p in paths}
    wrong = []
    for path in paths:
        this = _module_name(path, root)
        if _top(this) not in MAY_IMPORT:
            wrong.append(f"{this}: not placed in a layer (MAY_IMPORT)")
            continue
        allowed = MAY_IMPORT[_top(this)]
        if allowed is None:
            continue
        for name in sorted(_imports(path, modules, module_level_only=False, root=root)):
            top, replacement = _top(name), aliases.get(this)
            if top == _top(this) or top in allowed:
                continue
            if replacement is not None and (name == replacement or replacement.startswith(name + ".")):
                continue
            wrong.append(f"{this} imports {name}")
    return wrong


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """core, errors and paths import only each other; kafka only those; spark and the streaming runtime
    kafka and those, and not each other; the local clusters and the command anything. Lazy imports inside
    functions count too."""
    wrong = _layer_violations(ROOT)
    assert not wrong, "imports from a layer above (docs/DEVELOPMENT.md#layout):\n" + "\n".join(wrong)


def test_the_layer_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The check itself: an import inside a function, a relative one and one under TYPE_CHECKING are seen,
    the engines may not import each other, a module outside the table is reported, and a deprecated alias
    may import its replacement only."""
    files = {
        "controlmsg/__init__.py": "",
        "controlmsg/core/__init__.py": "",
        "controlmsg/core/a.py": "def f():\n    from controlmsg.kafka import b\n",
        "controlmsg/kafka/__init__.py": "",
        "controlmsg/kafka/b.py": "from ..core import a\nfrom ..clusters import c\n",
        "controlmsg/spark/__init__.py": "",
        "controlmsg/spark/f.py": "",
        "controlmsg/spark/d.py": ("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    import controlmsg.streaming.e\n"),
        "controlmsg/streaming/__init__.py": "",
        "controlmsg/streaming/e.py": "from controlmsg.kafka import b\nfrom controlmsg.clusters.c import x\n",
        "controlmsg/clusters/__init__.py": "",
        "controlmsg/clusters/c.py": "from controlmsg.streaming import e\nx = 1\n",
        "controlmsg/elsewhere.py": "",
        "controlmsg/kafka/old.py": "from controlmsg.spark.d import y\nfrom controlmsg.spark import f\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _layer_violations(tmp_path, {"controlmsg.kafka.old": "controlmsg.spark.d"}) == [
        "controlmsg.core.a imports controlmsg.kafka",
        "controlmsg.core.a imports controlmsg.kafka.b",
        "controlmsg.elsewhere: not placed in a layer (MAY_IMPORT)",
        "controlmsg.kafka.b imports controlmsg.clusters",
        "controlmsg.kafka.b imports controlmsg.clusters.c",
        "controlmsg.kafka.old imports controlmsg.spark.f",
        "controlmsg.spark.d imports controlmsg.streaming.e",
        "controlmsg.streaming.e imports controlmsg.clusters.c",
    ]


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED_ALIASES.items()))
def test_a_deprecated_alias_reexports_its_replacement(old: str, new: str) -> None:
    """An old module name still imports, says it is deprecated (docstring and a warning) and names its
    replacement, whose public names it re-exports."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.reload(sys.modules[old]) if old in sys.modules else importlib.import_module(old)
    replacement = importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), caught
    assert alias.__doc__ is not None and alias.__doc__.startswith("Deprecated") and new in alias.__doc__
    assert set(alias.__all__) == set(replacement.__all__)
    for name in replacement.__all__:
        assert getattr(alias, name) is getattr(replacement, name), name


@pytest.mark.parametrize("package", ["controlmsg.spark", "controlmsg.spark.reading", "controlmsg.spark.writing"])
def test_a_lazy_package_finds_each_public_name_where_it_is_defined(package: str) -> None:
    """A package that loads its modules when a name is used (``_WHERE``: name -> module) names exactly its
    ``__all__`` there, and each name, a class or function, is the one its module defines."""
    module = importlib.import_module(package)
    assert set(module._WHERE) == set(module.__all__)
    for name, where in module._WHERE.items():
        value = getattr(module, name)
        assert value is getattr(importlib.import_module(where), name), name
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == where, (name, value.__module__)


# The Spark image builds the class archive from a few files of the project only (docker/spark/Dockerfile):
# in a tree of just those, with the Spark stack out of reach, the module imports.
ARCHIVE_ALONE = """
import importlib.abc
import sys


class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "pyarrow", "pandas", "confluent_kafka"):
            raise ImportError(f"{name} is blocked")
        return None


sys.meta_path.insert(0, Blocker())
from controlmsg.spark.class_archive import driver_java_options

assert driver_java_options.__module__ == "controlmsg.spark.class_archive"
assert sys.modules["controlmsg"].__file__.startswith(sys.argv[1]), sys.modules["controlmsg"].__file__
print("ok")
"""


def test_the_spark_image_builds_the_class_archive_from_what_it_copies(tmp_path: Path) -> None:
    """The Dockerfile's COPY lines, /.dockerignore's allow-list and the image's inputs
    (``controlmsg.clusters.images._SPARK_CONTEXT``) name the same files of controlmsg, and those files alone,
    under the empty package roots the Dockerfile makes, import ``controlmsg.spark.class_archive`` without
    pyspark."""
    dockerfile = (ROOT / "docker" / "spark" / "Dockerfile").read_text()
    roots = ("controlmsg/__init__.py", "controlmsg/spark/__init__.py")
    assert "touch " + " ".join(f"/tmp/archive/{root}" for root in roots) in dockerfile
    from controlmsg.clusters.images import _SPARK_CONTEXT

    copied: set[str] = set()
    for line in dockerfile.splitlines():
        words = line.split()
        if words[:1] == ["COPY"]:
            copied.update(w.rstrip("/") for w in words[1:-1] if w.startswith("controlmsg"))
    allowed = {line[1:].strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!controlmsg")}
    inputs = {p for p in _SPARK_CONTEXT if p.startswith("controlmsg")}
    assert copied == allowed == inputs, (copied, allowed, inputs)
    for relative in copied:
        source, target = ROOT / relative, tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    for root in roots:
        (tmp_path / root).touch()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", ARCHIVE_ALONE, str(tmp_path)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_layout_page_names_every_module() -> None:
    """docs/DEVELOPMENT.md's layout table names each module of the library and of the example jobs, so
    that it keeps matching the tree: a module added without a word there fails here."""
    page = (ROOT / "docs" / "DEVELOPMENT.md").read_text()
    layout = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    modules = [path for top in ("controlmsg", "spark_jobs") for path in sorted((ROOT / top).rglob("*.py"))
               if path.name not in ("__init__.py", "__main__.py")]
    unnamed = [str(path.relative_to(ROOT)) for path in modules
               if f"`{path.name}`" not in layout and f"/{path.name}`" not in layout]
    assert not unnamed, f"not named in docs/DEVELOPMENT.md's layout: {unnamed}"
