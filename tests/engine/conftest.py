"""A tiny random Llama for engine tests that exercise scheduling rather than language."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.runner import ModelRunner
from shared.kv.layout import KVLayout
from shared.model.build import build_model
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache

TINY = ModelConfig(
    model_id="tiny-llama",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_ids=(2,),
)


def tiny_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under Hugging Face names, scaled so logits are not flat."""
    gen = torch.Generator().manual_seed(seed)
    c = TINY
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.2

    weights = {
        "model.embed_tokens.weight": w(c.vocab_size, c.hidden_size),
        "model.norm.weight": torch.ones(c.hidden_size),
        "lm_head.weight": w(c.vocab_size, c.hidden_size),
    }
    for i in range(c.num_layers):
        p = f"model.layers.{i}"
        weights |= {
            f"{p}.self_attn.q_proj.weight": w(q, c.hidden_size),
            f"{p}.self_attn.k_proj.weight": w(kv, c.hidden_size),
            f"{p}.self_attn.v_proj.weight": w(kv, c.hidden_size),
            f"{p}.self_attn.o_proj.weight": w(c.hidden_size, q),
            f"{p}.mlp.gate_proj.weight": w(c.intermediate_size, c.hidden_size),
            f"{p}.mlp.up_proj.weight": w(c.intermediate_size, c.hidden_size),
            f"{p}.mlp.down_proj.weight": w(c.hidden_size, c.intermediate_size),
            f"{p}.input_layernorm.weight": torch.ones(c.hidden_size),
            f"{p}.post_attention_layernorm.weight": torch.ones(c.hidden_size),
        }
    return weights


EngineFactory = Callable[..., LLMEngine]


@pytest.fixture(scope="session")
def tiny_model() -> torch.nn.Module:
    return build_model(TINY, tiny_weights())


@pytest.fixture
def make_engine(tiny_model: torch.nn.Module) -> EngineFactory:
    """Builds a fresh engine (own pool and KV tensor) around the shared tiny model."""

    def make(**overrides: object) -> LLMEngine:
        config = EngineConfig(
            **{
                "block_size": 4,
                "num_kv_blocks": 64,
                "max_model_len": 1024,
                "eos_token_ids": (2,),
                **overrides,
            }
        )  # type: ignore[arg-type]
        layout = KVLayout.for_model(TINY, config.block_size, "float32")
        runner = ModelRunner(tiny_model, PagedKVCache(layout, config.num_kv_blocks))  # type: ignore[arg-type]
        return LLMEngine(runner, config, TINY.model_id)

    return make
