"""The secured local broker of the test session (``controlmsg broker start --security sasl-ssl``), and the CLI
runner that checks no password is ever printed. The fixture is ``tests/integration/conftest.py``'s
``secured``: one broker for ``test_secured_broker`` and ``test_refused``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from controlmsg.clusters.processes import free_ports


@dataclass(frozen=True)
class Secured:
    bootstrap_servers: str
    data_dir: Path
    properties: dict[str, Path]  # user -> client properties file
    passwords: tuple[str, ...]


def cli(*args: str, secret: tuple[str, ...] = (), stdin: bytes | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``controlmsg``; every output is checked to hold none of the ``secret`` strings."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": ""}  # the settings must come from the options alone
    proc = subprocess.run([sys.executable, "-m", "controlmsg", *args], input=stdin, capture_output=True,
                          timeout=timeout, check=False, env=env)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    for value in secret:
        assert value not in out and value not in err, f"a password was printed by controlmsg {args[0]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def error_lines(stderr: str) -> list[str]:
    # librdkafka's own log lines (``%<level>|...``) may surround controlmsg's one-line error.
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def start_secured(data_dir: Path) -> Iterator[Secured]:
    """Start the secured broker in ``data_dir``, yield it, stop it."""
    started = time.monotonic()
    proc = cli("broker", "start", "--security", "sasl-ssl", "--port", str(free_ports()),
                "--data-dir", str(data_dir), timeout=300)
    try:
        assert proc.returncode == 0, f"the secured broker did not start:\n{proc.stderr}"
        secrets = json.loads((data_dir / "secrets.json").read_text())
        passwords = (*secrets["users"].values(), secrets["controller"])
        for value in passwords:  # the start command printed none of them
            assert value not in proc.stdout and value not in proc.stderr
        record = json.loads((data_dir / "broker.json").read_text())
        print(f"secured broker started in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield Secured(
            bootstrap_servers=proc.stdout.strip(),
            data_dir=data_dir,
            properties={user: Path(path) for user, path in record["client_properties"].items()},
            passwords=passwords,
        )
    finally:
        cli("broker", "stop", "--data-dir", str(data_dir))
