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

Templates with a tool syntax of their own (``tool_syntax``) get the tools, the calls and the
answers as transformers hands them over, and render them themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.gateway import errors
from services.gateway.schemas import ChatMessage, NamedToolChoice, Tool, ToolCallIn, ToolChoice
from services.gateway.tool_syntax import CRESCENT, ToolSyntax
from services.gateway.tool_syntax.hermes import CALL_CLOSE, CALL_OPEN
from services.gateway.validation import message_dict
from shared.errors import InvalidRequestError
from shared.model.tokenizer import Tokenizer

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
    """What a request's tools change: whether the answer is read for calls, the grammar
    that forces calls ("" when the model may also answer in text), and the special tokens
    output as their text for the reader (the syntax's markers, when calls are read)."""

    parse_calls: bool
    grammar: str
    kept_tokens: Mapping[int, str] = field(default_factory=dict)


def plan(
    tools: list[Tool] | None,
    choice: ToolChoice | None,
    parallel: bool | None,
    syntax: ToolSyntax = CRESCENT,
    specials: Mapping[str, int] | None = None,
) -> ToolPlan:
    """Raises a 400 for a choice that names no listed tool, or asks for a call without tools.
    A forced call is written in ``syntax``; ``specials`` are its markers' special tokens."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise errors.invalid(
                "tool_choice asks for a tool call but no tools are given", "tool_choice"
            )
        return ToolPlan(False, "")
    if choice == "none":
        return ToolPlan(False, "")
    kept = {token: marker for marker, token in (specials or {}).items()}
    if choice is None or choice == "auto":
        return ToolPlan(True, "", kept)
    if isinstance(choice, NamedToolChoice):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise errors.invalid(
                f"tool_choice names {choice.function.name!r}, which is not in tools",
                "tool_choice",
            )
        return ToolPlan(True, calls_grammar(named, False, syntax, specials), kept)
    return ToolPlan(True, calls_grammar(tools, parallel is not False, syntax, specials), kept)


def calls_grammar(
    tools: list[Tool],
    many: bool,
    syntax: ToolSyntax = CRESCENT,
    specials: Mapping[str, int] | None = None,
) -> str:
    """Exactly one call (or, with ``many``, one or more) of the given tools in ``syntax``,
    each call's arguments following its function's parameters schema."""
    return syntax.grammar(tools, many, specials or {})


def special_markers(syntax: ToolSyntax, tokenizer: Tokenizer) -> dict[str, int]:
    """The markers of ``syntax`` that the vocabulary holds as one special token each."""
    specials = {tokenizer.id_to_token(token): token for token in tokenizer.special_ids}
    return {marker: specials[marker] for marker in syntax.markers if marker in specials}


def render(
    tokenizer: Tokenizer,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: list[Tool] | None,
    syntax: ToolSyntax = CRESCENT,
) -> tuple[int, ...]:
    """Token ids of the conversation as the chat template renders it, with ``tools`` given to
    the template where it has a tool syntax of its own, and described in Crescent's default
    format where it has none."""
    chat, listed = chat_input(messages, tools, syntax)
    if not chat:
        raise errors.invalid("messages must be a non-empty list", "messages")
    try:
        return tuple(tokenizer.apply_chat_template(chat, add_generation_prompt, listed))
    except InvalidRequestError as exc:
        raise errors.from_invalid(exc) from exc


def chat_input(
    messages: list[ChatMessage], tools: list[Tool] | None, syntax: ToolSyntax = CRESCENT
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The template's messages and its ``tools``: for a template with its own tool syntax,
    OpenAI's shapes (what transformers' ``apply_chat_template`` takes); otherwise Crescent's
    format, with the tools described in the system message."""
    if not syntax.native:
        return conversation(messages, tools, show_tools=bool(tools)), None
    listed = [t.model_dump(exclude_none=True) for t in tools or []]
    return template_messages(messages, syntax), listed or None


def template_messages(messages: list[ChatMessage], syntax: ToolSyntax) -> list[dict[str, Any]]:
    """Messages as templates with a tool syntax read them: an assistant's ``tool_calls`` in
    OpenAI's shape with their arguments as objects (templates write them out with ``tojson``),
    tool answers as ``tool`` messages; call ids as ``syntax`` needs them."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        _check_tool_fields(i, message)
        if message.role == "tool":
            as_user = message.model_copy(update={"role": "user", "tool_call_id": None})
            answer = {"role": "tool", "content": message_dict(i, as_user)["content"]}
            if message.tool_call_id is not None:
                answer["tool_call_id"] = syntax.template_call_id(message.tool_call_id)
            if message.name is not None:
                answer["name"] = message.name
            out.append(answer)
            continue
        rendered = message_dict(i, message.model_copy(update={"tool_calls": None}))
        if message.tool_calls:
            rendered["tool_calls"] = [
                {
                    "id": syntax.template_call_id(call.id),
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": _arguments(i, j, call)},
                }
                for j, call in enumerate(message.tool_calls)
            ]
        out.append(rendered)
    return out


def _check_tool_fields(i: int, message: ChatMessage) -> None:
    if message.role == "tool":
        return
    if message.tool_call_id is not None:
        param = f"messages[{i}].tool_call_id"
        raise errors.invalid("only tool messages answer a tool call", param)
    if message.tool_calls and message.role != "assistant":
        param = f"messages[{i}].tool_calls"
        raise errors.invalid("only assistant messages make tool calls", param)


def _arguments(i: int, j: int, call: ToolCallIn) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        param = f"messages[{i}].tool_calls[{j}].function.arguments"
        raise errors.invalid("arguments must be JSON text", param) from None


def conversation(
    messages: list[ChatMessage], tools: list[Tool] | None, show_tools: bool
) -> list[dict[str, Any]]:
    """The template's messages: tool calls and tool answers in the default format, and the
    tools described in the system message when ``show_tools``."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        _check_tool_fields(i, message)
        if message.role == "tool":
            _add_tool_answer(out, i, message)
        elif message.tool_calls:
            out.append(_assistant_calls(i, message))
        else:
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
        arguments = _arguments(i, j, call)
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
