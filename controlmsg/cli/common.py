"""What the sub-commands share: their exit codes, the client settings of their Kafka options, and the
signals that end a reading command (``consume``, ``inspect --watch``)."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, NoReturn

from controlmsg.clusters.local_address import local_bootstrap_servers
from controlmsg.kafka.settings import client_config_from_args

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PROTOCOL = 2
EXIT_TIMEOUT = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130


def _bootstrap(args: argparse.Namespace) -> dict[str, Any]:
    """The client settings of ``--bootstrap-servers``, ``-X`` and ``--kafka-config`` (see
    :mod:`controlmsg.kafka.settings`); without an address, the local broker's
    (:func:`~controlmsg.clusters.local_address.local_bootstrap_servers`)."""
    return dict(client_config_from_args(args, default_servers=local_bootstrap_servers))


class _Interrupted(Exception):
    pass


def _on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise _Interrupted(signal.Signals(signum).name)


_ENDING_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
"""What ends a ``consume`` or an ``inspect --watch``. SIGINT too is handled explicitly: a command started in
the background by a non-interactive shell inherits SIGINT ignored, and Python then raises no
KeyboardInterrupt, so ``kill -INT`` would not end it."""


def _handle_ending_signals(handler: Callable[[int, FrameType | None], Any] = _on_signal) -> list[Any]:
    """Install ``handler`` (default :func:`_on_signal`) for :data:`_ENDING_SIGNALS`; returns the previous
    handlers, in order."""
    return [signal.signal(signum, handler) for signum in _ENDING_SIGNALS]


class _Stopping:
    """An ending signal noted, to be acted on where the command's work is whole (a handler that raises could
    land between a batch read and the checkpoint of what was printed of it)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def note(self, signum: int, frame: FrameType | None) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def check(self) -> None:
        """Raise :class:`_Interrupted` once a signal was noted."""
        if self.signal is not None:
            raise _Interrupted(self.signal)


def _restore_signals(previous: list[Any]) -> None:
    for signum, handler in zip(_ENDING_SIGNALS, previous, strict=True):
        signal.signal(signum, handler)
