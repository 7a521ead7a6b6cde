"""The Java client's ``sasl.jaas.config``: one JAAS login module entry, parsed. Pure, no I/O.

The grammar is the one Kafka's ``JaasConfig`` reads (a ``java.io.StreamTokenizer`` over the value)::

    LoginModuleClass Flag (optionName=optionValue)* ;

``Flag`` is ``required``, ``requisite``, ``sufficient`` or ``optional`` (any case). An option value is a
word (letters, digits and ``-_$./:@+``) or a double-quoted string in which ``\\"``, ``\\\\``, ``\\n``,
``\\t``, ``\\r``, ``\\b``, ``\\f`` and octal ``\\NNN`` are escapes and a backslash before any other
character stands for that character. ``//`` and ``/* */`` comments are skipped. Kafka takes exactly one
entry in ``sasl.jaas.config``, and so does :func:`parse_jaas`; the trailing ``;`` is required.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from controlmsg.errors import ConfigError

__all__ = ["JaasEntry", "JaasFlag", "parse_jaas"]


class JaasFlag(Enum):
    """A login module's control flag (``javax.security.auth.login.AppConfigurationEntry``)."""

    REQUIRED = "required"
    REQUISITE = "requisite"
    SUFFICIENT = "sufficient"
    OPTIONAL = "optional"


@dataclass(frozen=True, slots=True)
class JaasEntry:
    """One login module entry: its class, flag and options (in the order given; a later one wins)."""

    login_module: str
    flag: JaasFlag
    options: dict[str, str] = field(default_factory=dict)

    @property
    def module_name(self) -> str:
        """The class's simple name (``ScramLoginModule`` of ``org.apache...scram.ScramLoginModule``)."""
        return self.login_module.rsplit(".", 1)[-1]


_WORD: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_$./:@+")
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "a": "\a", "v": "\v"}


class _Tokens:
    """Words, quoted strings and the punctuation ``=`` and ``;`` of a JAAS value, with their positions."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def _skip(self) -> None:
        text = self.text
        while self.pos < len(text):
            if text[self.pos].isspace():
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end + 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise self.error("a /* comment that does not end")
                self.pos = end + 2
            else:
                return

    def error(self, what: str) -> ConfigError:
        return ConfigError(f"sasl.jaas.config: {what} at character {self.pos + 1} (expected: LoginModuleClass "
                           f"required|requisite|sufficient|optional name=\"value\" ... ;)")

    def next(self) -> tuple[str, str] | None:
        """The next token as ``(kind, text)``, kind ``word``, ``quoted`` or the punctuation itself; ``None``
        at the end."""
        self._skip()
        text = self.text
        if self.pos >= len(text):
            return None
        char = text[self.pos]
        if char in "=;":
            self.pos += 1
            return char, char
        if char == '"':
            return "quoted", self._quoted()
        start = self.pos
        while self.pos < len(text) and text[self.pos] in _WORD:
            self.pos += 1
        if self.pos == start:
            raise self.error(f"unexpected {char!r}")
        return "word", text[start:self.pos]

    def _quoted(self) -> str:
        text = self.text
        self.pos += 1
        out: list[str] = []
        while True:
            if self.pos >= len(text):
                raise self.error("a quoted value that does not end (a missing \")")
            char = text[self.pos]
            self.pos += 1
            if char == '"':
                return "".join(out)
            if char != "\\":
                out.append(char)
                continue
            if self.pos >= len(text):
                raise self.error("a backslash at the end")
            char = text[self.pos]
            self.pos += 1
            if char in "01234567":
                digits = char
                while len(digits) < 3 and self.pos < len(text) and text[self.pos] in "01234567":
                    digits += text[self.pos]
                    self.pos += 1
                out.append(chr(int(digits, 8)))
            else:
                out.append(_ESCAPES.get(char, char))


def parse_jaas(text: str) -> JaasEntry:
    """The one login module entry of ``sasl.jaas.config`` value ``text``. Raises :class:`ConfigError`
    naming what is wrong and where (an unknown flag, an option without a value, a missing ``;``, more
    than one entry). Never puts an option's value in the message: it may be a password."""
    tokens = _Tokens(text)
    first = tokens.next()
    if first is None:
        raise ConfigError("sasl.jaas.config is empty (expected: LoginModuleClass required name=\"value\" ... ;)")
    if first[0] != "word":
        raise tokens.error("a login module class name")
    flag_token = tokens.next()
    try:
        flag = JaasFlag(flag_token[1].lower()) if flag_token is not None and flag_token[0] == "word" else None
    except ValueError:
        flag = None
    if flag is None:
        raise tokens.error(f"a control flag after {first[1]}")
    options: dict[str, str] = {}
    while True:
        token = tokens.next()
        if token is None:
            raise tokens.error("no ';' at the end")
        if token[0] == ";":
            break
        if token[0] != "word":
            raise tokens.error("an option name")
        equals = tokens.next()
        if equals is None or equals[0] != "=":
            raise tokens.error(f"option {token[1]!r} without '='")
        value = tokens.next()
        if value is None or value[0] not in ("word", "quoted"):
            raise tokens.error(f"option {token[1]!r} without a value")
        options[token[1]] = value[1]
    if tokens.next() is not None:
        raise tokens.error("more than one login module (Kafka takes exactly one in sasl.jaas.config)")
    return JaasEntry(first[1], flag, options)
