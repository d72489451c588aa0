"""What reading an answer for tool calls yields, in the order of its text, and the one piece of
JSON scanning every syntax needs: where an object that streams in ends. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Content:
    """Text of the answer that is no part of a call."""

    text: str


@dataclass(slots=True)
class CallStart:
    """A call begins: its name is known once its opening is complete."""

    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArguments:
    """The next piece of call ``index``'s arguments, as JSON text."""

    index: int
    text: str


Event = Content | CallStart | CallArguments


@dataclass(slots=True)
class JsonEnd:
    """Finds where one JSON value ends in text fed piece by piece; ``depth`` starts above 0
    when the scan begins inside an object (the rest of a call after its arguments)."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def feed(self, text: str) -> int | None:
        """The length of ``text`` that closes the outermost bracket, or None if it goes on."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None
