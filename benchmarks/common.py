"""What the benchmark scripts share: the Kafka broker of a run.

Imported by the scripts as a sibling module (``python benchmarks/<script>.py`` puts this directory first
on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def kafka_cluster() -> Iterator[str]:
    """``$KAFKA_BOOTSTRAP_SERVERS``, or a local broker started here on a free port for the run (stopped
    and its data removed on exit). Yields the bootstrap servers; says which on stdout."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if given:
        print(f"broker: {given} (from $KAFKA_BOOTSTRAP_SERVERS)", flush=True)
        yield given
        return
    from controlmsg.testing.broker import start_broker, stop_broker

    data_dir = Path(tempfile.mkdtemp(prefix="controlmsg-bench-broker-"))
    try:
        started = time.monotonic()
        handle = start_broker(port=free_port(), data_dir=data_dir)
        print(f"broker: started {handle.bootstrap_servers} ({time.monotonic() - started:.1f} s)", flush=True)
        try:
            yield handle.bootstrap_servers
        finally:
            stop_broker(data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
