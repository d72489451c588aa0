"""Structured outputs at the gateway: each way of asking becomes one grammar on the wire,
and what cannot be enforced is a 400 that names the field and the schema feature."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.gateway.requests import RequestBuilder
from shared.model.grammar import (
    any_json_object_grammar,
    choice_grammar,
    json_schema_grammar,
    regex_grammar,
)
from shared.model.tokenizer import Tokenizer
from tests.gateway.test_requests import MODEL, chat, completion, rejected

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}


@pytest.fixture
def builder(tokenizer: Tokenizer) -> RequestBuilder:
    return RequestBuilder(tokenizer, MODEL, 512, max_n=4)


def grammar_of(prepared: Any) -> str:
    grammars = {c.request.sampling.grammar for c in prepared.choices}
    assert len(grammars) == 1
    return grammars.pop()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"response_format": {"type": "json_object"}}, any_json_object_grammar()),
        ({"response_format": json_schema_format(PERSON)}, json_schema_grammar(PERSON)),
        ({"guided_json": PERSON}, json_schema_grammar(PERSON)),
        ({"guided_regex": r"\d+"}, regex_grammar(r"\d+")),
        ({"guided_choice": ["yes", "no"], "n": 2}, choice_grammar(["yes", "no"])),
        ({"structured_outputs": {"json": PERSON}}, json_schema_grammar(PERSON)),
        ({"structured_outputs": {"choice": ["a"]}}, choice_grammar(["a"])),
        ({"response_format": {"type": "text"}}, ""),
        ({}, ""),
    ],
)
def test_each_way_of_asking_becomes_its_grammar(
    builder: RequestBuilder, fields: dict[str, Any], expected: str
) -> None:
    assert grammar_of(chat(builder, **fields)) == expected


def test_completions_take_the_vllm_fields(builder: RequestBuilder) -> None:
    prepared = completion(builder, prompt=["a", "b"], guided_regex="[ab]+")
    assert grammar_of(prepared) == regex_grammar("[ab]+")


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"response_format": json_schema_format({"not": {}})}, "response_format", "not"),
        ({"guided_json": {"type": "object", "if": {"required": ["a"]}}}, "guided_json", "if"),
        ({"guided_json": "{not json"}, "guided_json", "JSON schema"),
        ({"guided_regex": "(unclosed"}, "guided_regex", "cannot be enforced"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar", "cannot be enforced"),
        ({"guided_choice": []}, "guided_choice", "1 to"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "one structured"),
        ({"structured_outputs": {}}, "structured_outputs", "nothing"),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_it(
    builder: RequestBuilder, fields: dict[str, Any], param: str, needle: str
) -> None:
    error = rejected(chat, builder, **fields)
    assert (error.status, error.param) == (400, param)
    assert needle in error.message


def test_cache_control_reaches_the_sampling(builder: RequestBuilder) -> None:
    spec = chat(builder, cache_control={"read": False}).choices[0].request.sampling
    assert (spec.cache_read, spec.cache_write) == (False, True)
    spec = chat(builder, cache_control={"write": False}).choices[0].request.sampling
    assert (spec.cache_read, spec.cache_write) == (True, False)
    spec = chat(builder).choices[0].request.sampling
    assert (spec.cache_read, spec.cache_write) == (True, True)
    keeps = [
        ({"keep": "pin"}, ("pin", 0.0)),
        ({"keep": {"ttl_s": 600}}, ("ttl", 600.0)),
        ({"keep": {"ttl_s": 0}}, ("drop", 0.0)),
    ]
    for cache_control, keep in keeps:
        spec = chat(builder, cache_control=cache_control).choices[0].request.sampling
        assert (spec.keep, spec.keep_ttl_s) == keep
    for bad in ({"keep": "forever"}, {"keep": {"ttl_s": -1}}, {"keep": {"ttl_s": 1e9}}):
        with pytest.raises(ValidationError, match=r"cache_control\.keep"):  # the schema's 400
            chat(builder, cache_control=bad)
    error = rejected(chat, builder, cache_control={"keep": "pin", "write": False})
    assert (error.status, error.param) == (400, "cache_control.keep")
    assert "write false" in error.message
