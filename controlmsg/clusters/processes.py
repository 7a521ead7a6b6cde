"""Local processes for the test tools: detached daemons, their pids, locks, atomic files, helper tools.

What the local clusters share to run their servers as detached processes and to stop them safely (a pid
is only signalled while it still runs the expected command line, which guards against pid reuse); the
start/status/stop shape they fill in is :mod:`controlmsg.clusters.starter`. POSIX only.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from controlmsg.errors import BrokerError, LocalClusterError

__all__ = [
    "as_text", "cmdline", "descendants", "file_lock", "is_process_of", "java_executable", "keep_previous_log",
    "log_tail", "make_directory", "pid_alive", "port_free", "run_tool", "spawn_detached", "tail_section",
    "tcp_accepts", "terminate", "terminate_group", "write_text_atomic",
]

LOG_TAIL_LINES = 30
OUTPUT_TAIL_LINES = 30
_KILL_WAIT = 10.0
_HOST = "127.0.0.1"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing); blocks."""
    import fcntl  # POSIX only; imported here so the module imports anywhere.

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise BrokerError(f"cannot open lock file {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def write_text_atomic(path: Path, text: str, *, private: bool = False) -> None:
    """Replace ``path`` with ``text``; ``private``: readable by the owner only (0600) from the start."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        tmp.replace(path)
    except OSError as exc:
        raise BrokerError(f"cannot write {path}: {exc}") from exc


def make_directory(path: Path, what: str, error: type[LocalClusterError] = BrokerError) -> Path:
    """``path`` made absolute (``~`` expanded) and created with its parents if missing. Raises ``error``
    ("cannot create ``what`` ``path``: why") when it cannot be created."""
    path = path.expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"cannot create {what} {path}: {exc}") from exc
    return path


def keep_previous_log(log_path: Path) -> None:
    """Move ``log_path`` (if there is one) to ``<log_path>.1``, so a new start writes a log of its own and the
    previous run's stays beside it. Does not raise when there is none."""
    with contextlib.suppress(FileNotFoundError):
        log_path.replace(log_path.with_name(log_path.name + ".1"))


def as_text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data


def tail_section(label: str, text: str, lines: int) -> str:
    tail = text.rstrip().splitlines()[-lines:]
    if not tail:
        return f" ({label} is empty)"
    return f"; last {len(tail)} lines of {label}:\n" + "\n".join(tail)


def log_tail(log_path: Path) -> str:
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            data = fh.read()
    except OSError:
        return f" ({log_path} is missing)"
    return tail_section(str(log_path), as_text(data), LOG_TAIL_LINES)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME", "").strip()
    if java_home:
        candidate = Path(java_home).expanduser() / "bin" / "java"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
        raise BrokerError(
            f"JAVA_HOME is set to {java_home!r} but {candidate} is not an "
            "executable; fix or unset JAVA_HOME (Java 17+ is required)"
        )
    java = shutil.which("java")
    if java is None:
        raise BrokerError("`java` is not on PATH and JAVA_HOME is not set; the Kafka broker needs Java 17 or newer")
    return java


_EPHEMERAL_DEFAULT = (32768, 60999)


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's ``ip_local_port_range``; elsewhere its
    default, 32768-60999)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT
    return low, high


def free_ports(count: int = 1, *, exclude: Collection[int] = ()) -> int:
    """The first of ``count`` consecutive ports on 127.0.0.1 that are free now, outside the kernel's
    ephemeral range and outside ``exclude``.

    Why not the ephemeral range (what binding port 0 gives): a server there that dies cannot always
    start again at once. A client that keeps reconnecting to the dead port can be given that very port
    as its own, and TCP then connects the socket to itself; the port stays taken while that connection
    lives and for a minute of TIME_WAIT after. Seen with a killed node of the local cluster, which its
    peers and clients call again and again.

    Raises :class:`BrokerError` when no such ports are found (after 500 random picks).
    """
    low, high = ephemeral_port_range()
    start, end = (10000, low - 1) if low - 10000 > 1000 + count else (high + 1, 65535)
    pick = random.SystemRandom()
    for _ in range(500):
        base = pick.randint(start, end - count + 1)
        ports = range(base, base + count)
        if not any(p in exclude for p in ports) and all(port_free(p) for p in ports):
            return base
    raise BrokerError(f"no {count} consecutive free port(s) in {start}-{end} on {_HOST}")


