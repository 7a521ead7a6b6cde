"""Control messages and the envelope type byte. Pure: no I/O.

A control message is a frozen dataclass that validates on construction, so an instance that exists is
always well-formed: a non-empty ``task_name``, ``task_count >= 1``, a ``timestamp`` that is a real int
inside the signed 64-bit range (watermarks only).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

__all__ = [
    "MAX_TIMESTAMP",
    "MIN_TIMESTAMP",
    "PROTOCOL_VERSION",
    "ControlMessage",
    "EndOfStreamMessage",
    "MessageType",
    "WatermarkMessage",
]

PROTOCOL_VERSION: Final = 1
"""The control-message version this code writes and the only one it reads."""

MIN_TIMESTAMP: Final = -(2**63)
MAX_TIMESTAMP: Final = 2**63 - 1
"""Watermark timestamps are signed 64-bit ms, as in Kafka. ``MAX_TIMESTAMP`` itself means "end of time":
a task that has ended counts as ``MAX_TIMESTAMP``, so a watermark message must be below it."""


class MessageType(IntEnum):
    """The first byte of every record value on an intermediate topic."""

    USER_MESSAGE = 0
    WATERMARK = 1
    END_OF_STREAM = 2
    USER_MESSAGE_OF_RUN = 3
    """Wire format 2: a user message that names its run in the envelope (docs/PROTOCOL.md, "Wire format 2")."""


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates cannot go on the wire
        return False
    return True


def _check_common(task_name: object, task_count: object, run_id: object, version: object,
                  generation: object = 0) -> None:
    if not isinstance(task_name, str) or not task_name or not _is_utf8(task_name):
        raise ValueError(f"taskName must be a non-empty UTF-8 string, got {task_name!r}")
    if type(task_count) is not int or not 1 <= task_count <= MAX_TIMESTAMP:
        raise ValueError(f"taskCount must be an integer in [1, 2**63-1], got {task_count!r}")
    if not isinstance(run_id, str) or not _is_utf8(run_id):
        raise ValueError(f"runId must be a UTF-8 string, got {run_id!r}")
    if type(version) is not int or not MIN_TIMESTAMP <= version <= MAX_TIMESTAMP:
        raise ValueError(f"version must be a 64-bit integer, got {version!r}")
    if type(generation) is not int or not 0 <= generation <= MAX_TIMESTAMP:
        raise ValueError(f"generation must be an integer in [0, 2**63-1], got {generation!r}")


@dataclass(frozen=True, slots=True)
class WatermarkMessage:
    """Upstream task ``task_name`` promises that no later message of its own is older than ``timestamp``.

    ``idle``: the task has no input for now and asks to be left out of the minimum while it is idle (its
    next watermark without ``idle`` brings it back); see docs/PROTOCOL.md, "Idle upstream tasks". On the
    wire an optional ``"idle": true`` field, so a reader that does not know it takes the message for an
    ordinary watermark (it then waits for the task, as before: never wrong, only slower).

    ``generation``: the task set the task belongs to (0 until the run is first rescaled); a higher one
    replaces the lower one's tasks on the partition it is read on. See docs/PROTOCOL.md, "Generations".
    """

    task_name: str
    task_count: int
    timestamp: int
    run_id: str = ""
    version: int = PROTOCOL_VERSION
    idle: bool = False
    generation: int = 0

    def __post_init__(self) -> None:
        _check_common(self.task_name, self.task_count, self.run_id, self.version, self.generation)
        if type(self.idle) is not bool:
            raise ValueError(f"idle must be true or false, got {self.idle!r}")
        if type(self.timestamp) is not int or not MIN_TIMESTAMP <= self.timestamp < MAX_TIMESTAMP:
            raise ValueError(
                f"timestamp must be an integer in [{MIN_TIMESTAMP}, {MAX_TIMESTAMP}), got {self.timestamp!r}"
            )

    @property
    def type(self) -> MessageType:
        return MessageType.WATERMARK


@dataclass(frozen=True, slots=True)
class EndOfStreamMessage:
    """Upstream task ``task_name`` (of generation ``generation``, see :class:`WatermarkMessage`) has written
    its last message to this topic in run ``run_id``."""

    task_name: str
    task_count: int
    run_id: str = ""
    version: int = PROTOCOL_VERSION
    generation: int = 0

    def __post_init__(self) -> None:
        _check_common(self.task_name, self.task_count, self.run_id, self.version, self.generation)

    @property
    def type(self) -> MessageType:
        return MessageType.END_OF_STREAM


ControlMessage = WatermarkMessage | EndOfStreamMessage
