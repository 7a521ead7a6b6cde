"""The one shape of a local cluster's module: start, status, stop and ``main``, which each starter fills in.

* :class:`Starter`: one detached server per directory, the shape of :mod:`controlmsg.clusters.hdfs` and
  :mod:`controlmsg.clusters.s3`. The skeleton holds the directory and its lock, the record of the running
  server (a JSON file: what status and stop read), the previous run's log kept beside the new one, the wait
  until the server serves (it is killed when it exits or is late) and the stop of its process group; a
  subclass names the server and fills in its command line, when it serves, and its record.
* :class:`CommandLine`: ``python -m controlmsg.clusters.<part> start|stop|status [--dir D] [OPTIONS]``, what
  ``controlmsg local PART`` runs, for every part (hdfs, s3, spark, connect): start prints what a user needs,
  status the address of what runs, stop ends it; an error of the family is one ``error:`` line and exit 1.
* :func:`spark_home`: the pyspark installation that the Spark processes (a standalone cluster, a Connect
  server) start from.

The Kafka broker and the replicated cluster (:mod:`controlmsg.clusters.broker`,
:mod:`controlmsg.clusters.kraft_cluster`) keep records and checks of their own (a port, a security mode, a
quorum) and their command line in ``controlmsg broker``; what they share is :mod:`controlmsg.clusters.kraft`.
POSIX only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from controlmsg.clusters.processes import (
    file_lock,
    is_process_of,
    keep_previous_log,
    log_tail,
    make_directory,
    pid_alive,
    spawn_detached,
    terminate_group,
    write_text_atomic,
)
from controlmsg.errors import LocalClusterError

__all__ = ["CommandLine", "Launch", "Running", "Starter", "spark_home"]

_KILL_AFTER_FAILED_START = 5.0


def spark_home(needs: str = "the local Spark processes run from its installation") -> Path:
    """The directory of the pyspark installation (its ``bin/``, ``jars/``), what ``SPARK_HOME`` is for the
    Spark processes started from it. Does not block. Raises :class:`LocalClusterError` when pyspark is not
    installed in this Python; its message says what ``needs`` it."""
    try:
        import pyspark
    except ImportError as exc:
        raise LocalClusterError(f"pyspark is not installed in this Python ({sys.executable}); {needs} "
                                "(pip install 'controlmsg[spark]')") from exc
    return Path(pyspark.__file__).parent


class Running(Protocol):
    """What a starter's handle has: the server's pid (leader of its own process group) and its directory."""

    @property
    def pid(self) -> int: ...

    @property
    def directory(self) -> Path: ...


H = TypeVar("H", bound=Running)


@dataclass(frozen=True)
class Launch(Generic[H]):
    """What :meth:`Starter.launch` gives the skeleton: the server's command line, and its handle once the
    server's pid is known."""

    argv: Sequence[str]
    handle: Callable[[int], H]


