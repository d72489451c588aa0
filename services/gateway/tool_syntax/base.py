"""What a tool syntax is: how one model family's chat template and answers write tool calls.
Pure."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import ClassVar

from services.gateway.schemas import Tool
from services.gateway.tool_syntax.reader import CallReader


class ToolSyntax:
    """Owns one family's conventions: whether its template renders tools itself, the markers
    its calls are framed with (maybe single special tokens in its vocabulary), the reader of
    calls in its answers, the grammar that forces calls, and the shape of its call ids."""

    name: ClassVar[str]
    #: The chat template lists the tools and renders calls and tool answers itself.
    native: ClassVar[bool] = True
    #: Text around calls that a vocabulary may hold as one special token each.
    markers: ClassVar[tuple[str, ...]] = ()

    def reader(self) -> CallReader:
        """A fresh reader for one answer."""
        raise NotImplementedError

    def grammar(self, tools: list[Tool], many: bool, specials: Mapping[str, int]) -> str:
        """The grammar of exactly one call (or, with ``many``, one or more) of ``tools`` in
        this syntax, each call's arguments following its function's parameters schema.
        ``specials`` maps each marker the vocabulary holds as a special token to its id."""
        raise NotImplementedError

    def new_call_id(self) -> str:
        """The id of a call read from an answer."""
        return f"call_{uuid.uuid4().hex[:24]}"

    def template_call_id(self, call_id: str) -> str:
        """The id a template gets for a call a client sent back (the same by default)."""
        return call_id

    def __repr__(self) -> str:
        return f"<tool syntax {self.name}>"
