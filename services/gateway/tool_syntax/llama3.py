"""The ``llama3_json`` syntax (Llama 3.1 / 3.2 / 3.3): the answer is a call written as a JSON
object ``{"name": ..., "parameters": {...}}`` (``"arguments"`` is read too), maybe after
``<|python_tag|>``; several calls are separated by ``;``. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from services.gateway.schemas import Tool
from services.gateway.tool_syntax.base import ToolSyntax
from services.gateway.tool_syntax.events import Event
from services.gateway.tool_syntax.grammar import calls_schema, json_rule, lark
from services.gateway.tool_syntax.reader import CallReader, Patterns
from services.gateway.tool_syntax.scan import JsonName, Lit, Maybe, OneOf, Part, Peek, Space

PYTHON_TAG = "<|python_tag|>"

_NAME: tuple[Part, ...] = (Lit('"name"'), Space(), Lit(":"), Space(), JsonName(), Space())
_ARGUMENTS: tuple[Part, ...] = (
    Lit(","), Space(), OneOf(('"parameters"', '"arguments"')), Space(), Lit(":"), Space(),
    Peek("{"),
)  # fmt: skip
# Llama 3.2 sometimes writes ``"type": "function"`` first.
_TYPE: tuple[Part, ...] = (
    Lit('"type"'), Space(), Lit(":"), Space(), Lit('"function"'), Space(), Lit(","), Space(),
)  # fmt: skip
HEADER: tuple[Part, ...] = (Lit("{"), Space(), Maybe(_TYPE), *_NAME, *_ARGUMENTS)
# At the start of the answer, right after a call (``;`` between calls) and after the tag.
_AT_FRONT = ((Space(), Maybe((Lit(";"),)), Space(), *HEADER),)
_AT_TAG = ((Lit(PYTHON_TAG), Space(), *HEADER),)
# A call on a line of its own after some text; the newline before it is markup.
_AT_LINE = ((Lit("\n"), Space(), *HEADER),)


class JsonCallReader(CallReader):
    """Reads calls written as bare JSON objects. A call opens only at the start of the
    answer, of a line, or after ``<|python_tag|>``, so JSON quoted inside prose stays text;
    whitespace and ``;`` between calls are markup."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        super().__init__(new_id)
        self._front = True  # at the start of the answer or right after a call

    def _openings(self, text: str, i: int) -> Patterns:
        front = _AT_FRONT if i == 0 and self._front else ()
        if text[i] == "\n":
            return front + _AT_LINE
        return front + _AT_TAG if text[i] == "<" else front

    def _after_arguments(self, events: list[Event]) -> bool:
        if not self._rest_of_object():
            return False
        self._state, self._front = "text", True
        return True

    def _trim_after_call(self, text: str) -> str:
        if self._front and text:
            had_call, self._front = bool(self.calls), False
            return text.lstrip() if had_call else text
        return text


class Llama3Json(ToolSyntax):
    """The model's own template lists the tools and renders calls as JSON objects."""

    name = "llama3_json"
    markers: ClassVar[tuple[str, ...]] = (PYTHON_TAG,)

    def reader(self) -> CallReader:
        return JsonCallReader(self.new_call_id)

    def grammar(self, tools: list[Tool], many: bool, specials: Mapping[str, int]) -> str:
        call = json_rule(calls_schema(tools, "parameters"))
        start = 'start: call ("; " call)*' if many else "start: call"
        return lark(f"{start}\ncall: {call}")
