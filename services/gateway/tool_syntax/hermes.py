"""The ``<tool_call>`` syntax (Hermes, Qwen 2.5 / 3, QwQ; Crescent's own format writes the
same): each call is a JSON object with the function's ``name`` and its ``arguments`` object,
alone in a ``<tool_call>`` element; several calls are several elements. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

from services.gateway.schemas import Tool
from services.gateway.tool_syntax.base import ToolSyntax
from services.gateway.tool_syntax.events import Event
from services.gateway.tool_syntax.grammar import calls_schema, json_rule, lark, marker_rule
from services.gateway.tool_syntax.reader import CallReader, Patterns
from services.gateway.tool_syntax.scan import JsonName, Lit, Part, Peek, Space

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

HEADER: tuple[Part, ...] = (
    Lit("{"), Space(), Lit('"name"'), Space(), Lit(":"), Space(), JsonName(), Space(),
    Lit(","), Space(), Lit('"arguments"'), Space(), Lit(":"), Space(), Peek("{"),
)  # fmt: skip
_OPEN = (Lit(CALL_OPEN), Space(), *HEADER)
# A newline right before or after an element is markup too.
_AFTER_NEWLINE = ((Lit("\n"), *_OPEN),)
_AT_TAG = (_OPEN,)


class TaggedCallReader(CallReader):
    """Reads ``<tool_call>`` elements. An element whose body is not a call stays text; a
    call's element ends at ``</tool_call>`` (whatever else it holds after the arguments is
    dropped)."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        super().__init__(new_id)
        self._after_call = False

    def _openings(self, text: str, i: int) -> Patterns:
        if text[i] == "\n":
            return _AFTER_NEWLINE
        return _AT_TAG if text[i] == "<" else ()

    def _after_arguments(self, events: list[Event]) -> bool:
        at = self._pending.find(CALL_CLOSE)
        if at < 0:
            return False
        self._pending = self._pending[at + len(CALL_CLOSE) :]
        self._state, self._after_call = "text", True
        return True

    def _trim_after_call(self, text: str) -> str:
        if self._after_call and text:
            self._after_call = False
            return text.removeprefix("\n")
        return text


class Hermes(ToolSyntax):
    """The model's own template lists the tools and renders calls in ``<tool_call>``."""

    name = "hermes"
    markers: ClassVar[tuple[str, ...]] = (CALL_OPEN, CALL_CLOSE)

    def reader(self) -> CallReader:
        return TaggedCallReader(self.new_call_id)

    def grammar(self, tools: list[Tool], many: bool, specials: Mapping[str, int]) -> str:
        call = " ".join(
            [
                marker_rule(CALL_OPEN, specials),
                '"\\n"',
                json_rule(calls_schema(tools, "arguments")),
                '"\\n"',
                marker_rule(CALL_CLOSE, specials),
            ]
        )
        start = 'start: call ("\\n" call)*' if many else "start: call"
        return lark(f"{start}\ncall: {call}")


class Crescent(Hermes):
    """Crescent's own format, for templates without a tool syntax: the same calls, but the
    tools are described (and calls and answers rendered) by Crescent, not by the template."""

    name = "crescent"
    native = False
