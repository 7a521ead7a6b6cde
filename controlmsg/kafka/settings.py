"""Which Kafka cluster to talk to: the one rule every command, job and demo follows.

The bootstrap servers are, in this order: the address given (a ``--bootstrap-servers`` option),
``$KAFKA_BOOTSTRAP_SERVERS``, the local broker of :mod:`controlmsg.testing.broker` if one is running, and,
only where the caller asks for it (demos), that local broker started on the spot. The local broker is a
test tool: it is imported only when the first two give nothing.
"""

from __future__ import annotations

import os
import sys
from typing import Final

from controlmsg.errors import BrokerError

__all__ = ["resolve_bootstrap_servers"]

_ENV: Final = "KAFKA_BOOTSTRAP_SERVERS"


def resolve_bootstrap_servers(given: str | None = None, *, start_local: bool = False, local_port: int = 9092) -> str:
    """Return the Kafka bootstrap servers (``host:port[,...]``) to use.

    ``given`` if it is not empty, else ``$KAFKA_BOOTSTRAP_SERVERS`` if set and not empty, else the address
    of the local broker running from :func:`controlmsg.testing.broker.default_data_dir`. With
    ``start_local``, when none is running, that broker is started on ``127.0.0.1:local_port`` (a one-line
    note goes to stderr first); it keeps running after the caller exits.

    Blocks: only to start the local broker (``start_local``): until it serves, a few seconds; the first
    time also while Maven fetches Kafka. Otherwise it reads a few small files at most.

    Raises:
        BrokerError: nothing given, the variable is unset and no local broker runs (without
            ``start_local``; the message says how to start one or set the variable), or the local broker
            could not start (see :func:`controlmsg.testing.broker.start_broker`).
    """
    if given is not None and given.strip():
        return given.strip()
    env = os.environ.get(_ENV, "").strip()
    if env:
        return env
    from controlmsg.testing import broker

    running = broker.broker_status()
    if running is not None:
        return running.bootstrap_servers
    if not start_local:
        raise BrokerError(
            f"no Kafka broker configured: no --bootstrap-servers, {_ENV} is not set and no local broker is "
            f"running from {broker.default_data_dir()}; run `controlmsg broker start` or set "
            f"{_ENV}=host:port"
        )
    print(f"{_ENV} is not set: starting the local Kafka broker on 127.0.0.1:{local_port} (the first time, Maven "
          f"fetches Kafka {broker.KAFKA_VERSION}); stop it with: controlmsg broker stop", file=sys.stderr)
    return broker.start_broker(port=local_port).bootstrap_servers