class Starter(ABC, Generic[H]):
    """One detached server per directory: started, asked after and stopped the same way for every starter.

    In the directory: the server's log (:attr:`log_file`, the previous run's kept as ``<log_file>.1``), its
    record (:attr:`record_file`, JSON, written once the server serves) and a lock file (:attr:`lock_file`)
    that makes a start and a stop of the same directory wait for each other. A subclass sets the class
    attributes and fills in the hooks; the module's public functions call :meth:`start`, :meth:`status` and
    :meth:`stop`. An instance holds what one start needs beyond the directory (a cache directory).
    """

    label: ClassVar[str]
    """The server as messages name it: ``"HDFS"`` makes "the local HDFS"."""
    error: ClassVar[type[LocalClusterError]]
    """What :meth:`start` and :meth:`stop` raise."""
    record_file: ClassVar[str]
    log_file: ClassVar[str]
    lock_file: ClassVar[str]
    stop_timeout: ClassVar[float]
    """Seconds between SIGTERM and SIGKILL in :meth:`stop`."""
    poll_interval: ClassVar[float] = 0.2
    late: ClassVar[str] = "was not up"
    """How a start that timed out is told: "the local HDFS at ... (pid N) was not up within T s"."""

    @property
    def what(self) -> str:
        return f"the local {self.label}"

    # ------------------------------------------------------------------------------------------ the hooks

    def check(self) -> None:
        """Called first by :meth:`start`, before anything is created: raise :attr:`error` when what the server
        needs is not installed. Does nothing unless overridden."""

    @abstractmethod
    def launch(self, directory: Path) -> Launch[H]:
        """Called by :meth:`start` under the directory's lock when no server runs from it: fetch what the
        server needs, clear what the last run left and pick its ports; return its command line. May block
        (a first download); raises :attr:`error` (or another error of the family, which :meth:`start` makes
        one)."""

    @abstractmethod
    def serves(self, handle: H) -> bool:
        """True once the started server serves (polled every :attr:`poll_interval` s). Never raises."""

    @abstractmethod
    def address(self, handle: H) -> str:
        """Where clients reach the server (a URI, a URL), for messages."""

    @abstractmethod
    def markers(self, handle: H) -> tuple[str, ...]:
        """Strings that the server's command line holds (and, as far as can be, no other process's): its pid is
        signalled only while they are there (pid reuse)."""

    @abstractmethod
    def to_record(self, handle: H) -> dict[str, object]:
        """The record written once the server serves (JSON)."""

    @abstractmethod
    def from_record(self, record: Mapping[str, Any], directory: Path) -> H:
        """The handle of ``record``; raises ``KeyError``, ``TypeError`` or ``ValueError`` when it is not one."""

    # ------------------------------------------------------------------------------------------ the shape

    def start(self, directory: Path, timeout: float) -> H:
        """Start the server from ``directory`` (created if missing) and block until it serves; return its
        handle. Idempotent: when the server recorded in ``directory`` runs, its handle is returned.

        Blocks: at most ``timeout`` s from the server's spawn (what :meth:`launch` fetches first is not
        counted). Raises :attr:`error` when the server cannot be launched, exits or does not serve within
        ``timeout`` (it is then killed, and the message ends with the tail of its log); ``ValueError`` when
        ``timeout`` is not positive."""
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.check()
        directory = make_directory(directory, f"{self.what}'s directory", self.error)
        with file_lock(directory / self.lock_file):
            running = self.status(directory)
            if running is not None:
                return running
            (directory / self.record_file).unlink(missing_ok=True)
            try:
                launch = self.launch(directory)
            except LocalClusterError as exc:
                if isinstance(exc, self.error):
                    raise
                raise self.error(f"cannot start {self.what}: {exc}") from exc
            log = directory / self.log_file
            keep_previous_log(log)
            started = time.monotonic()
            handle = launch.handle(spawn_detached(launch.argv, log))
            try:
                self._wait_until_serving(handle, log, started + timeout, timeout)
                write_text_atomic(directory / self.record_file, json.dumps(self.to_record(handle), indent=2) + "\n")
            except BaseException:
                with contextlib.suppress(LocalClusterError):
                    terminate_group(handle.pid, self.markers(handle), _KILL_AFTER_FAILED_START, what=self.what)
                raise
            logging.getLogger(type(self).__module__).info(
                "%s up at %s (pid %d) in %.1f s", self.label, self.address(handle), handle.pid,
                time.monotonic() - started)
            return handle

    def _wait_until_serving(self, handle: H, log: Path, deadline: float, timeout: float) -> None:
        while True:
            if not pid_alive(handle.pid):
                raise self.error(f"{self.what} (pid {handle.pid}) exited during start-up" + log_tail(log))
            if self.serves(handle):
                return
            if time.monotonic() >= deadline:
                raise self.error(f"{self.what} at {self.address(handle)} (pid {handle.pid}) {self.late} within "
                                 f"{timeout:g} s; it was killed" + log_tail(log))
            time.sleep(self.poll_interval)

    def status(self, directory: Path) -> H | None:
        """The server recorded in ``directory`` if it runs, else None. Does not block, does not raise."""
        directory = directory.expanduser().resolve()
        try:
            record = json.loads((directory / self.record_file).read_text(encoding="utf-8"))
            handle = self.from_record(record, directory)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return handle if is_process_of(handle.pid, *self.markers(handle)) else None

    def stop(self, directory: Path) -> bool:
        """Stop the server recorded in ``directory``: SIGTERM to its process group, SIGKILL after
        :attr:`stop_timeout` s; its record goes. Returns False when none was running. Blocks until it is gone.
        Raises :attr:`error` when it survives SIGKILL."""
        directory = directory.expanduser().resolve()
        if not directory.is_dir():
            return False
        with file_lock(directory / self.lock_file):
            handle = self.status(directory)
            (directory / self.record_file).unlink(missing_ok=True)
            if handle is None:
                return False
            try:
                return terminate_group(handle.pid, self.markers(handle), self.stop_timeout, what=self.what)
            except LocalClusterError as exc:
                raise self.error(str(exc)) from exc


def _no_options(parser: argparse.ArgumentParser) -> None:
    """No options beyond ``--dir``."""


T = TypeVar("T")


@dataclass(frozen=True)
class CommandLine(Generic[T]):
    """``python -m controlmsg.clusters.<part> ACTION [--dir D] [OPTIONS]``: the ``main`` of every local cluster's
    module, which ``controlmsg local PART`` runs with the rest of its command line.

    Actions: ``start`` (``start`` prints what a user needs on stdout), ``stop``, ``status`` (prints the
    ``address`` of what ``status`` finds running, or says on stderr that nothing runs and exits 1), then the
    part's own ``actions`` (each prints what it returns). ``--dir`` (a ``Path``, default ``directory``) and
    the part's ``options`` reach the callables. An error of the family (:class:`LocalClusterError`) is one
    ``error: ...`` line on stderr and exit code 1; log records at INFO go to stderr.
    """

    prog: str
    description: str
    label: str
    """What runs, in the messages: ``"local HDFS"`` makes "no local HDFS runs from D"."""
    directory: str
    directory_help: str
    start: Callable[[argparse.Namespace], None]
    status: Callable[[Path], T | None]
    address: Callable[[T], str]
    stop: Callable[[Path], bool]
    """False: there was nothing to stop."""
    nothing_to_stop: str = "no {label} ran from {dir}"
    nothing_to_stop_code: int = 0
    options: Callable[[argparse.ArgumentParser], None] = _no_options
    actions: Mapping[str, Callable[[], object]] = field(default_factory=dict)
    actions_help: str | None = None

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=self.prog, description=self.description)
        parser.add_argument("action", choices=["start", "stop", "status", *self.actions], help=self.actions_help)
        parser.add_argument("--dir", type=Path, default=Path(self.directory), help=self.directory_help)
        self.options(parser)
        return parser

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Parse ``argv`` (default ``sys.argv[1:]``), run the action; return the exit code. Blocks as the
        action does. Raises ``SystemExit`` on a command line it cannot parse, and for ``--help``."""
        args = self.parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        try:
            if args.action == "start":
                self.start(args)
            elif args.action == "status":
                found = self.status(args.dir)
                if found is None:
                    print(f"no {self.label} runs from {args.dir}", file=sys.stderr)
                    return 1
                print(self.address(found))
            elif args.action == "stop":
                if not self.stop(args.dir):
                    print(self.nothing_to_stop.format(label=self.label, dir=args.dir), file=sys.stderr)
                    return self.nothing_to_stop_code
            else:
                print(self.actions[args.action]())
        except LocalClusterError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
