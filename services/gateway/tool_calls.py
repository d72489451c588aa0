"""Reads tool calls in the default format (``tools``) out of an answer as it streams: text
outside ``<tool_call>`` elements is content; each element becomes a call whose name is known
as soon as it is written and whose arguments stream as they come. Pure."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from services.gateway.tools import CALL_CLOSE, CALL_OPEN

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(slots=True)
class Content:
    text: str


@dataclass(slots=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArguments:
    index: int
    text: str


Event = Content | CallStart | CallArguments


@dataclass(slots=True)
class _JsonEnd:
    """Finds where one JSON object ends in text fed piece by piece."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def feed(self, text: str) -> int | None:
        """The length of ``text`` that completes the object, or None if it goes on."""
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


@dataclass(slots=True)
class ToolCallParser:
    """Owns one answer's parsing state. Invariant: every character fed comes out exactly
    once, as content or as part of a call (its element's markup is dropped), and events come
    out in the order of the text."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    _state: str = "text"  # text | header | arguments | tail
    _pending: str = ""
    _after_call: bool = False  # the newline that may follow a call is markup too
    _json: _JsonEnd = field(default_factory=_JsonEnd)

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        """What the pending text means now that nothing follows: content, unless it is the
        rest of a call's arguments (an answer cut short by max_tokens)."""
        events: list[Event] = []
        rest, self._pending = self._pending, ""
        if self._state == "text" and rest:
            events.append(Content(rest))
        elif self._state == "header" and rest:
            events.append(Content(CALL_OPEN + rest))
        elif self._state == "arguments" and rest:
            events.append(self._arguments(rest))
        self._state = "text"
        return events

    def _step(self, events: list[Event]) -> bool:
        """Consumes what it can of the pending text; True if calling again may do more."""
        if self._state == "text":
            return self._in_text(events)
        if self._state == "header":
            return self._in_header(events)
        if self._state == "arguments":
            return self._in_arguments(events)
        at = self._pending.find(CALL_CLOSE)
        if at < 0:
            return False
        self._pending = self._pending[at + len(CALL_CLOSE) :]
        self._state, self._after_call = "text", True
        return True

    def _in_text(self, events: list[Event]) -> bool:
        if self._after_call and self._pending:
            self._pending = self._pending.removeprefix("\n")
            self._after_call = False
        at = self._pending.find(CALL_OPEN)
        if at < 0:
            # What may still become a call's opening, newline before it included, waits.
            keep = max(
                _partial_suffix(self._pending, CALL_OPEN),
                _partial_suffix(self._pending, "\n" + CALL_OPEN),
            )
            cut = len(self._pending) - keep
            if cut:
                events.append(Content(self._pending[:cut]))
                self._pending = self._pending[cut:]
            return False
        before = self._pending[:at].removesuffix("\n")
        if before:
            events.append(Content(before))
        self._pending = self._pending[at + len(CALL_OPEN) :]
        self._state = "header"
        return True

    def _in_header(self, events: list[Event]) -> bool:
        match = _HEADER.match(self._pending)
        if match is not None and match.end() == len(self._pending):
            match = None  # more whitespace may come before the arguments
        if match is None:
            if CALL_CLOSE in self._pending:  # not the default format: it stays text
                body, _, rest = self._pending.partition(CALL_CLOSE)
                events.append(Content(CALL_OPEN + body + CALL_CLOSE))
                self._pending, self._state = rest, "text"
                return True
            return False
        name = json.loads(f'"{match.group(1)}"')
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        self.calls.append((call_id, name, ""))
        events.append(CallStart(len(self.calls) - 1, call_id, name))
        self._pending = self._pending[match.end() :]
        self._state, self._json = "arguments", _JsonEnd()
        return True

    def _in_arguments(self, events: list[Event]) -> bool:
        if not self._pending:
            return False
        end = self._json.feed(self._pending)
        if end is None:
            events.append(self._arguments(self._pending))
            self._pending = ""
            return False
        events.append(self._arguments(self._pending[:end]))
        self._pending = self._pending[end:]
        self._state = "tail"
        return True

    def _arguments(self, text: str) -> CallArguments:
        call_id, name, so_far = self.calls[-1]
        self.calls[-1] = (call_id, name, so_far + text)
        return CallArguments(len(self.calls) - 1, text)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that ``tag`` starts with."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def parse_all(text: str) -> tuple[str | None, list[tuple[str, str, str]]]:
    """A whole answer's content (None when it is only calls) and its calls."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    if parser.calls and not content.strip():
        return None, parser.calls
    return content, parser.calls
