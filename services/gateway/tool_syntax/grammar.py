"""Pieces of the Lark grammars that force tool calls. Pure.

A marker such as ``[TOOL_CALLS]`` may be one special token in a real vocabulary. llguidance
never matches a special token against grammar text (its bytes are kept apart from ordinary
text), so where the vocabulary holds the marker as a special token the grammar names that
token by id and also accepts the marker spelled out in ordinary tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from services.gateway.schemas import Tool
from shared.model.grammar import JSON_OPTIONS, lark_grammar


def parameters(tool: Tool) -> dict[str, Any]:
    """The schema of a function's arguments (any object when it declares none)."""
    return tool.function.parameters or {"type": "object"}


def calls_schema(tools: list[Tool], arguments_key: str) -> dict[str, Any]:
    """One call object of any of ``tools``: ``{"name": ..., <arguments_key>: {...}}``."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                arguments_key: parameters(t),
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return {"anyOf": options}


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark atom for JSON text that satisfies ``schema``, written compactly."""
    return f"%json {json.dumps(schema | {'x-guidance': JSON_OPTIONS})}"


def marker_rule(marker: str, specials: Mapping[str, int]) -> str:
    """A Lark atom for ``marker``: its text, or its special token where the vocabulary has
    one."""
    text = json.dumps(marker)
    token = specials.get(marker)
    return text if token is None else f"({text} | <[{token}]>)"


def lark(source: str) -> str:
    """The grammar text nodes enforce, from Lark source."""
    return lark_grammar(source)
