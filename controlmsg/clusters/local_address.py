"""Where the local Kafka is: the fallback address the CLI, the jobs and the benchmarks hand to
:func:`controlmsg.kafka.settings.resolve_bootstrap_servers` (``default_servers``).

The Kafka layer does not know about the local clusters (they sit above it); a command that wants to find
the broker ``controlmsg broker start`` left running passes :func:`local_bootstrap_servers` in, one that
may start it on the spot (the demos, the pipeline, ``spark_jobs.generate``) binds ``start=True``::

    client_config_from_args(args, default_servers=local_bootstrap_servers)
    client_config_from_args(args, default_servers=functools.partial(local_bootstrap_servers, start=True))

It is asked only when no setting names ``bootstrap.servers`` and ``$KAFKA_BOOTSTRAP_SERVERS`` is unset, and
imports the local broker's modules only then: a command given an address never loads them.
"""

from __future__ import annotations

import sys
from typing import Final

from controlmsg.errors import BrokerError

__all__ = ["local_bootstrap_servers", "running_bootstrap_servers"]

_ENV: Final = "KAFKA_BOOTSTRAP_SERVERS"


def running_bootstrap_servers() -> str | None:
    """The address of the local broker running from :func:`controlmsg.clusters.broker.default_data_dir`,
    else of the nodes that run of the local KRaft cluster (:func:`controlmsg.clusters.kraft_cluster.
    cluster_status`), else ``None``. Reads a few small files; starts nothing."""
    from controlmsg.clusters import broker, kraft_cluster

    running = broker.broker_status()
    if running is not None:
        return running.bootstrap_servers
    cluster = kraft_cluster.cluster_status()
    if cluster is not None:
        up = [n.address for n in cluster.nodes if n.pid is not None]
        if up:
            return ",".join(up)
    return None


def local_bootstrap_servers(*, start: bool = False, port: int = 9092) -> str:
    """:func:`running_bootstrap_servers`; when none runs and ``start``, the local broker started on
    ``127.0.0.1:port`` (a one-line note goes to stderr first); it keeps running after the caller exits.

    Blocks: only to start the local broker (``start``): until it serves, a few seconds; the first time also
    while Kafka's jars are fetched (see :mod:`controlmsg.clusters.kafka_jars`).

    Raises:
        BrokerError: none runs and not ``start`` (the message says how to start one or set
            ``$KAFKA_BOOTSTRAP_SERVERS``: it is the last resort of a resolution that found neither an
            address given nor the variable), or the local broker could not start (see
            :func:`controlmsg.clusters.broker.start_broker`).
    """
    from controlmsg.clusters import broker

    running = running_bootstrap_servers()
    if running is not None:
        return running
    if not start:
        raise BrokerError(
            f"no Kafka broker configured: no --bootstrap-servers, {_ENV} is not set and no local broker is "
            f"running from {broker.default_data_dir()}; run `controlmsg broker start` or set "
            f"{_ENV}=host:port"
        )
    print(f"{_ENV} is not set: starting the local Kafka broker on 127.0.0.1:{port} (the first time, "
          f"Kafka {broker.KAFKA_VERSION}'s jars are fetched); stop it with: controlmsg broker stop", file=sys.stderr)
    return broker.start_broker(port=port).bootstrap_servers
