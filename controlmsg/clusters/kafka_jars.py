"""Apache Kafka's broker jars: resolved once from Maven Central artifacts, pinned, verified before every use.

The local broker (:mod:`controlmsg.clusters.broker`, :mod:`controlmsg.clusters.kraft_cluster`) runs
``org.apache.kafka:kafka_2.13`` with its runtime dependencies plus a log4j SLF4J binding. The exact jar set
is pinned in ``kafka-jars.lock`` next to this module: every jar's file name, size and SHA-256, and nothing
else is on the broker's classpath.

How they are resolved (pyspark's Ivy, or Maven: :mod:`controlmsg.clusters.jar_resolvers`), cached, verified
and installed (:mod:`controlmsg.clusters.maven_jars`) is shared with the other local clusters' jar sets; this
module names the Kafka set. ``CONTROLMSG_KAFKA_RESOLVER=ivy|maven`` picks its resolver. Spark's own
``--packages`` resolution is not used because it always leaves out ``scala-library``, which the broker needs.

Maintainers: after a version change, ``python -m controlmsg.clusters.kafka_jars --write-lock`` resolves the
set anew (no verification) and rewrites the lock; review the diff.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

from controlmsg.clusters import jar_resolvers, jar_sets, maven_jars
from controlmsg.clusters.jar_resolvers import IVY_SETTINGS_ENV, RESOLVERS
from controlmsg.clusters.jar_sets import Coordinate, JarSet, LockedJar, verify_jars
from controlmsg.errors import BrokerError

__all__ = [
    "IVY_SETTINGS_ENV",
    "KAFKA_JARS",
    "KAFKA_VERSION",
    "LOCK_FILE",
    "RESOLVERS",
    "RESOLVER_ENV",
    "LockedJar",
    "ensure_kafka_libs",
    "read_lock",
    "verify_jars",
]

KAFKA_VERSION: Final = "4.1.1"
"""Apache Kafka version that is fetched and run."""

SCALA_VERSION: Final = "2.13"
# Kafka 4.1 resolves slf4j-api 1.7.x, so the SLF4J 1.x binding is the one that binds.
LOG4J_VERSION: Final = "2.24.3"

COORDINATES: Final = (
    ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
    ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
)
"""What is resolved (runtime scope, transitively): group, artifact, version."""

LOCK_FILE: Final = Path(__file__).with_name("kafka-jars.lock")
"""The pinned jar set: ``<sha256>  <size>  <file name>`` lines."""

RESOLVER_ENV: Final = "CONTROLMSG_KAFKA_RESOLVER"

KAFKA_JARS: Final = JarSet(
    title=f"Apache Kafka {KAFKA_VERSION}'s jars",
    directory=f"kafka-{KAFKA_VERSION}",
    module="kafka-runtime",
    revision=KAFKA_VERSION,
    coordinates=tuple(Coordinate(*c) for c in COORDINATES),
    lock_file=LOCK_FILE,
    error=BrokerError,
    resolver_env=RESOLVER_ENV,
)
"""The broker's classpath as a :class:`~controlmsg.clusters.jar_sets.JarSet`."""

# The set's resolution under the names it had before maven_jars was factored out (its tests use them).
_Resolver = jar_resolvers.Resolver


def _jar_set() -> JarSet:
    """:data:`KAFKA_JARS` with the lock this module names at the call (a test may point ``LOCK_FILE`` at
    another)."""
    return replace(KAFKA_JARS, lock_file=LOCK_FILE)


def _pyspark_ivy_jar() -> Path | None:
    return jar_resolvers.pyspark_ivy_jar()


def _ivy_module_xml(module: str = "kafka-runtime") -> str:
    return jar_resolvers.ivy_module_xml(KAFKA_JARS, module)


def _pom_xml() -> str:
    return jar_resolvers.pom_xml(KAFKA_JARS)


def _ivy_resolver(ivy_jar: Path) -> jar_resolvers.Resolver:
    return jar_resolvers.ivy_resolver(KAFKA_JARS, ivy_jar)


def _resolvers() -> list[jar_resolvers.Resolver]:
    """The resolvers to try, in order. Raises :class:`BrokerError` naming what to install when there is none."""
    return jar_resolvers.resolvers(KAFKA_JARS, lambda: _pyspark_ivy_jar())


def read_lock(path: Path | None = None) -> tuple[LockedJar, ...]:
    """The jars pinned in ``path``, sorted by name. Raises :class:`BrokerError` when it is missing or a line is
    not ``<64 hex digits>  <size>  <file name>.jar`` (``#`` starts a comment). Default: :data:`LOCK_FILE`."""
    return jar_sets.read_lock(path if path is not None else LOCK_FILE, BrokerError)


def ensure_kafka_libs(cache_dir: Path | None = None) -> Path:
    """Make sure the locked Kafka jars are in the cache, verified, and return their directory.

    The jars live in ``<cache_dir>/kafka-<KAFKA_VERSION>/libs`` (``cache_dir`` defaults to
    :func:`controlmsg.paths.cache_dir`). When that directory holds exactly the jars of the lock, each with
    its SHA-256, it is returned at once. Otherwise (first use, a damaged or half-written jar, a stray file)
    the set is resolved anew (see :mod:`controlmsg.clusters.maven_jars`) and installed only once complete and
    verified. Concurrent callers are serialised with a file lock.

    Blocks: while the jars are hashed (about 0.05 s); the first time, while a resolver downloads about
    44 MB (seconds to a minute; at most 15 minutes each), or while another process holds the lock.

    Raises:
        BrokerError: no resolver is available (the message names what to install), or none delivered
            the locked set (each jar that differed with its expected and actual SHA-256, or each
            resolver's failure with the tail of its output), or the cache cannot be written.
    """
    return maven_jars.ensure_jars(_jar_set(), cache_dir, find_resolvers=lambda: _resolvers())


def main(argv: Sequence[str] | None = None) -> int:
    return maven_jars.lock_main(KAFKA_JARS, "python -m controlmsg.clusters.kafka_jars", ensure_kafka_libs, argv)


if __name__ == "__main__":
    sys.exit(main())
