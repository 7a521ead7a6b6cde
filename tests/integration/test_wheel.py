"""The wheel a platform team installs. Built as pip builds it (``pip wheel``: the ``[build-system]`` of
pyproject.toml in pip's isolated build environment, so the package index or pip's cache is needed, as for
``make setup``), it holds the library, the ``pyspark_controlmsg`` module Spark discovers, ``py.typed`` and
the license, and not the example jobs (``spark_jobs/`` is a folder of the repository, not a package users
get). Installed into a clean venv and asked from a directory outside the checkout: ``controlmsg`` is the
clean venv's, ``spark_jobs`` does not import, a local Spark session whose Python workers run that venv finds
``format("controlmsg")`` by itself, and the ``controlmsg`` command runs.

The build runs on a copy of the checkout, so that it writes no ``build/`` or ``*.egg-info`` into the
checkout and takes no stale ``build/lib`` from it. The clean venv gets the dev venv's third-party packages
(pyspark alone is about 400 MB to install) from a ``.pth`` file holding the dev venv's site-packages as a
plain path line: Python adds that directory to ``sys.path`` but does not process the ``.pth`` files inside
it, so the dev venv's editable install (a path entry for the checkout's root) stays out. The checks that
``controlmsg`` comes from the clean venv and that ``spark_jobs`` does not import are what prove it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DIST_INFO = f"{PROJECT['name']}-{PROJECT['version']}.dist-info"
_NOT_COPIED = {"build", "dist", "out", "docker"}  # docker/: the Kafka image's jars (tens of MB), not packaged

# Run by the clean venv's Python, its working directory outside the checkout. Spark looks for pyspark_*
# modules in a Python worker of PYSPARK_PYTHON (the clean venv's) when a session first asks for a Python
# data source: dataSourceExists is that question, the one a read or write by name asks first.
PROBE = """
import importlib.util, json, sys
import controlmsg, pyspark_controlmsg
from pyspark.sql import SparkSession

found = {"controlmsg": controlmsg.__file__, "pyspark_controlmsg": pyspark_controlmsg.__file__,
         "spark_jobs": importlib.util.find_spec("spark_jobs") is not None, "sys.path": sys.path}
spark = SparkSession.builder.master("local[1]").appName("wheel").config("spark.ui.enabled", "false").getOrCreate()
try:
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    found["discovered"] = bool(manager.dataSourceExists("controlmsg"))
finally:
    spark.stop()
print(json.dumps(found))
"""


def _copy_checkout(dest: Path) -> None:
    """The checkout without its hidden directories (.git, venvs, caches), build outputs and egg-info."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
        if Path(directory) == ROOT:
            skip |= {n for n in names if n.startswith(".") or n in _NOT_COPIED}
        return skip

    shutil.copytree(ROOT, dest, ignore=ignore)


def _run(argv: list[str], timeout: float, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd, env=env)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    _copy_checkout(source)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(base / "out"),
          str(source)], timeout=300)
    built = sorted((base / "out").glob("*.whl"))
    assert len(built) == 1, built
    return built[0]


def test_the_wheel_holds_the_library_its_types_and_license_and_no_examples(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(f"{DIST_INFO}/METADATA").decode().splitlines()
        license_text = archive.read(f"{DIST_INFO}/licenses/LICENSE")
    assert {name.split("/", 1)[0] for name in names} == {"controlmsg", "pyspark_controlmsg.py", DIST_INFO}, (
        "the wheel's top level: the library, Spark's discovery module and the metadata, nothing else "
        "(spark_jobs and tests stay in the repository)")
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "controlmsg").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set(), "modules of the checkout missing from the wheel (a folder without __init__.py?)"
    assert {"controlmsg/py.typed", "controlmsg/clusters/kafka-jars.lock", "controlmsg/clusters/hdfs-jars.lock",
            "controlmsg/clusters/s3a-jars.lock"} <= names
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Typing :: Typed" in {line.removeprefix("Classifier: ") for line in metadata}


@pytest.mark.spark
def test_the_installed_wheel_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "clean"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=60)
    python = venv / "bin" / "python"
    # pip of the dev venv installs into the clean one; before the .pth below, so that it sees no other controlmsg
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet",
          str(wheel)], timeout=120)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     timeout=60).stdout.strip())
    dev_site = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    (site / "dev-venv-packages.pth").write_text("".join(f"{path}\n" for path in dev_site))

    # the environment of the tests (JAVA_TOOL_OPTIONS included), without a path into the checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = str(python)  # Spark's Python workers, where it looks for pyspark_* modules
    done = _run([str(python), "-c", PROBE], timeout=300, cwd=tmp_path, env=env)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for module in ("controlmsg", "pyspark_controlmsg"):
        assert Path(found[module]).is_relative_to(site), (module, found[module], found["sys.path"])
    assert found["spark_jobs"] is False, ("spark_jobs imports in the clean venv", found["sys.path"])
    assert found["discovered"] is True, done.stderr[-3000:]

    # the console script, and the version it reads from the installed metadata
    cli = _run([str(venv / "bin" / "controlmsg"), "--version"], timeout=60, cwd=tmp_path, env=env)
    assert cli.stdout.startswith(f"controlmsg {PROJECT['version']} ("), cli.stdout
