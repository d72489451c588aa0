"""Tiny random-weight Hugging Face folders of every model family Crescent serves.

Each family is built once, offline and deterministically, with transformers itself
(``save_pretrained``: config.json and tensor names exactly as transformers writes them), and
cached under ``<cache_dir>/tiny-models/<name>-v<version>``. Every setting that distinguishes a
family is set away from its default so that getting it wrong changes the logits.

Weights are redrawn from a seeded generator at scales that keep the logits well apart (the
default initializer, std 0.02, gives nearly flat logits and ties in greedy decoding):
matrices and routers N(0, 1/sqrt(fan_in)), an untied output head N(0, 4/sqrt(hidden)),
embeddings N(0, 1) (tied ones at a head's scale, see ``_draw``), norms 1 + U(-0.5, 0.5) (Gemma
stores the offset only: U(-0.5, 0.5)), biases N(0, 0.1).

Tokenizers: every family but Gemma 2 carries SmolLM2's BPE tokenizer (the default model's,
49,152 tokens). llama.cpp's converter reads Gemma 2's vocabulary only from a sentencepiece
``tokenizer.model``, so Gemma 2 gets a small sentencepiece model trained here, deterministically,
on text drawn from SmolLM2's vocabulary; its ``tokenizer.json`` is transformers' conversion of
it, so both files describe the same vocabulary, and ``vocab_size`` is its size.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from shared.model.files import build_folder_once
from tests.support import tiny_tokenizers
from tests.support.tiny_tokenizers import GEMMA_BOS, GEMMA_EOS, GEMMA_PAD, GEMMA_VOCAB

# Part of every folder's name: changing a recipe below must bump it so caches rebuild.
TINY_MODELS_VERSION = 1

FAMILIES: tuple[str, ...] = (
    "llama",
    "llama3",
    "llama-linear",
    "llama-dynamic",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3-moe",
    "mixtral",
    "gemma2",
    "gemma3",
    "phi3",
)

SMOLLM_VOCAB = 49152
SMOLLM_BOS, SMOLLM_EOS = 1, 2  # <|im_start|>, <|im_end|>
_SIZES: dict[str, Any] = {
    "vocab_size": SMOLLM_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "bos_token_id": SMOLLM_BOS,
    "eos_token_id": SMOLLM_EOS,
    "pad_token_id": None,
}


def _llama(**extra: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**(_SIZES | {"num_hidden_layers": 2, "tie_word_embeddings": False} | extra))


def _llama_plain() -> Any:
    return _llama(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _llama3() -> Any:
    # theta 1e4 over 16 dims puts two frequencies between the high and the low wavelength
    # bounds (16 and 64), so the smoothed band of llama3 scaling is exercised too.
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return _llama(rope_parameters=rope, tie_word_embeddings=True, max_position_embeddings=512)


def _llama_linear() -> Any:
    rope = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    return _llama(rope_parameters=rope, attention_bias=True, mlp_bias=True)


def _llama_dynamic() -> Any:
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    return _llama(rope_parameters=rope, max_position_embeddings=64)


def _mistral() -> Any:
    from transformers import MistralConfig

    return MistralConfig(
        **(_SIZES | {"num_hidden_layers": 2, "sliding_window": 16, "tie_word_embeddings": False})
    )


def _mixtral() -> Any:
    from transformers import MixtralConfig

    extra = {"num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2}
    return MixtralConfig(**(_SIZES | extra | {"sliding_window": None}))


def _qwen2() -> Any:
    from transformers import Qwen2Config

    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    extra = {"num_hidden_layers": 2, "tie_word_embeddings": True, "max_position_embeddings": 256}
    return Qwen2Config(**(_SIZES | extra), rope_parameters=rope)


def _qwen3() -> Any:
    from transformers import Qwen3Config

    # head_dim 32 while hidden / heads is 16: projections are wider than the residual stream.
    extra = {"num_hidden_layers": 2, "head_dim": 32, "tie_word_embeddings": False}
    return Qwen3Config(**(_SIZES | extra))


#: Qwen3-MoE's expert settings, shared by the mixed and the all-sparse variants.
_QWEN3_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "moe_intermediate_size": 32,
    "tie_word_embeddings": False,
}


def _qwen3_moe() -> Any:
    from transformers import Qwen3MoeConfig

    extra = _QWEN3_MOE | {"num_hidden_layers": 3, "mlp_only_layers": [1]}
    return Qwen3MoeConfig(**(_SIZES | extra))


def _qwen3_moe_sparse() -> Any:
    from transformers import Qwen3MoeConfig

    # llama.cpp's qwen3moe has no dense layers (its converter cannot map their tensors), so
    # GGUF files of Qwen3-MoE are written from this variant: every layer sparse.
    return Qwen3MoeConfig(**(_SIZES | _QWEN3_MOE | {"num_hidden_layers": 2}))


def _gemma2() -> Any:
    from transformers import Gemma2Config

    extra = {
        "vocab_size": GEMMA_VOCAB,
        "bos_token_id": GEMMA_BOS,
        "eos_token_id": GEMMA_EOS,
        "pad_token_id": GEMMA_PAD,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 16,
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": 3.0,
        "query_pre_attn_scalar": 24,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    }
    return Gemma2Config(**(_SIZES | extra))


def _gemma3() -> Any:
    from transformers import Gemma3TextConfig

    # llama.cpp reads Gemma 3's layer kinds as "every sixth layer is full" (the GGUF has no
    # field for them), so six layers with the last full keep a GGUF of this model faithful.
    rope = {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    }
    extra = {
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "sliding_window": 16,
        "query_pre_attn_scalar": 24,
        "rope_parameters": rope,
        "tie_word_embeddings": True,
    }
    return Gemma3TextConfig(**(_SIZES | extra))


def _phi3() -> Any:
    from transformers import Phi3Config

    # Rotary dims 8 (half of head_dim 16), so 4 factors each; multiples of 1/8 are exact in
    # float32, so a GGUF (which stores them as float32) carries them unchanged.
    rope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0, 1.125, 1.5, 2.25],
        "long_factor": [1.25, 2.5, 5.0, 9.75],
        "original_max_position_embeddings": 32,
    }
    extra = {
        "num_hidden_layers": 2,
        "max_position_embeddings": 256,
        "original_max_position_embeddings": 32,
        "tie_word_embeddings": False,
        "sliding_window": None,
    }
    return Phi3Config(**(_SIZES | extra), rope_parameters=rope)


_CONFIGS: dict[str, Callable[[], Any]] = {
    "llama": _llama_plain,
    "llama3": _llama3,
    "llama-linear": _llama_linear,
    "llama-dynamic": _llama_dynamic,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3-moe": _qwen3_moe,
    "mixtral": _mixtral,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "phi3": _phi3,
    "qwen3-moe-sparse": _qwen3_moe_sparse,
}
# Built on request like the families, but not one of them: see _qwen3_moe_sparse.
VARIANTS: tuple[str, ...] = ("qwen3-moe-sparse",)


def hf_config(name: str) -> Any:
    """The transformers config of family ``name`` (before any weights exist)."""
    if name not in _CONFIGS:
        known = ", ".join(FAMILIES + VARIANTS)
        raise KeyError(f"unknown tiny model {name!r}; known: {known}")
    return _CONFIGS[name]()


def tiny_model_folder(name: str, cache_dir: Path) -> Path:
    """The folder of family ``name``, built on first use; readers only ever see it whole."""
    config = hf_config(name)
    folder = cache_dir / "tiny-models" / f"{name}-v{TINY_MODELS_VERSION}"
    return build_folder_once(folder, lambda tmp: _build(name, config, tmp, cache_dir))


def _build(name: str, config: Any, out: Path, cache_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    # The initializer's draws are all replaced below; only shapes and names matter here.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    redraw_weights(model, seed=zlib.crc32(name.encode()), gemma=name.startswith("gemma"))
    model.save_pretrained(out)
    if name == "gemma2":
        tiny_tokenizers.write_sentencepiece_tokenizer(out, tiny_tokenizers.smollm_folder(cache_dir))
    else:
        tiny_tokenizers.copy_smollm_tokenizer(out, tiny_tokenizers.smollm_folder(cache_dir))
    if config.model_type == "qwen2":
        tiny_tokenizers.resave_tokenizer(out)
    tiny_tokenizers.drop_loading_state(out / "tokenizer_config.json")


# A tied embedding is the output head too, so it is drawn at a head's scale, times this. Any
# larger, and the input embedding dominates the residual stream, so that greedy decoding keeps
# repeating the last token; Gemma multiplies its input by sqrt(hidden), hence smaller factors
# there (chosen by measuring greedy runs: distinct tokens and top-2 logit gaps).
_TIED_SCALE = {"gemma2": 0.5, "gemma3_text": 0.7}


def redraw_weights(model: Any, seed: int, gemma: bool) -> None:
    """Replaces every parameter with a seeded draw at a scale that keeps logits apart."""
    gen = torch.Generator().manual_seed(seed)
    config = model.config
    tied = _TIED_SCALE.get(config.model_type, 1.0) if config.tie_word_embeddings else None
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            param.copy_(_draw(name, tuple(param.shape), gen, gemma, tied))


def _draw(
    name: str, shape: tuple[int, ...], gen: torch.Generator, gemma: bool, tied: float | None
) -> torch.Tensor:
    if name.endswith("embed_tokens.weight") and tied is not None:
        return torch.randn(shape, generator=gen) * tied / shape[-1] ** 0.5
    if name.endswith("embed_tokens.weight"):
        return torch.randn(shape, generator=gen)
    if name == "lm_head.weight":
        # Four times a matrix's scale: logits spread over a few units, so the best two
        # are rarely within numerical noise of each other (measured: top-2 gaps below 1e-3 in
        # about one greedy step in 300).
        return torch.randn(shape, generator=gen) * 4.0 / shape[-1] ** 0.5
    if name.endswith("norm.weight"):
        offset = torch.rand(shape, generator=gen) - 0.5
        if gemma:
            # Gemma computes x * (1 + w); llama.cpp's converter stores 1 + w. A w on a grid of
            # 2^-20 keeps 1 + w exact in float32, as it is for real bf16 checkpoints, so a GGUF
            # round trip gives back the very same w.
            return torch.round(offset * 2.0**20) / 2.0**20
        return 1.0 + offset
    if name.endswith(".bias"):
        return torch.randn(shape, generator=gen) * 0.1
    # Linear weights [out, in] and fused expert weights [experts, out, in]: fan_in is last.
    return torch.randn(shape, generator=gen) / shape[-1] ** 0.5
