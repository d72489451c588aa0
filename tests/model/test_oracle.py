"""Crescent's engine against the reference implementation: greedy tokens must be identical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from shared.engine.engine import LLMEngine
from shared.model import cpu_kernels
from shared.model.decoder import DecoderForCausalLM
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory
from tests.model.prompts import CHAT_PROMPTS, RAW_PROMPTS, long_chat, long_document

NEW_TOKENS = 32
pytestmark = pytest.mark.slow


def oracle_prompts(tokenizer: Tokenizer, hf_tokenizer: Any) -> list[list[int]]:
    """Token ids of every oracle prompt; both tokenizers must agree on each of them."""
    texts = [*RAW_PROMPTS, long_document(1, 1600, tokenizer), long_document(2, 1800, tokenizer)]
    chats = [*CHAT_PROMPTS, long_chat(3, 1600, tokenizer), long_chat(4, 1700, tokenizer)]
    ids = [tokenizer.encode(t) for t in texts] + [tokenizer.apply_chat_template(c) for c in chats]
    for text in texts:
        assert tokenizer.encode(text) == hf_tokenizer(text)["input_ids"]
    for chat in chats:
        rendered = hf_tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )
        expected = hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]
        assert tokenizer.apply_chat_template(chat) == expected
    return ids


def hf_greedy(hf_model: Any, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=hf_model.config.eos_token_id,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def oracle_cases(
    tokenizer: Tokenizer, hf_tokenizer: Any, hf_model: Any
) -> list[tuple[list[int], list[int]]]:
    """Every oracle prompt with transformers' greedy continuation of it."""
    prompts = oracle_prompts(tokenizer, hf_tokenizer)
    lengths = sorted(len(p) for p in prompts)
    assert len(prompts) >= 20 and lengths[-4] > 1500 and lengths[0] < 20
    return [(prompt, hf_greedy(hf_model, prompt)) for prompt in prompts]


def greedy_mismatches(
    engine: LLMEngine, cases: list[tuple[list[int], list[int]]]
) -> list[tuple[int, int, list[int], list[int]]]:
    # The whole set goes through one engine at once: long prompts are prefilled in chunks
    # while short ones decode, which is the hardest case for exactness.
    prompts = [prompt for prompt, _ in cases]
    ours = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
    return [
        (i, len(prompt), out.output_token_ids, expected)
        for i, ((prompt, expected), out) in enumerate(zip(cases, ours, strict=True))
        if out.output_token_ids != expected
    ]


def test_greedy_tokens_equal_transformers(
    oracle_cases: list[tuple[list[int], list[int]]], make_real_engine: RealEngineFactory
) -> None:
    """The model as served: few-row matmuls from the GGUF blocks where the kernels load."""
    engine = make_real_engine(num_kv_blocks=400, max_num_batched_tokens=1024)
    assert not greedy_mismatches(engine, oracle_cases)


def test_greedy_tokens_equal_transformers_with_torch_matmuls_only(
    oracle_cases: list[tuple[list[int], list[int]]],
    make_real_engine: RealEngineFactory,
    torch_only_model: DecoderForCausalLM,
) -> None:
    """The fallback where the kernels are off or cannot be built."""
    engine = make_real_engine(
        with_model=torch_only_model, num_kv_blocks=400, max_num_batched_tokens=1024
    )
    assert not greedy_mismatches(engine, oracle_cases)


def test_served_model_uses_the_kernels_where_they_build(
    model: DecoderForCausalLM, cache_dir: Path
) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")
    projections = [model.lm_head] + [
        p
        for layer in model.layers
        for p in (
            layer.self_attn.qkv_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_up_proj,
            layer.mlp.down_proj,
        )
    ]
    assert all(p.ggml is not None for p in projections)
