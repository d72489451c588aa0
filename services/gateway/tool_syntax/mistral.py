"""The ``mistral`` syntax: calls follow ``[TOOL_CALLS]``, either as a JSON list of
``{"name": ..., "arguments": {...}}`` objects (the older templates) or each as
``name[ARGS]{...}`` (the newer ones, tokenizer v11 and later; ``[CALL_ID]id`` may come before
``[ARGS]``). Mistral's templates accept only call ids of 9 letters and digits. Pure."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from collections.abc import Callable, Mapping
from typing import ClassVar

from services.gateway.schemas import Tool
from services.gateway.tool_syntax.base import ToolSyntax
from services.gateway.tool_syntax.events import Event
from services.gateway.tool_syntax.grammar import (
    calls_schema,
    json_rule,
    lark,
    marker_rule,
    parameters,
)
from services.gateway.tool_syntax.hermes import HEADER
from services.gateway.tool_syntax.reader import CallReader, Patterns
from services.gateway.tool_syntax.scan import BareName, Lit, Match, Maybe, Peek, Space, scan

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_ALPHANUMERIC = string.ascii_letters + string.digits
_ID = re.compile(r"[A-Za-z0-9]{9}")

_LISTED = (Lit(TOOL_CALLS), Space(), Lit("["), Space(), *HEADER)
_NAMED = (
    Lit(TOOL_CALLS), Space(), BareName(), Maybe((Lit(CALL_ID), BareName())), Lit(ARGS),
    Peek("{"),
)  # fmt: skip
_OPENINGS = (_LISTED, _NAMED)
# Inside a list, after a call's object: the next call, or the end of the list.
_IN_LIST = ((Space(), Lit(","), Space(), *HEADER), (Space(), Lit("]")))


class MistralCallReader(CallReader):
    """Reads calls after ``[TOOL_CALLS]`` in either form. A marker not followed by a call
    stays text; whitespace right after the calls is markup."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        super().__init__(new_id)
        self._listed = False  # the current call is an item of a JSON list
        self._after_call = False

    def _openings(self, text: str, i: int) -> Patterns:
        return _OPENINGS if text[i] == "[" else ()

    def _opened(self, found: Match, events: list[Event]) -> None:
        self._listed = found.alternative == 0
        self._start(found, events)

    def _after_arguments(self, events: list[Event]) -> bool:
        if not self._listed:
            self._state, self._after_call = "text", True
            return True
        if self._state == "after":
            if not self._rest_of_object():
                return False
            self._state = "in_list"
        found = scan(_IN_LIST, self._pending)
        if found is None:  # not a list of calls after all: what follows is text
            self._state = "text"
            return True
        if not isinstance(found, Match):
            return False
        if found.alternative == 0:
            self._start(found, events)
        else:
            self._pending = self._pending[found.end :]
            self._state, self._after_call = "text", True
        return True

    def _trim_after_call(self, text: str) -> str:
        if self._after_call and text:
            self._after_call = False
            return text.lstrip()
        return text


class Mistral(ToolSyntax):
    """The model's own template lists the tools and renders calls after ``[TOOL_CALLS]``;
    ``named`` says which form its template (and so the forcing grammar) uses."""

    name = "mistral"
    markers: ClassVar[tuple[str, ...]] = (TOOL_CALLS, ARGS, CALL_ID)

    def __init__(self, named: bool = False) -> None:
        self.named = named

    def reader(self) -> CallReader:
        return MistralCallReader(self.new_call_id)

    def grammar(self, tools: list[Tool], many: bool, specials: Mapping[str, int]) -> str:
        marker = marker_rule(TOOL_CALLS, specials)
        if self.named:
            args = marker_rule(ARGS, specials)
            calls = [
                f"{marker} {json.dumps(t.function.name)} {args} {json_rule(parameters(t))}"
                for t in tools
            ]
            start = "start: call+" if many else "start: call"
            return lark(f"{start}\ncall: {' | '.join(calls)}")
        call = json_rule(calls_schema(tools, "arguments"))
        items = 'call (", " call)*' if many else "call"
        return lark(f'start: {marker} " "? "[" {items} "]"\ncall: {call}')

    def new_call_id(self) -> str:
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))

    def template_call_id(self, call_id: str) -> str:
        """Ids of 9 letters and digits pass as they are; any other id becomes 9 such
        characters derived from it, the same each time, so a call and its answer still
        match."""
        if _ID.fullmatch(call_id):
            return call_id
        number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
        out = []
        for _ in range(9):
            number, digit = divmod(number, len(_ALPHANUMERIC))
            out.append(_ALPHANUMERIC[digit])
        return "".join(out)

    def __repr__(self) -> str:
        return f"<tool syntax {self.name}{' (name[ARGS])' if self.named else ''}>"
