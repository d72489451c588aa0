"""CRESCENT_KV_DTYPE on the real model: a bfloat16 or float16 cache holds half the bytes, an
fp8_e4m3 cache a quarter, and everything that moves or reuses KV (prefix hits, a hand-off's
block bytes, batching, the fused step) gives the tokens a single engine computes with that
cache."""

from __future__ import annotations

import pytest

from shared.config import EngineSettings
from shared.model.kv_cache import torch_dtype
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory
from tests.engine.test_handoff import copy_blocks, decode_to_end, prefill
from tests.model.prompts import RAW_PROMPTS, long_document

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
# Each narrow KV dtype, and how many times fewer bytes than float32 it stores.
NARROW = {"bfloat16": 2, "float16": 2, "fp8_e4m3": 4}


@pytest.mark.parametrize("kv_dtype", list(NARROW))
def test_a_narrow_cache_stores_a_fraction_of_the_bytes(
    make_real_engine: RealEngineFactory, kv_dtype: str
) -> None:
    full, narrow = make_real_engine(), make_real_engine(kv_dtype=kv_dtype)
    cache = narrow.runner.cache
    assert cache.tensor.dtype == torch_dtype(kv_dtype)
    assert NARROW[kv_dtype] * cache.layout.block_bytes == full.runner.cache.layout.block_bytes
    # What moves between nodes and tiers is the layout's bytes, whatever the element type.
    block_bytes = cache.layout.block_bytes
    assert len(cache.read_block_bytes(0)) == cache.block_buffer(0).nbytes == block_bytes


@pytest.mark.parametrize("kv_dtype", list(NARROW))
def test_prefix_hits_batches_and_hand_offs_keep_the_cold_tokens(
    tokenizer: Tokenizer, make_real_engine: RealEngineFactory, kv_dtype: str
) -> None:
    document = tokenizer.encode(long_document(3, 300, tokenizer))
    prompt = document + tokenizer.encode("\nQuestion: what was traded? Answer:")
    cold = make_real_engine(kv_dtype=kv_dtype).generate([prompt], GREEDY)[0]

    warm_engine = make_real_engine(kv_dtype=kv_dtype)
    warm_engine.generate([document + tokenizer.encode("\nSummary:")], GREEDY)
    warm = warm_engine.generate([prompt], GREEDY)[0]
    assert warm.num_cached_tokens > 250
    assert warm.output_token_ids == cold.output_token_ids

    # Prefilled in chunks, each later one attending over the cache's copy of the earlier.
    chunked = make_real_engine(kv_dtype=kv_dtype, max_num_batched_tokens=100)
    assert chunked.generate([prompt], GREEDY)[0].output_token_ids == cold.output_token_ids

    others = [tokenizer.encode(t) for t in RAW_PROMPTS[:3]]
    batched = make_real_engine(kv_dtype=kv_dtype).generate([*others, prompt], GREEDY)
    assert batched[-1].output_token_ids == cold.output_token_ids

    # Prefill on one engine, the blocks' bytes copied, decode on another.
    prefill_node, decode_node = (make_real_engine(kv_dtype=kv_dtype) for _ in range(2))
    first = prefill(prefill_node, "r", prompt)
    held = prefill_node.held_block_ids("r")
    slot = decode_node.begin_import("r", prompt, first, GREEDY)
    assert held is not None and slot is not None
    copy_blocks(prefill_node, held, decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == cold.output_token_ids


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "fp8_e4m3"])
def test_fused_and_op_by_op_steps_agree_on_a_narrow_cache(
    tokenizer: Tokenizer, make_real_engine: RealEngineFactory, kv_dtype: str
) -> None:
    prompts = [tokenizer.encode(t) for t in RAW_PROMPTS[:4]]
    fused = make_real_engine(kv_dtype=kv_dtype).generate(prompts, GREEDY)
    plain = make_real_engine(kv_dtype=kv_dtype, fused_decode=False).generate(prompts, GREEDY)
    assert [o.output_token_ids for o in fused] == [o.output_token_ids for o in plain]


def test_the_setting_names_the_kv_dtype_and_refuses_others() -> None:
    assert EngineSettings(kv_dtype="bfloat16").kv_dtype == "bfloat16"
    assert EngineSettings(kv_dtype="fp8_e4m3").kv_dtype == "fp8_e4m3"
    # vLLM's alias: one name, so the block hashes of both spellings agree.
    assert EngineSettings(kv_dtype="fp8").kv_dtype == "fp8_e4m3"
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineSettings(kv_dtype="int8")  # type: ignore[arg-type]
