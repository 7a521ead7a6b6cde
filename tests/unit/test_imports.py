"""The layout holds: controlmsg imports without pyspark (the Spark side is optional, and so is the
streaming runtime's), and the modules of controlmsg import each other without cycles."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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
import controlmsg.spark
import controlmsg.spark.options
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str], module_level_only: bool) -> set[str]:
    """The controlmsg modules that ``path`` imports (at module level only, or anywhere in it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    this = _module_name(path)
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
    """Neither at import time (module-level imports) nor counting the lazy imports inside functions: the
    layers stay in order (core; kafka and the test tools; the CLI)."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    for module_level_only in (True, False):
        graph = {_module_name(p): _imports(p, modules, module_level_only) for p in paths}
        assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


# Each layer may import only from the layers listed for it (and from itself); see docs/DEVELOPMENT.md.
_BASE = {"controlmsg", "controlmsg.errors", "controlmsg.paths"}
LAYERS: dict[str, set[str]] = {
    "controlmsg.core": _BASE,
    "controlmsg.clusters": _BASE,
    "controlmsg.kafka": _BASE | {"controlmsg.core", "controlmsg.clusters"},
    "controlmsg.spark": _BASE | {"controlmsg.core", "controlmsg.clusters", "controlmsg.kafka"},
    "controlmsg.streaming": _BASE | {"controlmsg.core", "controlmsg.clusters", "controlmsg.kafka",
                                     "controlmsg.spark"},
}


def _layer(module: str) -> str:
    for layer in sorted(LAYERS, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """core and the local clusters import only the base modules; kafka, spark and the streaming runtime
    only the layers below them; lazy imports inside functions count too."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    wrong = []
    for path in paths:
        this = _module_name(path)
        allowed = LAYERS.get(_layer(this))
        if allowed is None:
            continue  # the CLI and the top-level modules may import any layer
        for name in _imports(path, modules, module_level_only=False):
            layer = _layer(name)
            if layer != _layer(this) and layer not in allowed and name not in allowed:
                wrong.append(f"{this} imports {name}")
    assert not wrong, wrong


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
