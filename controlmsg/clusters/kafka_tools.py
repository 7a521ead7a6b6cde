"""Apache Kafka's own command-line tools (``kafka-consumer-groups``), run from their jars: what a platform team
looks at a cluster with, so that the tests check what those tools show, not what our code thinks they show.

The tools run on the broker's classpath (:mod:`controlmsg.clusters.kafka_jars`: the clients, the server's
command-line parsing, logging) plus ``org.apache.kafka:kafka-tools`` alone, a pinned set of its own
(``kafka-tools-jars.lock`` next to this module; its other dependencies, Connect's runtime among them, are
not needed by these tools), cached and verified the same way in a directory of its own.

Maintainers: ``python -m controlmsg.clusters.kafka_tools --write-lock`` resolves the set anew.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from controlmsg.clusters import jar_resolvers, maven_jars
from controlmsg.clusters.jar_sets import Coordinate, JarSet
from controlmsg.clusters.kafka_jars import KAFKA_VERSION, ensure_kafka_libs
from controlmsg.clusters.processes import java_executable
from controlmsg.errors import BrokerError

__all__ = ["CONSUMER_GROUPS_CLASS", "KAFKA_TOOLS_JARS", "consumer_groups", "ensure_tools_libs"]

CONSUMER_GROUPS_CLASS: Final = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
"""What ``bin/kafka-consumer-groups.sh`` runs."""

KAFKA_TOOLS_JARS: Final = JarSet(
    title=f"Apache Kafka {KAFKA_VERSION}'s tools jars",
    directory=f"kafka-tools-{KAFKA_VERSION}",
    module="kafka-tools-runtime",
    revision=KAFKA_VERSION,
    coordinates=(Coordinate("org.apache.kafka", "kafka-tools", KAFKA_VERSION, transitive=False),),
    lock_file=Path(__file__).with_name("kafka-tools-jars.lock"),
    error=BrokerError,
)
"""The tools' classpath as a :class:`~controlmsg.clusters.jar_sets.JarSet`."""


def ensure_tools_libs(cache_dir: Path | None = None) -> Path:
    """The locked tools jars' directory, fetched and verified first when needed (see
    :func:`controlmsg.clusters.kafka_jars.ensure_kafka_libs`, whose contract this shares)."""
    return maven_jars.ensure_jars(KAFKA_TOOLS_JARS, cache_dir,
                                  find_resolvers=lambda: jar_resolvers.resolvers(KAFKA_TOOLS_JARS,
                                                                                 jar_resolvers.pyspark_ivy_jar))


def consumer_groups(bootstrap_servers: str, *args: str, timeout: float = 120.0) -> str:
    """``kafka-consumer-groups --bootstrap-server <bootstrap_servers> <args>``: its standard output. Raises
    :class:`~controlmsg.errors.BrokerError` with its output when it exits non-zero or outlives ``timeout``."""
    classpath = f"{ensure_tools_libs() / '*'}:{ensure_kafka_libs() / '*'}"
    command = [java_executable(), "-Xmx256m", "-cp", classpath, CONSUMER_GROUPS_CLASS,
               "--bootstrap-server", bootstrap_servers, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"kafka-consumer-groups {' '.join(args)} did not end within {timeout:g} s") from exc
    if done.returncode != 0:
        raise BrokerError(f"kafka-consumer-groups {' '.join(args)} exited {done.returncode}: "
                          f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def main(argv: Sequence[str] | None = None) -> int:
    return maven_jars.lock_main(KAFKA_TOOLS_JARS, "python -m controlmsg.clusters.kafka_tools", ensure_tools_libs, argv)


if __name__ == "__main__":
    sys.exit(main())
