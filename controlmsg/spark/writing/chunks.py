"""A batch write task that commits as it goes: option ``commitRows`` of ``df.write.format("controlmsg")``.

By default a write task's records are one Kafka transaction, readable at once when the task ends, so a
downstream batch read (which waits for the end of stream anyway) reads and parses the whole output after
the end. With ``commitRows`` N a task commits a transaction about every N rows (at the first Arrow batch
boundary past N), each with the task's marker saying how far it got: ``{"partial": true, "rows": R,
"digest": D}``. A ``read_committed`` reader gets the records chunk by chunk while the task still writes; a
batch read still ends only at the driver's end of stream, after every task's last commit.

**Exactly once under retries.** A committed chunk is never taken back, so a later attempt of the task
(which fences the earlier ones first, as every attempt does) resumes: it skips the first R rows of its
input and writes the rest. That is right only when the retry's input holds the same rows in the same
order, which Spark does not promise after a shuffle; so the marker holds a digest of what was committed
(CRC-32 of the payloads and of the keys, in order), the retry computes the same digest over the rows it
skips and, when they differ, fails the task with :class:`~controlmsg.errors.ControlMsgError` instead of
writing anything twice or losing a row (the run never ends: write it again under a new ``runId``). A
write whose partitions are sorted on a unique key (``sortWithinPartitions``) resumes; the window job of
``spark_jobs.batch`` does so.

Streaming writes ignore the option: a micro-batch is one transaction per task (its marker holds the batch
id). No I/O here but through the writer and marker store handed in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controlmsg.errors import ControlMsgError
from controlmsg.kafka.markers import MarkerStore
from controlmsg.kafka.writer import ControlWriter

__all__ = ["Chunks", "digest_of"]


def digest_of(values: Sequence[bytes], keys: Sequence[bytes | str | None] | None,
              digest: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """``digest`` carried over ``values`` and ``keys`` (CRC-32 of the concatenated payloads, and of the
    keys, each followed by a NUL byte, ``\x01`` for a null key). Split-independent: the digest of a run of
    rows is the same however it is cut into calls."""
    vd, kd = digest
    vd = zlib.crc32(b"".join(values), vd)
    if keys is not None:
        texts = keys if None not in keys else ["\x01" if k is None else k for k in keys]
        try:
            joined = ("\x00".join(texts) + "\x00").encode("utf-8", "surrogatepass")  # type: ignore[arg-type]
        except TypeError:  # bytes keys: the same bytes, one by one
            joined = b"".join((k.encode("utf-8", "surrogatepass") if isinstance(k, str) else bytes(k)) + b"\x00"
                              for k in texts if k is not None)
        kd = zlib.crc32(joined, kd) if texts else kd
    return vd, kd


@dataclass
class Chunks:
    """One write task's chunked commits (:data:`commit_rows` rows or more each). ``resume``: the partial
    marker an earlier attempt committed, or ``None``. Mutable; one per task attempt."""

    commit_rows: int
    resume: dict[str, Any] | None = None
    task: str = ""
    topic: str = ""
    rows: int = 0
    """Rows committed or sent so far, the skipped ones included."""
    digest: tuple[int, int] = (0, 0)
    commits: int = 0
    _since_commit: int = 0
    _skip: int = field(default=0)

    def __post_init__(self) -> None:
        if self.resume is not None:
            self._skip = int(self.resume["rows"])

    @property
    def skipping(self) -> bool:
        """Whether rows an earlier attempt committed are still to be skipped."""
        return self._skip > 0

    def skip(self, values: list[bytes], keys: list[bytes | str | None] | None
             ) -> tuple[list[bytes], list[bytes | str | None] | None]:
        """The rows of one batch that are still to be written: those past what an earlier attempt
        committed. Raises :class:`ControlMsgError` when the skipped rows are not those committed (their
        digest differs, or the input ended before them: :meth:`finish_skipping`)."""
        if not self._skip:
            return values, keys
        n = min(self._skip, len(values))
        self.digest = digest_of(values[:n], None if keys is None else keys[:n], self.digest)
        self._skip -= n
        self.rows += n
        if not self._skip:
            self._check()
        return values[n:], None if keys is None else keys[n:]

    def finish_skipping(self) -> None:
        """Called at the end of the input: raises when it ended before the rows committed earlier."""
        if self._skip:
            raise self._changed(f"its input has {self.rows} rows, fewer than the {self.rows + self._skip} committed")

    def _check(self) -> None:
        assert self.resume is not None
        if list(self.digest) != list(self.resume["digest"]):
            raise self._changed(f"the first {self.rows} rows differ from those committed (digest {list(self.digest)} "
                                f"against {self.resume['digest']})")

    def _changed(self, what: str) -> ControlMsgError:
        return ControlMsgError(
            f"write to topic {self.topic!r}, task {self.task!r}: an earlier attempt committed part of this task "
            f"(option 'commitRows'), but {what}: the input of a retried task is not the same rows in the same "
            "order, so the task cannot resume exactly once. Nothing more is written; the run will not end. "
            "Sort each partition on a unique key (sortWithinPartitions) before the write, and write again with a "
            "new runId")

    def sent(self, values: Sequence[bytes], keys: Sequence[bytes | str | None] | None) -> None:
        """Count and digest rows just sent."""
        self.digest = digest_of(values, keys, self.digest)
        self.rows += len(values)
        self._since_commit += len(values)

    def commit_if_due(self, writer: ControlWriter, store: MarkerStore, marker: dict[str, Any],
                      timeout: float) -> bool:
        """Commit the open transaction with a partial marker (``marker`` plus ``partial``, ``rows``,
        ``digest``) when :attr:`commit_rows` rows or more were sent since the last commit, and open the
        next; blocks up to ``timeout`` s for the commit. Returns whether it committed. Raises
        :class:`~controlmsg.errors.DeliveryError`."""
        if self._since_commit < self.commit_rows:
            return False
        store.add(writer, {**marker, "partial": True, "rows": self.rows, "digest": list(self.digest)}, self.rows)
        writer.commit(timeout)
        self.commits += 1
        self._since_commit = 0
        return True
