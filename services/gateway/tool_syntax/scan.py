"""Matching the fixed opening of a tool call (its markers and the JSON before its arguments)
against text that arrives piece by piece. Pure.

A pattern is a sequence of parts. Matched against the start of a text it either matches
(where it ends and the function name it read), or may still match once more text comes
(``WAIT``: the text ran out inside it), or can never match (None). Streaming parsers hold
back text while a pattern waits, so a call's opening never leaks out as content, and let it
go as content the moment no pattern can match, so no text is ever lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

_SPACE = " \t\r\n"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# What a part returns besides an end offset.
_WAIT: Final = -1
_NO: Final = -2


@dataclass(frozen=True, slots=True)
class Match:
    """A complete opening: ``end`` is where it stops, ``name`` the function it names (if it
    names one) and ``alternative`` which of the patterns tried matched."""

    end: int
    name: str | None
    alternative: int


class Wait:
    """The text ended inside a pattern: more text decides."""


WAIT: Final = Wait()


class Part:
    """One step of a pattern. ``at`` returns where it ends, or ``_WAIT`` / ``_NO``."""

    def at(self, text: str, i: int) -> int:
        raise NotImplementedError

    def name(self, text: str, start: int, end: int) -> str | None:
        """The function name this part read between ``start`` and ``end``, if it reads one."""
        return None


@dataclass(frozen=True, slots=True)
class Lit(Part):
    """Exactly this text."""

    text: str

    def at(self, text: str, i: int) -> int:
        if text.startswith(self.text, i):
            return i + len(self.text)
        short = len(text) - i < len(self.text)  # only then may the text end inside it
        return _WAIT if short and self.text.startswith(text[i:]) else _NO


@dataclass(frozen=True, slots=True)
class Space(Part):
    """Any run of whitespace, maybe none."""

    def at(self, text: str, i: int) -> int:
        while i < len(text) and text[i] in _SPACE:
            i += 1
        return i


@dataclass(frozen=True, slots=True)
class Peek(Part):
    """The next character is this one; it is left for what follows the opening."""

    char: str

    def at(self, text: str, i: int) -> int:
        if i == len(text):
            return _WAIT
        return i if text[i] == self.char else _NO


@dataclass(frozen=True, slots=True)
class OneOf(Part):
    """One of several texts, none a prefix of another."""

    texts: tuple[str, ...]

    def at(self, text: str, i: int) -> int:
        results = [Lit(t).at(text, i) for t in self.texts]
        matched = [r for r in results if r >= 0]
        if matched:
            return matched[0]
        return _WAIT if _WAIT in results else _NO


@dataclass(frozen=True, slots=True)
class Maybe(Part):
    """These parts, or nothing."""

    parts: tuple[Part, ...]

    def at(self, text: str, i: int) -> int:
        end = _run(self.parts, text, i)
        if end == _NO:
            return i
        return end


@dataclass(frozen=True, slots=True)
class JsonName(Part):
    """A JSON string: the function's name."""

    def at(self, text: str, i: int) -> int:
        if i == len(text):
            return _WAIT
        if text[i] != '"':
            return _NO
        j = i + 1
        while j < len(text):
            if text[j] == "\\":
                j += 2
            elif text[j] == '"':
                return j + 1 if self.name(text, i, j + 1) is not None else _NO
            else:
                j += 1
        return _WAIT

    def name(self, text: str, start: int, end: int) -> str | None:
        try:
            value = json.loads(text[start:end])
        except ValueError:
            return None
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class BareName(Part):
    """A function name written without quotes (letters, digits, ``_``, ``-``, ``.``)."""

    def at(self, text: str, i: int) -> int:
        j = i
        while j < len(text) and text[j] in _NAME_CHARS:
            j += 1
        if j == len(text):
            return _WAIT  # the name may go on
        return j if j > i else _NO

    def name(self, text: str, start: int, end: int) -> str | None:
        return text[start:end]


def _run(parts: Sequence[Part], text: str, i: int) -> int:
    for part in parts:
        i = part.at(text, i)
        if i < 0:
            return i
    return i


def _named(parts: Sequence[Part], text: str, i: int) -> tuple[int, str | None]:
    """Runs a pattern known to match at ``i``, collecting the name it reads."""
    name = None
    for part in parts:
        end = part.at(text, i)
        name = part.name(text, i, end) or name
        i = end
    return i, name


def scan(patterns: Sequence[Sequence[Part]], text: str, start: int = 0) -> Match | Wait | None:
    """The first pattern that matches ``text`` from ``start`` on (its ``end`` counted from
    ``start``); else ``WAIT`` if one still may."""
    waiting = False
    for number, parts in enumerate(patterns):
        end = _run(parts, text, start)
        if end >= 0:
            end, name = _named(parts, text, start)
            return Match(end - start, name, number)
        waiting = waiting or end == _WAIT
    return WAIT if waiting else None
