"""Reading calls in each family's syntax as the answer streams: fed one character at a time,
in small pieces and whole, each gives the same content and calls; text before a call is
content, and what only looks like a call stays text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.gateway.tool_calls import (
    CallArguments,
    CallStart,
    Content,
    ToolCallParser,
    parse_all,
)
from services.gateway.tool_syntax import ToolSyntax, resolve
from services.gateway.tool_syntax.mistral import Mistral

SIZES = [1, 2, 3, 7, 1000]
PARIS = {"city": "Paris", "unit": "c"}
TRICKY = {"city": 'Ro"me}]', "unit": "c"}  # brackets and quotes inside a string
HERMES = resolve("hermes", "")
LLAMA3 = resolve("llama3_json", "")
MISTRAL = resolve("mistral", "")


def hermes(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def llama3(name: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"name": name, "parameters": arguments})


def read(syntax: ToolSyntax, text: str, size: int) -> tuple[str, list[tuple[str, Any]]]:
    """The content and the (name, arguments) calls of ``text`` fed ``size`` characters at a
    time, checking the events add up to what the parser says it read."""
    parser = ToolCallParser(syntax)
    events = [e for i in range(0, len(text), size) for e in parser.feed(text[i : i + size])]
    events += parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    calls: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls)
            calls.append((e.name, ""))
        elif isinstance(e, CallArguments):
            name, so_far = calls[e.index]
            calls[e.index] = (name, so_far + e.text)
    assert [(n, a) for _, n, a in parser.calls] == calls
    return content, [(n, json.loads(a)) for n, a in calls]


CASES: list[tuple[ToolSyntax, str, str | None, list[tuple[str, Any]]]] = [
    # Hermes: elements; a newline on either side of one is markup.
    (HERMES, hermes("get_weather", PARIS), "", [("get_weather", PARIS)]),
    (
        HERMES,
        "Let me look.\n" + hermes("get_weather", TRICKY) + "\n" + hermes("get_time", {}) + "\nOk",
        "Let me look.Ok",
        [("get_weather", TRICKY), ("get_time", {})],
    ),
    (HERMES, "a\n<tool_call>\nnot a call\n</tool_call> b <tool", None, []),
    # Llama 3: a bare object at the start, on its own line or after the tag; ``;`` between.
    (LLAMA3, llama3("get_weather", PARIS), "", [("get_weather", PARIS)]),
    (
        LLAMA3,
        " " + llama3("get_weather", TRICKY) + "; " + llama3("get_time", {}),
        "",
        [("get_weather", TRICKY), ("get_time", {})],
    ),
    (
        LLAMA3,
        'Let me look.\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
        "Let me look.",
        [("get_weather", PARIS)],
    ),
    (
        LLAMA3,
        "Sure<|python_tag|>" + llama3("get_time", {}) + "\n\nDone.",
        "SureDone.",
        [("get_time", {})],
    ),
    (
        LLAMA3,
        '{"type": "function", "name": "get_time", "parameters": {}}',
        "",
        [("get_time", {})],
    ),
    (LLAMA3, 'Say {"name": "x", "parameters": {}} like that', None, []),
    (LLAMA3, '{"names": ["a"]} and {"name": 3}', None, []),
    (LLAMA3, "<|python_tag|>search.call(query='x')", None, []),
    # Mistral: a JSON list after [TOOL_CALLS], or name[ARGS]{...} per call.
    (
        MISTRAL,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + json.dumps(PARIS) + "}]",
        "",
        [("get_weather", PARIS)],
    ),
    (
        MISTRAL,
        "Checking. [TOOL_CALLS]["
        + json.dumps({"name": "get_weather", "arguments": TRICKY})
        + ', {"name": "get_time", "arguments": {}, "id": "a1b2c3d4e"}]',
        "Checking. ",
        [("get_weather", TRICKY), ("get_time", {})],
    ),
    (
        MISTRAL,
        "[TOOL_CALLS]get_weather[ARGS]"
        + json.dumps(TRICKY)
        + "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}",
        "",
        [("get_weather", TRICKY), ("get_time", {})],
    ),
    (MISTRAL, "[TOOL_CALLS] I cannot [do] that [TOOL", None, []),
    (MISTRAL, '[TOOL_CALLS] [{"name": 3}] [1, 2]', None, []),
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("syntax", "text", "content", "calls"), CASES)
def test_calls_read_the_same_in_any_pieces(
    syntax: ToolSyntax, text: str, content: str | None, calls: list[Any], size: int
) -> None:
    # None: the text is no call at all, so all of it is content.
    assert read(syntax, text, size) == (text if content is None else content, calls)


def test_a_whole_answer_of_calls_has_no_content() -> None:
    text = "\n" + llama3("get_time", {}) + ";\n" + llama3("get_time", {}) + "\n"
    content, calls = parse_all(text, LLAMA3)
    assert content is None and [n for _, n, _ in calls] == ["get_time", "get_time"]
    content, calls = parse_all("Hi " + hermes("get_time", {}), HERMES)
    assert content == "Hi " and len(calls) == 1


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3, MISTRAL])
def test_a_call_cut_short_keeps_what_was_written(syntax: ToolSyntax) -> None:
    whole = {
        "hermes": hermes("get_weather", PARIS),
        "llama3_json": llama3("get_weather", PARIS),
        "mistral": "[TOOL_CALLS]get_weather[ARGS]" + json.dumps(PARIS),
    }[syntax.name]
    cut = whole[: whole.index('"Paris"') + 4]
    parser = ToolCallParser(syntax)
    events = [e for ch in cut for e in parser.feed(ch)] + parser.finish()
    assert not [e for e in events if isinstance(e, Content)]
    assert parser.calls[0][1:] == ("get_weather", '{"city": "Par')


def test_call_ids_have_each_familys_shape() -> None:
    for syntax in (HERMES, LLAMA3):
        _, calls = parse_all(hermes("f", {}) if syntax is HERMES else llama3("f", {}), syntax)
        assert calls[0][0].startswith("call_")
    _, calls = parse_all('[TOOL_CALLS][{"name": "f", "arguments": {}}]', MISTRAL)
    (call_id, _, _) = calls[0]
    assert len(call_id) == 9 and call_id.isalnum()
    # A call read back from an answer needs no change to go into the template again.
    assert Mistral().template_call_id(call_id) == call_id
