"""OpenAI response shapes: usage, logprobs for chat and completions, stream chunks."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.output import ChoiceAssembler
from services.gateway.requests import PreparedRequest, RequestBuilder
from services.gateway.responses import LOGPROB_FLOOR, Shapes
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from shared.messages import TokenChunk, TokenLogprob
from shared.model.tokenizer import Tokenizer

MODEL = "m"


@pytest.fixture
def builder(tokenizer: Tokenizer) -> RequestBuilder:
    return RequestBuilder(tokenizer, MODEL, 8192, max_n=8)


def run(tokenizer: Tokenizer, prepared: PreparedRequest, texts: list[str]) -> list[ChoiceAssembler]:
    """Feeds every choice its text as one finished chunk with logprobs and cached tokens."""
    choices = []
    for spec, text in zip(prepared.choices, texts, strict=True):
        choice = ChoiceAssembler(
            tokenizer,
            prepared.prompts[spec.prompt_index],
            spec.request.sampling.max_tokens,
            prepared.options,
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
        logprobs = [
            TokenLogprob(t, -1.0 * k, [(t, -1.0 * k), (7, float("-inf"))])
            for k, t in enumerate(ids)
        ]
        chunk = TokenChunk(
            request_id=spec.request.request_id,
            index=0,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason="stop",
            num_cached_tokens=16 * (spec.index + 1),
            cached_by_tier={"nvme": 10, "s3": 2 * (spec.index + 1)},
        )
        choice.add(chunk)
        choices.append(choice)
    return choices


def chat(builder: RequestBuilder, **fields: Any) -> PreparedRequest:
    messages = [{"role": "user", "content": "Hi"}]
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages} | fields)
    return builder.chat(body, "t")


def test_chat_response_shape_and_usage_counts_the_prompt_once(
    builder: RequestBuilder, tokenizer: Tokenizer
) -> None:
    prepared = chat(builder, n=2, logprobs=True, top_logprobs=2)
    choices = run(tokenizer, prepared, ["Hi there", "Yo"])
    body = Shapes(prepared, tokenizer).response(choices)
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Hi there",
        "refusal": None,
    }
    prompt_len = len(prepared.prompts[0])
    completion = sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in ["Hi there", "Yo"])
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
        # Choice 0 speaks for the prompt; its chunk said 16 cached tokens, 12 of them below
        # DRAM (what it did not place counts as DRAM).
        "prompt_tokens_details": {
            "cached_tokens": 16,
            "cached_tokens_by_tier": {"dram": 4, "nvme": 10, "s3": 2},
            "cache_write_tokens": 0,
            "cache_written_tokens": 0,
        },
        "completion_tokens_details": {"cache_write_tokens": 0, "cache_written_tokens": 0},
    }
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["Hi", " there"]
    assert content[1]["logprob"] == -1.0 and content[1]["bytes"] == list(b" there")
    assert content[1]["top_logprobs"][1]["logprob"] == LOGPROB_FLOOR
    assert set(content[0]["top_logprobs"][0]) == {"token", "logprob", "bytes"}


def test_written_tokens_add_up_over_nodes_and_choices(
    builder: RequestBuilder, tokenizer: Tokenizer
) -> None:
    """Each node's chunks carry its running count: its largest is its total, and the totals
    of the prefill and the decode node (and of every choice) add up."""
    prepared = chat(builder, n=2)
    choices = []
    for spec in prepared.choices:
        choice = ChoiceAssembler(
            tokenizer, prepared.prompts[0], spec.request.sampling.max_tokens, prepared.options
        )
        rid = spec.request.request_id
        first = TokenChunk(request_id=rid, index=0, token_ids=[5], prompt_tokens_written=64)
        first.node_id = "prefill-0"
        choice.add(first)
        for index, written in ((1, 16), (2, 32)):
            chunk = TokenChunk(
                request_id=rid, index=index, token_ids=[6], output_tokens_written=written
            )
            chunk.node_id = "decode-0"
            chunk.finish_reason = "length" if index == 2 else None
            choice.add(chunk)
        choices.append(choice)
    usage = Shapes(prepared, tokenizer).response(choices)["usage"]
    assert usage["prompt_tokens_details"]["cache_write_tokens"] == 2 * 64
    assert usage["completion_tokens_details"]["cache_write_tokens"] == 2 * 32
    # The earlier name says the same, for one release.
    assert usage["prompt_tokens_details"]["cache_written_tokens"] == 2 * 64
    assert usage["completion_tokens_details"] == {
        "cache_write_tokens": 2 * 32,
        "cache_written_tokens": 2 * 32,
    }


def test_completion_logprobs_shape(builder: RequestBuilder, tokenizer: Tokenizer) -> None:
    body = CompletionRequest.model_validate({"model": MODEL, "prompt": ["a", "b"], "logprobs": 1})
    prepared = builder.completion(body, "t")
    choices = run(tokenizer, prepared, ["Hi there", "Yo"])
    response = Shapes(prepared, tokenizer).response(choices)
    assert response["object"] == "text_completion"
    assert response["choices"][1]["text"] == "Yo"
    logprobs = response["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Hi", " there"]
    assert logprobs["token_logprobs"] == [0.0, -1.0]
    assert logprobs["top_logprobs"] == [{"Hi": 0.0}, {" there": -1.0}]
    assert logprobs["text_offset"] == [0, 2]
    # Two prompts: both count, and each one's first choice reports its cached tokens.
    assert response["usage"]["prompt_tokens"] == sum(len(p) for p in prepared.prompts)
    details = response["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == min(16, 1) + min(32, 1)
    # Clipped to the one-token prompts, the split still adds up (S3 claims them first).
    assert details["cached_tokens_by_tier"] == {"dram": 0, "nvme": 0, "s3": 2}


def test_stream_chunks(builder: RequestBuilder, tokenizer: Tokenizer) -> None:
    prepared = chat(builder, stream=True, stream_options={"include_usage": True})
    shapes = Shapes(prepared, tokenizer)
    (role,) = shapes.role_chunks()
    assert role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["usage"] is None
    choice = ChoiceAssembler(tokenizer, prepared.prompts[0], 100, prepared.options)
    ids = tokenizer.encode("Hey", add_special_tokens=False)
    delta = choice.add(TokenChunk(request_id="x", index=0, token_ids=ids, finish_reason="stop"))
    text, finish = shapes.delta_chunks(0, delta)
    assert text["choices"][0]["delta"] == {"content": "Hey"}
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    usage = shapes.usage_chunk([choice])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)


def test_completion_stream_chunk_has_text(builder: RequestBuilder, tokenizer: Tokenizer) -> None:
    body = CompletionRequest.model_validate({"model": MODEL, "prompt": "a", "stream": True})
    prepared = builder.completion(body, "t")
    shapes = Shapes(prepared, tokenizer)
    assert shapes.role_chunks() == []
    choice = ChoiceAssembler(tokenizer, prepared.prompts[0], 100, prepared.options)
    delta = choice.add(
        TokenChunk(request_id="x", index=0, token_ids=[26843], finish_reason="length")
    )
    text, finish = shapes.delta_chunks(0, delta)
    assert text["choices"][0]["text"] == "Hi" and "usage" not in text
    assert finish["choices"][0]["finish_reason"] == "length" and finish["choices"][0]["text"] == ""
