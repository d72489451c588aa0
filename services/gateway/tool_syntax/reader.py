"""The streaming machinery every tool syntax's reader shares. Pure.

A reader is fed an answer's text piece by piece and turns it into events in the order of the
text: content, and for each call its start (once its name is known) and its arguments as they
come. Each syntax says where a call may open (``_openings``) and what follows its arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.gateway.tool_syntax.events import CallArguments, CallStart, Content, Event, JsonEnd
from services.gateway.tool_syntax.scan import Match, Part, Wait, scan

Patterns = Sequence[Sequence[Part]]


class CallReader:
    """Owns one answer's parsing state: the text not yet decided, the calls read so far and
    the syntax's current state. Invariant: every character fed comes out exactly once, as
    content or as part of a call (the syntax's markup around calls is dropped); a call's
    arguments are the JSON value after its opening, as written."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (id, name, arguments)
        self._new_id = new_id
        self._pending = ""
        self._state = "text"
        self._json = JsonEnd()

    def feed(self, text: str) -> list[Event]:
        self._pending += text
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def finish(self) -> list[Event]:
        """What the pending text means now that nothing follows: content, unless it is the
        rest of a call's arguments (an answer cut short) or markup after a call."""
        events: list[Event] = []
        rest, self._pending = self._pending, ""
        if self._state == "text":
            rest = self._trim_after_call(rest)
            if rest:
                events.append(Content(rest))
        elif self._state == "arguments" and rest:
            events.append(self._arguments(rest))
        self._state = "text"
        return events

    # What each syntax decides.

    def _openings(self, text: str, i: int) -> Patterns:
        """The patterns a call's opening may match at ``text[i:]`` (none: no call starts)."""
        raise NotImplementedError

    def _after_arguments(self, events: list[Event]) -> bool:
        """Consumes what follows a call's arguments; True if stepping again may do more."""
        raise NotImplementedError

    def _opened(self, found: Match, events: list[Event]) -> None:
        """A call's opening matched at the start of the pending text."""
        self._start(found, events)

    def _trim_after_call(self, text: str) -> str:
        """The text after a call, less the whitespace that is still markup."""
        return text

    # The shared steps.

    def _step(self, events: list[Event]) -> bool:
        if self._state == "text":
            return self._in_text(events)
        if self._state == "arguments":
            return self._in_arguments(events)
        return self._after_arguments(events)

    def _in_text(self, events: list[Event]) -> bool:
        """Lets out as content what opens no call; stops at an opening, or at text that may
        still become one (held back until more text decides)."""
        text = self._pending
        for i in range(len(text)):
            patterns = self._openings(text, i)
            if not patterns:
                continue
            found = scan(patterns, text, i)
            if found is None:
                continue
            self._content(text[:i], events)
            self._pending = text[i:]
            if isinstance(found, Wait):
                return False
            self._opened(found, events)
            return True
        self._content(text, events)
        self._pending = ""
        return False

    def _content(self, text: str, events: list[Event]) -> None:
        text = self._trim_after_call(text)
        if text:
            events.append(Content(text))

    def _start(self, found: Match, events: list[Event]) -> None:
        """Starts the call whose opening ``found`` is, its arguments next."""
        call_id = self._new_id()
        self.calls.append((call_id, found.name or "", ""))
        events.append(CallStart(len(self.calls) - 1, call_id, found.name or ""))
        self._pending = self._pending[found.end :]
        self._state, self._json = "arguments", JsonEnd()

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
        self._state, self._json = "after", JsonEnd(depth=1)
        return True

    def _arguments(self, text: str) -> CallArguments:
        call_id, name, so_far = self.calls[-1]
        self.calls[-1] = (call_id, name, so_far + text)
        return CallArguments(len(self.calls) - 1, text)

    def _rest_of_object(self) -> bool:
        """Drops the rest of the call's object after its arguments (its closing brace, keys
        the syntax does not use); True once it is closed."""
        end = self._json.feed(self._pending)
        if end is None:
            self._pending = ""
            return False
        self._pending = self._pending[end:]
        return True
