"""Packages that import their modules only when one of their names is used (PEP 562).

``controlmsg.spark`` and ``controlmsg.streaming`` (and the Spark folder's ``reading`` and ``writing``) must import
without pyspark, so their ``__init__`` names each public name's module in a table and resolves it on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is imported from the module ``where[name]`` names.
    Raises :class:`AttributeError` (as for any module) for a name not in ``where``; a name's module is
    imported when the name is first used, and that import's errors propagate (a missing pyspark among them)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
