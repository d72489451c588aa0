"""Grammar-constrained decoding with the real model: JSON schemas, JSON objects, regular
expressions and choices hold, and a constrained sequence keeps its grammar state across a KV
hand-off between engines and a resume on another engine."""

from __future__ import annotations

import dataclasses
import json
import re

import pydantic
import pytest

from shared.model.grammar import (
    any_json_object_grammar,
    choice_grammar,
    json_schema_grammar,
    regex_grammar,
)
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory
from tests.engine.test_handoff import copy_blocks, decode_to_end

pytestmark = pytest.mark.slow


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=20)
    age: int


def chat(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}])


def run(
    make_real_engine: RealEngineFactory, prompt: list[int], params: SamplingParams
) -> list[int]:
    return make_real_engine().generate([prompt], params)[0].output_token_ids


def test_a_json_schema_answer_is_a_valid_instance(
    make_real_engine: RealEngineFactory, tokenizer: Tokenizer
) -> None:
    grammar = json_schema_grammar(Person.model_json_schema())
    prompt = chat(tokenizer, "Bob is a 42 year old carpenter. Describe him as JSON.")
    for params in (
        SamplingParams(max_tokens=60, temperature=0.0, grammar=grammar),
        SamplingParams(max_tokens=60, temperature=1.0, seed=7, grammar=grammar),
    ):
        out = run(make_real_engine, prompt, params)
        person = Person.model_validate_json(tokenizer.decode(out))
        assert person.name
        # The grammar ends the answer at its closing brace: no end token is needed.
        assert tokenizer.decode(out).endswith("}")


def test_json_object_regex_and_choice_hold(
    make_real_engine: RealEngineFactory, tokenizer: Tokenizer
) -> None:
    prompt = chat(tokenizer, "List the three primary colours.")
    as_object = SamplingParams(max_tokens=80, temperature=0.0, grammar=any_json_object_grammar())
    obj = run(make_real_engine, prompt, as_object)
    assert isinstance(json.loads(tokenizer.decode(obj)), dict)
    phone = re.compile(r"\d{3}-\d{4}")
    as_phone = SamplingParams(
        max_tokens=20, temperature=1.0, seed=3, grammar=regex_grammar(phone.pattern)
    )
    out = run(make_real_engine, chat(tokenizer, "Give me a phone number."), as_phone)
    assert phone.fullmatch(tokenizer.decode(out))
    options = ["yes", "no", "not sure"]
    as_choice = SamplingParams(max_tokens=10, temperature=0.0, grammar=choice_grammar(options))
    answer = run(make_real_engine, chat(tokenizer, "Is the sea salty?"), as_choice)
    assert tokenizer.decode(answer) in options


def test_a_constrained_sequence_keeps_its_grammar_across_a_handoff_and_a_resume(
    make_real_engine: RealEngineFactory, tokenizer: Tokenizer
) -> None:
    grammar = json_schema_grammar(Person.model_json_schema())
    prompt = chat(tokenizer, "Alice is 31. Describe her as JSON.")
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=11, grammar=grammar)
    full = run(make_real_engine, prompt, params)
    Person.model_validate_json(tokenizer.decode(full))

    prefill_node, decode_node = make_real_engine(), make_real_engine()
    first_only = dataclasses.replace(params, max_tokens=1)
    prefill_node.add_request("r", prompt, first_only, hold_blocks=True)
    (out,) = [
        o for _ in range(20) if prefill_node.has_unfinished_requests() for o in prefill_node.step()
    ]
    assert out.new_token_ids == full[:1]
    held = prefill_node.held_block_ids("r")
    slot = decode_node.begin_import("r", prompt, full[0], params)
    assert held is not None and slot is not None
    copy_blocks(prefill_node, held, decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == full

    k = len(full) // 2
    resumed = dataclasses.replace(params, max_tokens=params.max_tokens - k, output_offset=k)
    rest = run(make_real_engine, prompt + full[:k], resumed)
    assert full[:k] + rest == full
