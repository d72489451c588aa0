"""Request translation: OpenAI bodies -> GenerateRequests, and every 400 on the way."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.errors import ApiError
from services.gateway.requests import COMPLETIONS_DEFAULT_MAX_TOKENS, RequestBuilder
from services.gateway.sampling import TenantTerms
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from shared.model.tokenizer import Tokenizer

MODEL = "test-model"
MAX_LEN = 64
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def builder(tokenizer: Tokenizer) -> RequestBuilder:
    return RequestBuilder(tokenizer, MODEL, MAX_LEN, max_n=4)


def chat(builder: RequestBuilder, **fields: Any) -> Any:
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": HELLO} | fields)
    return builder.chat(body, "tenant-a")


def completion(builder: RequestBuilder, **fields: Any) -> Any:
    body = CompletionRequest.model_validate({"model": MODEL, "prompt": "Hello"} | fields)
    return builder.completion(body, "tenant-a")


def rejected(call: Any, *args: Any, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **fields)
    return info.value


def test_chat_uses_the_template_and_defaults_to_the_rest_of_the_context(
    builder: RequestBuilder, tokenizer: Tokenizer
) -> None:
    prepared = chat(builder)
    (choice,) = prepared.choices
    prompt = tokenizer.apply_chat_template(HELLO)
    assert choice.request.prompt_token_ids == prompt
    assert choice.request.sampling.max_tokens == MAX_LEN - len(prompt)
    assert choice.request.tenant == "tenant-a"
    assert choice.request.request_id == f"{prepared.id}-0"
    assert prepared.id.startswith("chatcmpl-") and prepared.kind == "chat"
    assert choice.request.sampling.temperature == 1.0 and choice.request.sampling.logprobs is None


def test_chat_text_parts_and_developer_role(builder: RequestBuilder, tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
        },
    ]
    prepared = chat(builder, messages=messages)
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hel\nlo"}]
    )
    assert prepared.choices[0].request.prompt_token_ids == expected


def test_max_completion_tokens_wins_over_max_tokens(builder: RequestBuilder) -> None:
    prepared = chat(builder, max_tokens=3, max_completion_tokens=7)
    assert prepared.choices[0].request.sampling.max_tokens == 7


def test_prompt_too_long_error_says_the_numbers(
    builder: RequestBuilder, tokenizer: Tokenizer
) -> None:
    prompt_len = len(tokenizer.apply_chat_template(HELLO))
    error = rejected(chat, builder, max_tokens=60)
    assert error.status == 400 and error.param == "messages"
    assert f"maximum context length is {MAX_LEN} tokens" in error.message
    assert (
        f"requested {prompt_len + 60} tokens ({prompt_len} in the prompt, 60 for" in error.message
    )
    long_prompt = list(range(100, 100 + MAX_LEN))
    error = rejected(completion, builder, prompt=long_prompt)
    assert f"({MAX_LEN} in the prompt, 1 for the completion)" in error.message
    assert error.param == "prompt"


def test_completion_prompt_forms(builder: RequestBuilder, tokenizer: Tokenizer) -> None:
    prepared = completion(builder, prompt="Hello")
    assert prepared.prompts == (tuple(tokenizer.encode("Hello")),)
    assert prepared.choices[0].request.sampling.max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert completion(builder, prompt=[5, 6, 7]).prompts == ((5, 6, 7),)
    assert completion(builder, prompt=[[5], [6, 7]]).prompts == ((5,), (6, 7))
    many = completion(builder, prompt=["a", "b"], n=2)
    assert [(c.index, c.prompt_index) for c in many.choices] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert [c.request.request_id for c in many.choices] == [f"{many.id}-{i}" for i in range(4)]


def test_completion_default_max_tokens_shrinks_to_the_room_left(builder: RequestBuilder) -> None:
    prepared = completion(builder, prompt=list(range(10, 10 + MAX_LEN - 5)))
    assert prepared.choices[0].request.sampling.max_tokens == 5


def test_n_choices_get_consecutive_seeds(builder: RequestBuilder) -> None:
    prepared = chat(builder, n=3, seed=41, temperature=0.7, top_p=0.9, top_k=5)
    seeds = [c.request.sampling.seed for c in prepared.choices]
    assert seeds == [41, 42, 43]
    sampling = prepared.choices[1].request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.9, 5)
    assert chat(builder, n=2).choices[1].request.sampling.seed is None


def test_sampling_value_bounds(builder: RequestBuilder) -> None:
    error = rejected(chat, builder, temperature=0.005)
    assert error.message == "temperature must be 0 (greedy) or between 0.01 and 2, got 0.005"
    error = rejected(chat, builder, temperature=float("nan"))
    assert error.message == "temperature must be a finite number, got nan"
    error = rejected(chat, builder, max_tokens=MAX_LEN + 1)
    assert (
        error.message
        == f"max_tokens must be at most {MAX_LEN} (the model's context length), got {MAX_LEN + 1}"
    )
    # The last seed wraps for the next sibling rather than leaving the 63-bit range.
    seeds = [c.request.sampling.seed for c in chat(builder, n=2, seed=2**63 - 1).choices]
    assert seeds == [2**63 - 1, 0]
    sampling = chat(builder, temperature=0.01, top_k=2**31).choices[0].request.sampling
    assert (sampling.temperature, sampling.top_k) == (0.01, 2**31)


def test_priority_and_the_ttft_objective_reach_the_nodes(builder: RequestBuilder) -> None:
    plain = chat(builder).choices[0].request
    assert (plain.sampling.priority, plain.sampling.ttft_deadline) == (0, 0.0)
    asked = chat(builder, priority=-3, ttft_slo_ms=1500, n=2)
    for choice in asked.choices:
        request = choice.request
        assert request.sampling.priority == -3
        assert request.sampling.ttft_deadline == pytest.approx(request.arrival_ts + 1.5)


def test_a_tenants_objective_applies_unless_the_request_brings_its_own(
    tokenizer: Tokenizer,
) -> None:
    terms = {"a": TenantTerms(ttft_slo_ms=800, tbt_slo_ms=50, weight=2.0)}
    builder = RequestBuilder(tokenizer, MODEL, MAX_LEN, max_n=4, tenant_terms=terms)
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": HELLO})
    request = builder.chat(body, "a").choices[0].request
    assert request.sampling.ttft_deadline == pytest.approx(request.arrival_ts + 0.8)
    assert (request.sampling.tbt_slo_s, request.sampling.tenant_weight) == (0.05, 2.0)
    other = builder.chat(body, "b").choices[0].request.sampling
    assert (other.ttft_deadline, other.tbt_slo_s, other.tenant_weight) == (0.0, 0.0, 1.0)
    own = body.model_copy(update={"ttft_slo_ms": 5000.0, "tbt_slo_ms": 200.0})
    request = builder.chat(own, "a").choices[0].request
    assert request.sampling.ttft_deadline == pytest.approx(request.arrival_ts + 5.0)
    assert request.sampling.tbt_slo_s == 0.2


def test_a_bad_time_between_tokens_objective_is_refused(builder: RequestBuilder) -> None:
    for bad in (0, -5, 3_600_001):
        assert rejected(chat, builder, tbt_slo_ms=bad).param == "tbt_slo_ms"


def test_logprobs_mapping(builder: RequestBuilder) -> None:
    assert chat(builder, logprobs=True).options.logprobs == 0
    assert chat(builder, logprobs=True, top_logprobs=3).choices[0].request.sampling.logprobs == 3
    assert completion(builder, logprobs=2).options.logprobs == 2
    assert rejected(chat, builder, top_logprobs=2).param == "top_logprobs"
    assert rejected(chat, builder, logprobs=True, top_logprobs=21).param == "top_logprobs"
    assert rejected(completion, builder, logprobs=21).param == "logprobs"


def test_stop_cache_salt_and_stream_options(builder: RequestBuilder) -> None:
    prepared = chat(
        builder, stop="x", cache_salt="s1", stream=True, stream_options={"include_usage": True}
    )
    assert prepared.options.stop == ("x",)
    assert prepared.choices[0].request.cache_salt == "s1"
    assert prepared.stream and prepared.include_usage
    assert chat(builder, stop=["a", "b"]).options.stop == ("a", "b")
    assert rejected(chat, builder, stop=[""]).param == "stop"
    assert rejected(chat, builder, stop=["s"] * 17).param == "stop"
    assert rejected(chat, builder, cache_salt="").param == "cache_salt"
    assert rejected(chat, builder, stream_options={"include_usage": True}).param == "stream"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": 1e-300}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2**31 + 1}, "top_k"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"max_tokens": 10**12}, "max_tokens"),
        ({"max_completion_tokens": MAX_LEN + 1}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"n": 5}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": -3}, "max_completion_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {}}},
                }
            },
            "response_format",
        ),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"token": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
        ({"priority": 2**31}, "priority"),
        ({"ttft_slo_ms": 0}, "ttft_slo_ms"),
        ({"ttft_slo_ms": -5}, "ttft_slo_ms"),
        ({"ttft_slo_ms": 1e12}, "ttft_slo_ms"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [10**6]}, "stop_token_ids"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
            "messages[0].tool_call_id",
        ),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": "x",
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls",
        ),
    ],
)
def test_chat_rejections_name_the_parameter(
    builder: RequestBuilder, fields: dict[str, Any], param: str
) -> None:
    error = rejected(chat, builder, **fields)
    assert (error.status, error.param) == (400, param)
    assert error.type == "invalid_request_error"


def test_neutral_values_of_unsupported_parameters_are_accepted(builder: RequestBuilder) -> None:
    chat(
        builder,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        store=False,
        service_tier="auto",
    )
    completion(builder, echo=False, best_of=1, suffix=None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "!"}, "suffix"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, 10**9]}, "prompt"),
        ({"prompt": ["a"] * 100, "n": 4}, "n"),
    ],
)
def test_completion_rejections(builder: RequestBuilder, fields: dict[str, Any], param: str) -> None:
    assert rejected(completion, builder, **fields).param == param


def test_unknown_model_is_404(builder: RequestBuilder) -> None:
    error = rejected(chat, builder, model="gpt-4o")
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
