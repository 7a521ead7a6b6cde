"""The jars of the tests that run on pyspark 4.2.0 only (``make test-spark42``, marker ``spark42``): spark-avro
and Delta. Maven Central serves both for Spark 4.2 and neither for 4.3 (docs/SPARK.md).

Each is a pinned :class:`~controlmsg.clusters.jar_sets.JarSet` (the lock next to this module names every jar
with its size and SHA-256), fetched once into the cache (:func:`controlmsg.paths.cache_dir`) and verified
before each use by :func:`controlmsg.clusters.maven_jars.ensure_jars`; a fetch that fails raises, so the
tests fail, never skip. Only the jars themselves: what they need beyond them (Avro, ANTLR, Scala) is
pyspark's own.

Maintainers: ``python -m tests.spark.spark42_jars avro|delta --write-lock`` rewrites a lock.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from controlmsg.clusters.jar_sets import Coordinate, JarSet, read_lock
from controlmsg.clusters.maven_jars import ensure_jars, lock_main

SPARK_VERSION: Final = "4.2.0"
DELTA_VERSION: Final = "4.4.0"
"""delta-spark's version: 4.4.x allows pyspark <= 4.2.0, and its Spark 4.2 jar resolves at 4.4.0, not 4.4.1."""

_HERE = Path(__file__).parent

AVRO_JARS: Final = JarSet(
    title=f"spark-avro {SPARK_VERSION}",
    directory=f"spark-avro-{SPARK_VERSION}",
    module="spark-avro-runtime",
    revision=SPARK_VERSION,
    coordinates=(Coordinate("org.apache.spark", "spark-avro_2.13", SPARK_VERSION, transitive=False),),
    lock_file=_HERE / "avro-jars.lock",
)
"""``from_avro`` and ``to_avro``."""

DELTA_JARS: Final = JarSet(
    title=f"Delta {DELTA_VERSION} for Spark 4.2",
    directory=f"delta-{DELTA_VERSION}-spark-4.2",
    module="delta-runtime",
    revision=DELTA_VERSION,
    coordinates=(Coordinate("io.delta", "delta-spark_4.2_2.13", DELTA_VERSION, transitive=False),
                 Coordinate("io.delta", "delta-storage", DELTA_VERSION, transitive=False)),
    lock_file=_HERE / "delta-jars.lock",
)
"""``format("delta")``: with :data:`DELTA_SESSION_CONF` on the session."""

DELTA_SESSION_CONF: Final = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

SETS: Final = {"avro": AVRO_JARS, "delta": DELTA_JARS}


def spark_jars(*sets: JarSet) -> str:
    """``spark.jars`` for ``sets``: their verified jars in the cache, fetched the first time. Raises
    :class:`~controlmsg.errors.LocalClusterError` when a set cannot be fetched or verified."""
    paths: list[str] = []
    for jar_set in sets:
        libs = ensure_jars(jar_set)
        paths += [str(libs / jar.name) for jar in read_lock(jar_set.lock_file, jar_set.error)]
    return ",".join(paths)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in SETS:
        sys.exit(f"usage: python -m tests.spark.spark42_jars {'|'.join(SETS)} [--write-lock]")
    chosen = SETS[sys.argv[1]]
    sys.exit(lock_main(chosen, f"python -m tests.spark.spark42_jars {sys.argv[1]}",
                       lambda cache: ensure_jars(chosen, cache), sys.argv[2:]))
