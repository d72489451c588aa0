"""Every family against transformers on the same weights: tiny random models of each, read
from their Hugging Face folder and from a GGUF file llama.cpp's converter wrote from it.

Greedy continuations must be equal token for token (prompts chunked, batched together and
partly served from the prefix cache), and the logits of every prompt position equal within
float tolerance. Prompts reach past every sliding window and rope scaling window the tiny
models set (16 to 64 tokens).

A GGUF file cannot hold everything a folder can: llama.cpp writes no sliding window for the
Llama architecture, no dynamic rope scaling, no ``query_pre_attn_scalar`` (it takes the head
size), no dense layers in a Qwen3-MoE. The GGUF side is therefore compared with transformers
on the folder that file means (``gguf_reference_folder``: the tiny folder with those settings
as llama.cpp reads them), which is the tiny folder itself for the other families.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.config import EngineSettings
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_model
from shared.engine.runner import ModelRunner
from shared.kv.layout import KVLayout
from shared.model.attention import AttentionMetadata, PrefillChunk
from shared.model.decoder import DecoderForCausalLM
from shared.model.files import ModelFiles, resolve_model
from shared.model.kv_cache import PagedKVCache
from shared.sampling_params import SamplingParams
from tests.support.llama_cpp import gguf_reference_folder, tiny_gguf_file
from tests.support.tiny_models import FAMILIES, tiny_model_folder

pytestmark = pytest.mark.slow

NEW_TOKENS = 40
BLOCK_SIZE = 4
PROMPT_LENGTHS = (5, 20, 37, 70)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def _hf_greedy(folder: Path, prompt: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    # A fresh model per prompt: transformers keeps dynamic rope state between calls.
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    generated: list[int] = out[0, len(prompt) :].tolist()
    assert len(generated) == NEW_TOKENS  # nothing stopped it early
    return generated


def _hf_logits(folder: Path, prompt: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits: torch.Tensor = hf(torch.tensor([prompt])).logits[0]
    return logits


def _model(files: ModelFiles) -> DecoderForCausalLM:
    return load_model(EngineSettings(device="cpu"), files)


def _engine(files: ModelFiles, model: DecoderForCausalLM) -> LLMEngine:
    config = files.config
    engine_config = EngineConfig(
        block_size=BLOCK_SIZE,
        num_kv_blocks=512,
        max_model_len=config.context_length,
        max_num_batched_tokens=32,  # long prompts are prefilled in chunks beside decodes
        eos_token_ids=(),
    )
    layout = KVLayout.for_model(config, BLOCK_SIZE, "float32")
    runner = ModelRunner(model, PagedKVCache(layout, engine_config.num_kv_blocks))
    return LLMEngine(runner, engine_config, config.model_id)


def _prefill_logits(model: DecoderForCausalLM, prompt: list[int]) -> torch.Tensor:
    """Logits of every prompt position from one forward over a fresh paged cache."""
    config, n = model.config, len(prompt)
    blocks = -(-n // BLOCK_SIZE)
    cache = PagedKVCache(KVLayout.for_model(config, BLOCK_SIZE, "float32"), blocks)
    positions = torch.arange(n)
    block_ids = torch.arange(blocks)
    rows = cache.token_rows(block_ids.repeat_interleave(BLOCK_SIZE)[:n], positions % BLOCK_SIZE)
    meta = AttentionMetadata(
        slot_rows=cache.rows_by_layer(rows),
        prefills=[PrefillChunk(0, n, n, cache.block_chunks(block_ids))],
    )
    lengths = torch.full((n,), n) if config.rope_depends_on_length else None
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), positions, cache, meta, lengths)
        return model.compute_logits(hidden)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


_EXPECTED: dict[tuple[Path, tuple[int, ...]], list[int]] = {}


def _expected(folder: Path, prompt: list[int]) -> list[int]:
    """transformers' greedy continuation, computed once per folder and prompt."""
    key = (folder, tuple(prompt))
    if key not in _EXPECTED:
        _EXPECTED[key] = _hf_greedy(folder, prompt)
    return _EXPECTED[key]


def _side(family: str, source: str, cache_dir: Path) -> tuple[ModelFiles, Path]:
    """What Crescent loads, and the folder transformers is run on to compare it with."""
    if source == "folder":
        folder = tiny_model_folder(family, cache_dir)
        return resolve_model(folder, cache_dir), folder
    gguf = tiny_gguf_file(family, cache_dir)
    return resolve_model(gguf, cache_dir), gguf_reference_folder(family, cache_dir)


def _fitting_prompts(files: ModelFiles) -> list[list[int]]:
    limit = files.config.context_length - NEW_TOKENS
    return [p for p in _prompts(files.config.vocab_size) if len(p) <= limit]


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_greedy_tokens_equal_transformers(family: str, source: str, cache_dir: Path) -> None:
    files, reference = _side(family, source, cache_dir)
    prompts = _fitting_prompts(files)
    assert len(prompts) >= 2  # a GGUF of llama-dynamic serves 64 tokens (no scaling)
    engine = _engine(files, _model(files))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    assert [out.output_token_ids for out in outputs] == [_expected(reference, p) for p in prompts]
    # Again, shorter prompts that begin like the long ones: their first blocks come from the
    # prefix cache where they were rotated the same way, and are computed anew where not.
    short = [p[:24] for p in prompts[2:]]
    again = engine.generate(short, params)
    assert [out.output_token_ids for out in again] == [_expected(reference, p) for p in short]


@pytest.mark.parametrize("source", ["folder", "gguf"])
def test_logits_equal_transformers(family: str, source: str, cache_dir: Path) -> None:
    files, reference = _side(family, source, cache_dir)
    model = _model(files)
    prompt = _fitting_prompts(files)[-1]
    ours = _prefill_logits(model, prompt)
    theirs = _hf_logits(reference, prompt)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
