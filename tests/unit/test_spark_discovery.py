"""Spark finds ``format("controlmsg")`` by itself only if ``pkgutil.iter_modules()`` lists the top-level
module ``pyspark_controlmsg`` in the Python of its workers (pyspark's ``lookup_data_sources`` worker). An
editable install made the default way by setuptools hides it behind an import hook; the project's
``package-dir`` makes it a ``.pth`` path entry instead (docs/SPARK.md, Registration). Asked from a directory
outside the checkout, as a Spark Connect server or a cluster's worker would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LIST = "import pkgutil; print(sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')))"


def test_spark_sees_pyspark_controlmsg_from_outside_the_checkout(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", LIST], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "'pyspark_controlmsg'" in out, (
        f"pkgutil.iter_modules() does not list pyspark_controlmsg: {out.strip()}; an editable install from "
        "an import hook? Install with the project's pyproject.toml (make setup)")
