"""Where controlmsg keeps what it downloads or builds once per machine (Kafka's jars, the JVM class archive)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["CACHE_ENV", "cache_dir"]

CACHE_ENV: Final = "CONTROLMSG_CACHE_DIR"


def cache_dir() -> Path:
    """``$CONTROLMSG_CACHE_DIR``, or ``~/.cache/controlmsg``. Does not create it, does not raise."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "controlmsg"