def port_free(port: int) -> bool:
    """True if ``127.0.0.1:port`` can be bound (as a listening server would)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the JVM on POSIX: ignore TIME_WAIT leftovers, not live listeners.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
    return True


def run_tool(cmd: Sequence[str], what: str, timeout: float, cwd: Path | None) -> str:
    shown = shlex.join(cmd)
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(
            f"{what}: `{shown}` did not finish within {timeout:.0f} s"
            + tail_section("output", as_text(exc.output), OUTPUT_TAIL_LINES)
        ) from exc
    except OSError as exc:
        raise BrokerError(f"{what}: cannot run `{shown}`: {exc}") from exc
    if proc.returncode != 0:
        raise BrokerError(
            f"{what} failed (exit code {proc.returncode}): `{shown}`"
            + tail_section("output", proc.stdout, OUTPUT_TAIL_LINES)
        )
    return proc.stdout


def spawn_detached(argv: Sequence[str], log_path: Path) -> int:
    """Start ``argv`` in a new session, output appended to ``log_path``; no wait."""
    file_actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (
            os.POSIX_SPAWN_OPEN,
            1,
            str(log_path),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        ),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    # Python ignores SIGPIPE/SIGXFSZ and callers may ignore others; an ignored
    # SIGTERM would be inherited and make the JVM skip its clean shutdown hook.
    reset = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGHUP, signal.SIGINT}
    reset.add(signal.SIGTERM)
    try:
        return os.posix_spawn(
            argv[0],
            list(argv),
            dict(os.environ),
            file_actions=file_actions,
            setsid=True,
            setsigmask=(),
            setsigdef=reset,
        )
    except OSError as exc:
        raise BrokerError(f"cannot start `{shlex.join(argv)}`: {exc}") from exc


def pid_alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process; reaps it if it is our child."""

    def reaped() -> bool:
        try:
            return os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:  # not our child (or already reaped)
            return False

    if reaped():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if stat.rpartition(")")[2].split()[:1] == ["Z"]:
        reaped()  # it may have died just after the first check
        return False
    return True


def cmdline(pid: int) -> str | None:
    """The command line of ``pid`` ("" if it is gone), or None if it cannot be told."""
    proc_dir = Path("/proc")
    if proc_dir.is_dir():
        try:
            raw = (proc_dir / str(pid) / "cmdline").read_bytes()
        except FileNotFoundError:
            return ""
        except OSError:
            return None
        return raw.replace(b"\0", b" ").decode("utf-8", errors="replace")
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip()


def tcp_accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def is_process_of(pid: int, *markers: str) -> bool:
    """True if ``pid`` is alive and (as far as can be told) its command line holds every marker."""
    if pid <= 0 or not pid_alive(pid):
        return False
    line = cmdline(pid)
    if line is None:
        return True
    if all(m in line for m in markers):
        return True
    pid_alive(pid)  # a zombie has an empty command line: reap it if it is our child
    return False


def _wait_gone(pid: int, markers: Sequence[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while is_process_of(pid, *markers):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def terminate(pid: int, markers: Sequence[str], timeout: float, *, what: str = "process") -> None:
    """SIGTERM ``pid``, wait ``timeout`` s, then SIGKILL it; signals only while ``pid`` still runs a command
    line with every marker (pid reuse). Raises :class:`BrokerError` if it survives SIGKILL."""
    if not is_process_of(pid, *markers):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, markers, timeout):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if not _wait_gone(pid, markers, _KILL_WAIT):
        raise BrokerError(f"{what} {pid} is still alive after SIGKILL")


def terminate_group(pid: int, markers: Sequence[str], timeout: float, *, what: str = "process") -> bool:
    """Stop the process group that ``pid`` leads (as :func:`spawn_detached` starts them): SIGTERM to the group,
    wait up to ``timeout`` s for ``pid`` to end, then SIGKILL to the group. Only while ``pid`` still runs a
    command line with every marker (pid reuse); returns False, signalling nothing, when it does not. Blocks
    until ``pid`` is gone. Raises :class:`LocalClusterError` if it survives SIGKILL."""
    if not is_process_of(pid, *markers):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    gone = _wait_gone(pid, markers, timeout)
    # The rest of the group (children the leader did not wait for) goes with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if not gone and not _wait_gone(pid, markers, _KILL_WAIT):
        raise LocalClusterError(f"{what} {pid} is still alive after SIGKILL")
    return True


def descendants(root: int) -> list[int]:
    """Every live descendant of process ``root``, parents before children (from ``/proc``; empty where there
    is no ``/proc``). Stopping a process group alone may leave some behind: the PySpark daemon, for one, puts
    itself in a group of its own."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found
