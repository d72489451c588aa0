"""Forced calls in each family's syntax: the grammar ``tool_choice`` "required" or a named
function compiles against the test vocabulary, accepts a well-formed call in that syntax (and
the reader reads it back), and refuses anything else; markers that a vocabulary holds as special
tokens are accepted as those tokens and reach the reader as text."""

from __future__ import annotations

from typing import ClassVar

import pytest

from services.gateway.output import ChoiceAssembler
from services.gateway.requests import OutputOptions
from services.gateway.tool_calls import parse_all
from services.gateway.tool_syntax import ToolSyntax, resolve
from services.gateway.tool_syntax.hermes import Hermes
from services.gateway.tools import plan, special_markers
from shared.messages import TokenChunk
from shared.model.grammar import Grammars
from shared.model.tokenizer import Tokenizer
from tests.gateway.test_tools import TOOLS, follows, named

WEATHER_ARGS = '{"city": "Paris", "unit": "c"}'
HERMES_CALLS = (
    f'<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
)
# Per syntax: a call of each tool, how two calls are joined, and calls in other syntaxes.
FORMS = {
    "hermes": (HERMES_CALLS, "\n", ['{"name": "get_time", "parameters": {}}']),
    "llama3_json": (
        (
            f'{{"name": "get_weather", "parameters": {WEATHER_ARGS}}}',
            '{"name": "get_time", "parameters": {}}',
        ),
        "; ",
        ['{"name": "get_time", "arguments": {}}', HERMES_CALLS[1]],
    ),
    "mistral": (
        (
            f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER_ARGS}}}]',
            '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]',
        ),
        "",
        ['[{"name": "get_time", "arguments": {}}]', HERMES_CALLS[1]],
    ),
    "mistral[ARGS]": (
        (f"[TOOL_CALLS]get_weather[ARGS]{WEATHER_ARGS}", "[TOOL_CALLS]get_time[ARGS]{}"),
        "",
        ["get_time[ARGS]{}", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]'],
    ),
}


def syntax_of(form: str) -> ToolSyntax:
    return resolve("mistral", "[ARGS]") if form == "mistral[ARGS]" else resolve(form, "")


def joined(form: str, first: str, second: str) -> str:
    if form == "mistral":  # two calls are two items of one list
        return first.removesuffix("]") + ", " + second.split("[", 2)[2]
    return first + FORMS[form][1] + second


@pytest.mark.parametrize("form", FORMS)
def test_a_named_choice_forces_that_call_in_the_syntax(
    form: str, grammars: Grammars, tokenizer: Tokenizer
) -> None:
    syntax = syntax_of(form)
    (weather, time), _, others = FORMS[form]
    grammar = plan(TOOLS, named("get_weather"), None, syntax).grammar
    assert follows(grammars, tokenizer, grammar, weather)
    content, calls = parse_all(weather, syntax)
    assert content is None and [(n, a) for _, n, a in calls] == [("get_weather", WEATHER_ARGS)]
    bad_args = weather.replace('"unit": "c"', '"unit": "k"')
    for text in (bad_args, time, "Sure! " + weather, joined(form, weather, weather), *others):
        assert not follows(grammars, tokenizer, grammar, text), text


@pytest.mark.parametrize("form", FORMS)
def test_required_allows_any_tool_and_parallel_calls_unless_told_not_to(
    form: str, grammars: Grammars, tokenizer: Tokenizer
) -> None:
    syntax = syntax_of(form)
    (weather, time), _, _ = FORMS[form]
    both = joined(form, weather, time)
    many = plan(TOOLS, "required", None, syntax).grammar
    assert follows(grammars, tokenizer, many, time)
    assert follows(grammars, tokenizer, many, both)
    assert [n for _, n, _ in parse_all(both, syntax)[1]] == ["get_weather", "get_time"]
    single = plan(TOOLS, "required", False, syntax).grammar
    assert follows(grammars, tokenizer, single, weather)
    assert not follows(grammars, tokenizer, single, both)


def test_a_marker_that_is_a_special_token_is_accepted_as_that_token(
    grammars: Grammars, tokenizer: Tokenizer
) -> None:
    # The test vocabulary has no [TOOL_CALLS]; its special token 1 (<|im_start|>) stands in.
    marker = tokenizer.id_to_token(1)
    assert 1 in tokenizer.special_ids
    rest = '[{"name": "get_time", "arguments": {}}]'
    for form, text in (("mistral", rest), ("mistral[ARGS]", "get_time[ARGS]{}")):
        grammar = syntax_of(form).grammar(TOOLS, True, {"[TOOL_CALLS]": 1})
        ids = [1, *tokenizer.encode(text, add_special_tokens=False)]
        assert grammars.matcher(grammar, ids).can_end, form
        assert follows(grammars, tokenizer, grammar, "[TOOL_CALLS]" + text)  # also spelled out
    # Without the special token named, the grammar refuses it (llguidance keeps them apart).
    plain = syntax_of("mistral").grammar(TOOLS, True, {})
    assert not follows(grammars, tokenizer, plain, marker + rest)


class _Marked(Hermes):
    markers: ClassVar[tuple[str, ...]] = ("<|im_start|>", "<tool_call>", "[ARGS]")


def test_markers_held_as_special_tokens_are_output_for_the_reader(tokenizer: Tokenizer) -> None:
    specials = special_markers(_Marked(), tokenizer)
    assert specials == {"<|im_start|>": 1}  # the others are ordinary text in this vocabulary
    kept = plan(TOOLS, "auto", None, _Marked(), specials).kept_tokens
    assert kept == {1: "<|im_start|>"}
    assert plan(TOOLS, "none", None, _Marked(), specials).kept_tokens == {}
    hi = tokenizer.encode("Hi ", add_special_tokens=False)
    ids = [*hi, 1, *hi, 2]
    for options, text in (
        (OutputOptions(kept_tokens=kept), "Hi <|im_start|>Hi "),
        (None, "Hi Hi "),
    ):
        choice = ChoiceAssembler(tokenizer, (5, 6), 100, options or OutputOptions())
        for i, token in enumerate(ids):
            reason = "stop" if i == len(ids) - 1 else None
            choice.add(
                TokenChunk(request_id="r-0", index=i, token_ids=[token], finish_reason=reason)
            )
        assert choice.text == text
