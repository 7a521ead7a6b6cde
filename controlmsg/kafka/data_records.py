"""The user records a reader of an intermediate topic gives (:class:`~controlmsg.kafka.reader.ControlReader`):
one :class:`DataRecord` each, or many at once as parallel lists (:class:`DataColumns`), and whether a record
belongs to the run the reader follows: by its ``controlmsg-run`` header in wire format 1 (:func:`same_run`), by
its envelope in wire format 2 (:func:`own_run_tag`, :func:`tagged_payload`). No I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final, cast

from confluent_kafka import Message

from controlmsg.core.codec import MAX_RUN_TAG_BYTES, run_tag, split_run
from controlmsg.core.messages import MessageType
from controlmsg.kafka.writer import HEADER_TASK

__all__ = ["DataColumns", "DataRecord", "own_run_tag", "same_run", "tagged_payload", "whole_batch"]


@dataclass(frozen=True, slots=True)
class DataRecord:
    """A user message: its position, key and payload (the user serde's bytes, without the type byte).

    ``message``: the Kafka message it came from (``None`` when built by hand); kept so that headers are
    only looked at when asked for (:attr:`upstream_task`), never on the hot path.
    """

    partition: int
    offset: int
    key: bytes | None
    payload: bytes
    message: Any = field(default=None, repr=False, compare=False)

    @property
    def upstream_task(self) -> str | None:
        """The upstream task that wrote the record, from its ``controlmsg-task`` header (written by a
        ControlWriter with ``data_headers=True``, a Spark write with ``runTag headers``); ``None`` when the
        record does not say (a record that names its run in the envelope names no task)."""
        headers = self.message.headers() if self.message is not None else None
        for name, value in headers or ():
            if name == HEADER_TASK and value is not None:
                return bytes(value).decode(errors="replace")
        return None


class DataColumns:
    """User messages as parallel lists, one entry per record in reading order: what
    :meth:`ControlReader.poll_columns` fills instead of making a :class:`DataRecord` per record.
    ``payloads`` are the user serde's bytes (without the type byte); ``messages`` the Kafka messages they
    came from (for headers and dead letters)."""

    __slots__ = ("keys", "messages", "offsets", "partitions", "payloads")

    def __init__(self) -> None:
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.keys: list[bytes | None] = []
        self.payloads: list[bytes] = []
        self.messages: list[Any] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def take_batch(self, msgs: Sequence[Any], values: list[bytes], start: int) -> list[int]:
        """Append every message of ``msgs`` as a record, its payload ``values[i][start:]`` (what
        :func:`whole_batch` found); return the messages' partitions. One C-level pass per column instead of
        a Python loop per record."""
        partitions = list(map(_PARTITION, msgs))
        self.partitions += partitions
        self.offsets += map(_OFFSET, msgs)
        self.keys += map(_KEY, msgs)
        self.payloads += map(operator.itemgetter(slice(start, None)), values)
        self.messages += msgs
        return partitions

    def record(self, i: int) -> DataRecord:
        """Record ``i`` as a :class:`DataRecord`."""
        return DataRecord(self.partitions[i], self.offsets[i], self.keys[i], self.payloads[i], self.messages[i])

    def select(self, indexes: Iterable[int]) -> DataColumns:
        """The records at ``indexes``, in that order, as new columns."""
        out = DataColumns()
        for i in indexes:
            out.partitions.append(self.partitions[i])
            out.offsets.append(self.offsets[i])
            out.keys.append(self.keys[i])
            out.payloads.append(self.payloads[i])
            out.messages.append(self.messages[i])
        return out


def same_run(headers: list[tuple[str, bytes | None]] | None, run_header: tuple[str, bytes]) -> bool:
    """Whether a user record with ``headers`` (``msg.headers()``) belongs to the run of ``run_header``
    (``(HEADER_RUN, run id as bytes)``): its first ``controlmsg-run`` header names that run, or it has
    none. The writer puts ``controlmsg-run`` first, so the usual record is decided by one tuple comparison
    in C; any other layout is scanned."""
    if not headers or headers[0] == run_header:
        return True
    name, run = run_header
    for key, value in headers:
        if key == name:
            return bool(value == run)
    return True


_NO_SUCH_TAG: Final = bytes((MessageType.USER_MESSAGE_OF_RUN, MAX_RUN_TAG_BYTES, 0xFF))
"""A tag no record has: byte 0xFF never occurs in UTF-8, so no run id begins with it."""


def own_run_tag(run_id: str | None) -> bytes | None:
    """The envelope tag by which a reader of run ``run_id`` knows its own records of wire format 2
    (:func:`~controlmsg.core.codec.run_tag`); ``None`` for a reader that follows no run given in advance
    (every run's records pass). A run id too long to be named in the envelope gets a tag no record has:
    no writer can have tagged a record with it."""
    if run_id is None:
        return None
    return run_tag(run_id) if len(run_id.encode()) <= MAX_RUN_TAG_BYTES else _NO_SUCH_TAG


def tagged_payload(value: bytes, own: bytes | None) -> bytes | None:
    """The payload of a user message that names its run (type byte 3) when it is of the run whose tag is
    ``own`` (:func:`own_run_tag`; ``None``: of any run), else ``None``. Raises
    :class:`~controlmsg.errors.DecodeError` for such a message cut short (its run longer than the value)."""
    if own is not None and value.startswith(own):
        return value[len(own):]
    payload = split_run(value)[1]
    return payload if own is None else None


# Message's methods unbound, for map(): a consumed record has an int partition and offset (the stubs say Optional).
_ERROR: Final[Callable[[Any], Any]] = Message.error
_VALUE: Final[Callable[[Any], Any]] = Message.value
_HEADERS: Final[Callable[[Any], Any]] = Message.headers
_PARTITION: Final[Callable[[Any], int]] = cast(Any, Message.partition)
_OFFSET: Final[Callable[[Any], int]] = cast(Any, Message.offset)
_KEY: Final[Callable[[Any], bytes | None]] = cast(Any, Message.key)
_USER_PREFIX: Final = bytes((MessageType.USER_MESSAGE,))


def whole_batch(msgs: Sequence[Any], own: bytes | None,
                run_header: tuple[str, bytes] | None) -> tuple[list[bytes], int] | None:
    """When every message of a consumed batch is a user record that a reader following the run of tag
    ``own`` and header ``run_header`` (``None``, ``None``: no run given) takes whole: their values and
    where the payloads begin in them; else ``None``, and the reader looks at each message in turn.

    The usual batch qualifies in two ways: every value begins with ``own`` (wire format 2, a reader of
    that run), or every value is a user message of format 1 and no message has headers or no run is
    followed (format 1 without a run header, ``runTag none``). A batch with an error event (a partition's
    end), a null value, a control message, another run's record or a run header does not: those need a
    decision per message. Decided in C, one pass per test, no Python code per message."""
    if list(map(_ERROR, msgs)).count(None) != len(msgs):
        return None
    values: list[bytes] = list(map(_VALUE, msgs))
    if None in values:
        return None
    if own is not None and all(map(bytes.startswith, values, repeat(own))):
        return values, len(own)
    if all(map(bytes.startswith, values, repeat(_USER_PREFIX))) and (
            run_header is None or not any(map(_HEADERS, msgs))):
        return values, 1
    return None
