"""Tool syntaxes: how each model family's chat template and answers write tool calls, which
one a template uses, and the setting that overrides what is detected. Pure.

Detection reads the chat template's text and is conservative: a template names a syntax only
when it reads ``tools`` and carries that syntax's markers and no other's. Anything else (no
template, a template without tools, an ambiguous one) keeps Crescent's own format.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal, get_args

from services.gateway.tool_syntax.base import ToolSyntax
from services.gateway.tool_syntax.hermes import Crescent, Hermes
from services.gateway.tool_syntax.llama3 import PYTHON_TAG, Llama3Json
from services.gateway.tool_syntax.mistral import ARGS, TOOL_CALLS, Mistral

__all__ = ["CRESCENT", "ParserSetting", "ToolSyntax", "detect", "resolve"]

#: The values of ``CRESCENT_TOOL_CALL_PARSER``.
ParserSetting = Literal["auto", "crescent", "hermes", "llama3_json", "mistral"]

CRESCENT = Crescent()
_READS_TOOLS = re.compile(r"\btools\b")


def _mistral(template: str) -> ToolSyntax:
    return Mistral(named=ARGS in template)


# How each family's template gives itself away, and the syntax it then uses.
_SIGNS: dict[str, tuple[Callable[[str], bool], Callable[[str], ToolSyntax]]] = {
    "hermes": (lambda t: "<tool_call>" in t and "</tool_call>" in t, lambda t: Hermes()),
    "llama3_json": (
        lambda t: "<|start_header_id|>" in t and ('"parameters"' in t or PYTHON_TAG in t),
        lambda t: Llama3Json(),
    ),
    "mistral": (lambda t: TOOL_CALLS in t, _mistral),
}


def detect(template: str | None) -> ToolSyntax:
    """The syntax ``template`` writes tool calls in; Crescent's own where that is unclear."""
    if not template or not _READS_TOOLS.search(template):
        return CRESCENT
    found = [make for sign, make in _SIGNS.values() if sign(template)]
    return found[0](template) if len(found) == 1 else CRESCENT


def resolve(setting: str, template: str | None) -> ToolSyntax:
    """The syntax to serve: ``setting`` names one, or ``auto`` detects it from the template.
    Raises ``ValueError`` for a name that is no syntax."""
    if setting == "auto":
        return detect(template)
    if setting == "crescent":
        return CRESCENT
    if setting not in _SIGNS:
        choices = ", ".join(get_args(ParserSetting))
        raise ValueError(f"unknown tool call parser {setting!r}; one of: {choices}")
    return _SIGNS[setting][1](template or "")
