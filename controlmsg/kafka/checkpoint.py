"""Checkpoints: input offsets and bookkeeping saved together, atomically, in one file.

A checkpoint is one JSON document ``{"format": 1, "topic": ..., "offsets": {"<partition>": <next
offset>}, "bookkeeping": <InputTracker.snapshot()>}``, plus ``"extra"``: the consumer's own state that
must move with its offsets (for example how many bytes of its output file belong to this checkpoint).
It is written to a temporary file in the same directory, fsynced and renamed over the old one, so a
reader sees either the old or the new checkpoint, never half of one, and the offsets, the bookkeeping
and the extra state in it always belong together.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from controlmsg.errors import CheckpointError

__all__ = ["Checkpoint", "FileCheckpointStore"]

_FORMAT: Final = 1


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Next offset to read per partition, and the bookkeeping that holds after reading up to there."""

    topic: str
    offsets: dict[int, int]
    bookkeeping: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)
    """The consumer's own JSON-compatible state, saved and loaded with the offsets (``{}``: none)."""

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": _FORMAT,
            "topic": self.topic,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "bookkeeping": self.bookkeeping,
        }
        if self.extra:
            doc["extra"] = self.extra
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes, source: str = "checkpoint") -> Checkpoint:
        """Parse a checkpoint document. Raises :class:`CheckpointError` naming ``source``."""
        try:
            doc = orjson.loads(data)
            if doc["format"] != _FORMAT:
                raise CheckpointError(f"{source}: checkpoint format {doc['format']!r} is not supported")
            return cls(
                topic=str(doc["topic"]),
                offsets={int(p): int(o) for p, o in doc["offsets"].items()},
                bookkeeping=dict(doc["bookkeeping"]),
                extra=dict(doc.get("extra", {})),
            )
        except CheckpointError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{source}: not a valid checkpoint: {exc!r}") from exc


class FileCheckpointStore:
    """A checkpoint kept in one local file. ``load`` returns ``None`` when the file does not exist."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def load(self) -> Checkpoint | None:
        """Read the checkpoint, or ``None`` if there is none yet. Raises :class:`CheckpointError`."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        return Checkpoint.from_json(data, str(self.path))

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the checkpoint atomically (temporary file, fsync, rename). Blocks on the disk."""
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(checkpoint.to_json())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
