"""Tool calls: how a conversation with tools becomes the chat template's messages, and the
grammar that forces a call when ``tool_choice`` asks for one. Pure.

Crescent's default tool format, for chat templates that have no tool syntax of their own
(the default SmolLM2's has none): the tools are listed in the system message, one JSON
object per line inside ``<tools>``; the model calls a function by writing

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

once per call; a tool's answer comes back in a user turn inside ``<tool_response>``.
``tool_calls.ToolCallParser`` reads calls in this format back out of the answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.gateway import errors
from services.gateway.schemas import ChatMessage, NamedToolChoice, Tool, ToolChoice
from services.gateway.validation import message_dict
from shared.model.grammar import JSON_OPTIONS, lark_grammar

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
TOOLS_HEADER = (
    "# Tools\n\nYou can call the functions described below, one JSON object per line:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "To call a function, answer with a <tool_call> element for each call. It holds a JSON "
    'object with the function\'s "name" and its "arguments" object:\n'
    f'{CALL_OPEN}\n{{"name": "<function name>", "arguments": {{"<argument>": "<value>"}}}}\n'
    f"{CALL_CLOSE}"
)


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools change: whether the answer is read for calls, and the grammar
    that forces calls ("" when the model may also answer in text)."""

    parse_calls: bool
    grammar: str


def plan(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None) -> ToolPlan:
    """Raises a 400 for a choice that names no listed tool, or asks for a call without tools."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise errors.invalid(
                "tool_choice asks for a tool call but no tools are given", "tool_choice"
            )
        return ToolPlan(False, "")
    if choice == "none":
        return ToolPlan(False, "")
    if choice is None or choice == "auto":
        return ToolPlan(True, "")
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise errors.invalid(
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                "tool_choice",
            )
        return ToolPlan(True, calls_grammar(named, many=False))
    return ToolPlan(True, calls_grammar(tools, many=parallel is not False))


def calls_grammar(tools: list[Tool], many: bool) -> str:
    """Exactly one call (or, with ``many``, one or more) of the given tools, each call's
    arguments following its function's parameters schema."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = {"anyOf": options, "x-guidance": JSON_OPTIONS}
    call = f"{json.dumps(CALL_OPEN + chr(10))} %json {json.dumps(schema)} "
    call += json.dumps("\n" + CALL_CLOSE)
    start = 'start: call ("\\n" call)*' if many else "start: call"
    return lark_grammar(f"{start}\ncall: {call}")


def conversation(
    messages: list[ChatMessage], tools: list[Tool] | None, show_tools: bool
) -> list[dict[str, Any]]:
    """The template's messages: tool calls and tool answers in the default format, and the
    tools described in the system message when ``show_tools``."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            _add_tool_answer(out, i, message)
            continue
        if message.tool_call_id is not None:
            param = f"messages[{i}].tool_call_id"
            raise errors.invalid("only tool messages answer a tool call", param)
        if message.tool_calls:
            if message.role != "assistant":
                param = f"messages[{i}].tool_calls"
                raise errors.invalid("only assistant messages make tool calls", param)
            out.append(_assistant_calls(i, message))
            continue
        out.append(message_dict(i, message))
    if show_tools and tools:
        _describe_tools(out, tools)
    for rendered in out:
        rendered.pop("tool_answers", None)
    return out


def _add_tool_answer(out: list[dict[str, Any]], i: int, message: ChatMessage) -> None:
    content = message.model_copy(update={"role": "user", "tool_call_id": None})
    text = message_dict(i, content)["content"]
    answer = f"<tool_response>\n{text}\n</tool_response>"
    # Consecutive answers (to parallel calls) share one turn.
    if out and out[-1].get("tool_answers"):
        out[-1]["content"] += "\n" + answer
    else:
        out.append({"role": "user", "content": answer, "tool_answers": True})


def _assistant_calls(i: int, message: ChatMessage) -> dict[str, Any]:
    text = message_dict(i, message.model_copy(update={"tool_calls": None}))["content"]
    blocks = []
    for j, call in enumerate(message.tool_calls or []):
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError:
            param = f"messages[{i}].tool_calls[{j}].function.arguments"
            raise errors.invalid("arguments must be JSON text", param) from None
        body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}")
    return {"role": "assistant", "content": "\n".join(filter(None, [text, *blocks]))}


def _describe_tools(out: list[dict[str, Any]], tools: list[Tool]) -> None:
    described = [t.function.model_dump(exclude_none=True, exclude={"strict"}) for t in tools]
    lines = [json.dumps(d, ensure_ascii=False) for d in described]
    block = TOOLS_HEADER + "\n".join(lines) + TOOLS_FOOTER
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{block}"
    else:
        out.insert(0, {"role": "system", "content": block})
