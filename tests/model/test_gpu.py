"""The engine on CUDA in half precision; skipped on machines without a GPU."""

from __future__ import annotations

import pytest
import torch

from shared.config import EngineSettings
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_model
from shared.engine.runner import ModelRunner
from shared.kv.layout import KVLayout
from shared.model.files import ModelFiles
from shared.model.kv_cache import PagedKVCache
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_engine_on_cuda(
    model_files: ModelFiles, tokenizer: Tokenizer, dtype: str
) -> None:
    model = load_model(EngineSettings(device="cuda", dtype=dtype), model_files)
    config = EngineConfig(
        num_kv_blocks=256, kv_dtype=dtype, eos_token_ids=model_files.config.eos_token_ids
    )
    layout = KVLayout.for_model(model_files.config, config.block_size, dtype)
    runner = ModelRunner(model, PagedKVCache(layout, config.num_kv_blocks, "cuda"))
    engine = LLMEngine(runner, config, model_files.config.model_id)

    prompt = tokenizer.apply_chat_template(QUESTION)
    answer = engine.generate([prompt], SamplingParams(max_tokens=32, temperature=0.0))[0]
    assert "Paris" in tokenizer.decode(answer.output_token_ids)

    again = engine.generate([prompt], SamplingParams(max_tokens=32, temperature=0.0))[0]
    assert again.num_cached_tokens == (len(prompt) - 1) // 32 * 32 > 0
    assert "Paris" in tokenizer.decode(again.output_token_ids)

    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=5, ignore_eos=True)
    batch = engine.generate([prompt, prompt[:20], prompt[:7]], seeded)
    assert [len(o.output_token_ids) for o in batch] == [16, 16, 16]
