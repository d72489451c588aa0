"""Reads tool calls out of an answer as it streams, in the served model's tool syntax
(``tool_syntax``; Crescent's own format by default): text outside calls is content; each call's
name is known as soon as its opening is written and its arguments stream as they come. Pure."""

from __future__ import annotations

from services.gateway.tool_syntax import CRESCENT, ToolSyntax
from services.gateway.tool_syntax.events import CallArguments, CallStart, Content, Event

__all__ = ["CallArguments", "CallStart", "Content", "Event", "ToolCallParser", "parse_all"]


class ToolCallParser:
    """Owns one answer's reader in one tool syntax. Invariant: every character fed comes out
    exactly once, as content or as part of a call (the syntax's markup is dropped), and events
    come out in the order of the text."""

    __slots__ = ("_reader",)

    def __init__(self, syntax: ToolSyntax = CRESCENT) -> None:
        self._reader = syntax.reader()

    @property
    def calls(self) -> list[tuple[str, str, str]]:
        """Every call read so far: (id, name, arguments as JSON text)."""
        return self._reader.calls

    def feed(self, text: str) -> list[Event]:
        return self._reader.feed(text)

    def finish(self) -> list[Event]:
        """What the pending text means now that nothing follows: content, unless it is the
        rest of a call's arguments (an answer cut short by max_tokens)."""
        return self._reader.finish()


def parse_all(
    text: str, syntax: ToolSyntax = CRESCENT
) -> tuple[str | None, list[tuple[str, str, str]]]:
    """A whole answer's content (None when it is only calls) and its calls."""
    parser = ToolCallParser(syntax)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    if parser.calls and not content.strip():
        return None, parser.calls
    return content, parser.calls
