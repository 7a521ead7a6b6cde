"""Durations as users write them: ``500ms``, ``30s``, ``15m``, ``1h``, ``1d``, or plain milliseconds. Pure."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["parse_duration"]

_DURATION: Final = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration(text: str, *, allow_zero: bool = False) -> int:
    """``"15m"`` -> ``900000`` (ms); a bare number is milliseconds. Raises ``ValueError`` naming the text for
    anything else, and for zero unless ``allow_zero``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 30s, 15m, 1h, 1d)")
    value = int(match.group(1)) * _UNIT_MS[match.group(2) or "ms"]
    if value == 0 and not allow_zero:
        raise ValueError(f"a duration must be above zero, got {text!r}")
    return value
