"""Client properties files, read and written by Java's rules (``java.util.Properties``), as Kafka's own
tools (``--command-config``, ``--producer.config``) and the Java client read them.

The parsing is the ``javaproperties`` package's (a maintained implementation of ``Properties.load``):
``key=value``, ``key: value`` and ``key value`` (the first unescaped ``=``, ``:`` or whitespace ends the
key); ``#`` and ``!`` comment lines; a line ending in an odd number of backslashes continues on the next
(whose leading whitespace is dropped); escapes ``\\t \\n \\r \\f \\\\ \\= \\: \\#`` and ``\\uXXXX``; a
backslash before any other character is dropped. A key with no value is a key with an empty value, as in
Java. The one difference: a file is read as UTF-8 (what :func:`write_properties` writes and what people
type), and as ISO-8859-1 (Java's ``Properties.load(InputStream)``) only when it is not valid UTF-8.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import javaproperties

from controlmsg.errors import ConfigError

__all__ = ["read_properties", "read_properties_lines", "write_properties"]


def read_properties_lines(path: str | Path) -> tuple[dict[str, str], dict[str, int]]:
    """The settings of the properties file ``path`` (a later key wins, as in Java) and, per key, the
    line its winning entry starts on (1-based), for errors that name ``file:line``. Raises
    :class:`ConfigError` naming the file when it cannot be read, or when an escape is malformed (a
    ``\\u`` not followed by four hex digits)."""
    source = Path(path)
    try:
        raw = source.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the Kafka client properties file {str(source)!r}: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("iso-8859-1")
    settings: dict[str, str] = {}
    lines: dict[str, int] = {}
    line = 1
    try:
        for entry in javaproperties.parse(text):
            if isinstance(entry, javaproperties.KeyValue):
                settings[entry.key] = entry.value
                lines[entry.key] = line
            line += entry.source.count("\n") + entry.source.count("\r") - entry.source.count("\r\n")
    except javaproperties.InvalidUEscapeError as exc:
        raise ConfigError(f"{source}:{line}: {exc} (Java's properties files take \\uXXXX, four hex digits; "
                          "write a backslash as \\\\)") from None
    return settings, lines


def read_properties(path: str | Path) -> dict[str, str]:
    """The settings of the properties file ``path``, read by Java's rules (see the module). Raises
    :class:`ConfigError` naming the file when it cannot be read or holds a malformed ``\\u`` escape."""
    return read_properties_lines(path)[0]


def write_properties(config: Mapping[str, str], path: str | Path, comment: str | None = None) -> Path:
    """Write ``config`` as a client properties file that only this user can read (mode 0600, created anew:
    settings may hold secrets), escaped by Java's rules, so that :func:`read_properties` and Java's tools
    read every key and value back as it is (a value with ``\\``, ``=``, ``:``, ``#``, leading spaces or any
    Unicode). Returns the path."""
    target = Path(path)
    target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        javaproperties.dump({str(k): str(v) for k, v in config.items()}, out, comments=comment, timestamp=False,
                            sort_keys=False, ensure_ascii=True)
    return target
