"""Tool calls at the gateway: the default tool format in the prompt, the grammar that forces a
call, the parser that reads calls back (whole or streamed), and the OpenAI shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.gateway.errors import ApiError
from services.gateway.schemas import ChatMessage, NamedToolChoice, Tool
from services.gateway.tool_calls import CallArguments, CallStart, Content, ToolCallParser
from services.gateway.tools import conversation, plan
from shared.errors import InvalidRequestError
from shared.model.grammar import Grammars
from shared.model.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [Tool.model_validate(WEATHER), Tool.model_validate(TIME)]
ARGS = '{"city": "Paris", "unit": "c"}'
CALL = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'


def named(name: str) -> NamedToolChoice:
    return NamedToolChoice.model_validate({"type": "function", "function": {"name": name}})


def follows(grammars: Grammars, tokenizer: Tokenizer, grammar: str, text: str) -> bool:
    """Whether ``text`` is a complete output of ``grammar``. A grammar that does not compile
    fails the test here, so a negative answer always means the tokens were rejected."""
    grammars.matcher(grammar)
    try:
        matcher = grammars.matcher(grammar, tokenizer.encode(text, add_special_tokens=False))
    except InvalidRequestError:
        return False
    return matcher.can_end


def test_plans_follow_tool_choice() -> None:
    assert plan(None, None, None).parse_calls is False
    assert plan(TOOLS, "none", None) == plan(None, "none", None)
    auto = plan(TOOLS, "auto", None)
    assert auto.parse_calls and auto.grammar == ""
    assert plan(TOOLS, None, None) == auto
    assert plan(TOOLS, "required", None).grammar and plan(TOOLS, named("get_time"), None).grammar


@pytest.mark.parametrize(
    ("tools", "choice"), [(TOOLS, named("nope")), (None, "required"), ([], named("get_time"))]
)
def test_a_choice_that_cannot_be_met_is_a_400(tools: Any, choice: Any) -> None:
    with pytest.raises(ApiError) as caught:
        plan(tools, choice, None)
    assert caught.value.param == "tool_choice"


def test_a_named_choice_forces_that_call_with_valid_arguments(
    grammars: Grammars, tokenizer: Tokenizer
) -> None:
    grammar = plan(TOOLS, named("get_weather"), None).grammar
    assert follows(grammars, tokenizer, grammar, CALL)
    bad_args = CALL.replace('"unit": "c"', '"unit": "k"')
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    for text in (bad_args, other, "Sure! " + CALL, CALL + "\n" + CALL):
        assert not follows(grammars, tokenizer, grammar, text), text


def test_required_allows_any_tool_and_parallel_calls_unless_told_not_to(
    grammars: Grammars, tokenizer: Tokenizer
) -> None:
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    many = plan(TOOLS, "required", None).grammar
    assert follows(grammars, tokenizer, many, other)
    assert follows(grammars, tokenizer, many, CALL + "\n" + other)
    single = plan(TOOLS, "required", False).grammar
    assert follows(grammars, tokenizer, single, CALL)
    assert not follows(grammars, tokenizer, single, CALL + "\n" + other)


def test_the_conversation_carries_tools_calls_and_answers() -> None:
    messages = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                ],
            }
        ),
        ChatMessage(role="tool", content="18 C", tool_call_id="call_1"),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_2"),
    ]
    out = conversation(messages, TOOLS, show_tools=True)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in out[0]["content"] and "<tools>" in out[0]["content"]
    assert out[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert out[3]["content"] == (
        "<tool_response>\n18 C\n</tool_response>\n<tool_response>\nsunny\n</tool_response>"
    )
    with_system = [ChatMessage(role="system", content="Be brief."), *messages[:1]]
    first = conversation(with_system, TOOLS, show_tools=True)[0]["content"]
    assert first.startswith("Be brief.\n\n# Tools")
    assert conversation(messages[:1], TOOLS, show_tools=False) == [
        {"role": "user", "content": "Weather in Paris?"}
    ]


def test_calls_in_the_wrong_place_are_400s() -> None:
    wrong = ChatMessage.model_validate(
        {"role": "user", "content": "x", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    )  # fmt: skip
    with pytest.raises(ApiError) as caught:
        conversation([wrong], None, False)
    assert caught.value.param == "messages[0].tool_calls"
    bad_json = ChatMessage.model_validate(
        {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}
    )  # fmt: skip
    with pytest.raises(ApiError) as caught:
        conversation([bad_json], None, False)
    assert caught.value.param == "messages[0].tool_calls[0].function.arguments"


def parse_in_pieces(text: str, size: int) -> tuple[str, list[tuple[str, str]]]:
    parser = ToolCallParser()
    events = [e for i in range(0, len(text), size) for e in parser.feed(text[i : i + size])]
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_")
            calls.append((e.name, ""))
        elif isinstance(e, CallArguments):
            name, so_far = calls[e.index]
            calls[e.index] = (name, so_far + e.text)
    assert [(n, a) for _, n, a in parser.calls] == calls
    return content, calls


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_calls_parse_the_same_in_any_pieces(size: int) -> None:
    text = "Let me check.\n" + CALL + "\n" + CALL.replace("Paris", 'Ro\\"me}') + "\nDone."
    content, calls = parse_in_pieces(text, size)
    assert content == "Let me check.Done."
    assert [json.loads(a) for _, a in calls] == [
        {"city": "Paris", "unit": "c"},
        {"city": 'Ro"me}', "unit": "c"},
    ]


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_what_is_not_a_call_stays_text(size: int) -> None:
    text = "a <tool_call>not json</tool_call> b <tool"
    assert parse_in_pieces(text, size) == (text, [])


def test_a_call_cut_short_keeps_what_was_written() -> None:
    cut = CALL[:60]
    content, calls = parse_in_pieces(cut, 4)
    assert content == "" and calls == [("get_weather", cut.split('"arguments": ')[1])]
    assert calls[0][1].startswith('{"city"')
