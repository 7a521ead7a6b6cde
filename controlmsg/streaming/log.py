"""A job's log lines: ``HH:MM:SS <name>: <message>`` on stderr (moved here from ``spark_jobs/common.py``
with the runtime, which logs through it; the example jobs still import it from there)."""

from __future__ import annotations

import logging
import sys

__all__ = ["job_logger"]


def job_logger(name: str) -> logging.Logger:
    """The logger of job (or part) ``name``: INFO and above to stderr as ``HH:MM:SS <name>: <message>``,
    not propagated to the root logger. The same logger (and one handler) for every call with ``name``."""
    logger = logging.getLogger(f"controlmsg.jobs.{name}")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"%(asctime)s {name}: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
