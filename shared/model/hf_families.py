"""The families a Hugging Face ``config.json`` can belong to, and each one's small reader.

A ``Family`` names the architectures and ``model_type`` values it answers to, the keys it
reads beyond the common ones, and a reader turning those keys into ``ModelConfig`` fields;
a value Crescent does not implement is refused with ``UnsupportedModelError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.errors import UnsupportedModelError
from shared.model.config import MoeSpec


def words(text: str) -> frozenset[str]:
    return frozenset(text.split())


@dataclass(frozen=True, slots=True)
class Family:
    """How one family's config is read: the architecture names and ``model_type`` values it
    answers to, the keys it reads beyond the common ones, and its reader."""

    name: str
    architectures: tuple[str, ...]
    model_types: tuple[str, ...]
    keys: frozenset[str]
    read: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def int_key(d: dict[str, Any], key: str, default: int | None = None) -> int:
    value = d.get(key, default)
    if value is None:
        raise UnsupportedModelError(f"config.json has no {key!r}")
    return int(value)


def hidden_act(d: dict[str, Any], key: str, default: str) -> str:
    act = d.get(key) or default
    if act not in ("silu", "gelu_pytorch_tanh"):
        raise UnsupportedModelError(
            f"{key}={act!r} is not supported; supported: 'silu', 'gelu_pytorch_tanh'"
        )
    return str(act)


def _windows(d: dict[str, Any], layers: int, default_types: list[str]) -> tuple[int | None, ...]:
    """Per-layer sliding windows from ``layer_types`` (or the family's default pattern)."""
    window = d.get("sliding_window")
    types = d.get("layer_types") or default_types
    if len(types) != layers:
        raise UnsupportedModelError(f"layer_types has {len(types)} entries for {layers} layers")
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise UnsupportedModelError(f"layer_types {unknown} are not supported")
    if window is None:
        return ()
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def _all_sliding(d: dict[str, Any], layers: int) -> list[str]:
    return ["sliding_attention" if d.get("sliding_window") else "full_attention"] * layers


def _qwen_types(d: dict[str, Any], layers: int) -> list[str]:
    # Qwen 2/3 slide only with use_sliding_window, and only from layer max_window_layers on.
    if not d.get("use_sliding_window"):
        return ["full_attention"] * layers
    first = int(d.get("max_window_layers") or 0)
    return ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]


def _llama(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    bias = bool(d.get("attention_bias"))
    return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": bool(d.get("mlp_bias"))}


def _mistral(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {"layer_windows": _windows(d, base["num_layers"], _all_sliding(d, base["num_layers"]))}


def _mixtral(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    layers = base["num_layers"]
    moe = MoeSpec(
        num_experts=int_key(d, "num_local_experts"),
        top_k=int_key(d, "num_experts_per_tok"),
        intermediate_size=base["intermediate_size"],
        norm_topk_prob=True,
        sparse_layers=(True,) * layers,
    )
    return {**_mistral(d, base), "moe": moe}


def _qwen2(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    layers = base["num_layers"]
    return {"qkv_bias": True, "layer_windows": _windows(d, layers, _qwen_types(d, layers))}


def _qwen3(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    layers = base["num_layers"]
    bias = bool(d.get("attention_bias"))
    return {
        "qkv_bias": bias,
        "o_bias": bias,
        "qk_norm": True,
        "layer_windows": _windows(d, layers, _qwen_types(d, layers)),
    }


def _qwen3_moe(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    layers = base["num_layers"]
    experts = d.get("num_experts", d.get("num_local_experts"))
    step = int(d.get("decoder_sparse_step") or 1)
    dense = set(d.get("mlp_only_layers") or [])
    moe = MoeSpec(
        num_experts=int(experts or 0),
        top_k=int_key(d, "num_experts_per_tok"),
        intermediate_size=int_key(d, "moe_intermediate_size"),
        norm_topk_prob=bool(d.get("norm_topk_prob")),
        sparse_layers=tuple(
            bool(experts) and i not in dense and (i + 1) % step == 0 for i in range(layers)
        ),
    )
    return {**_qwen3(d, base), "moe": moe if any(moe.sparse_layers) else None}


def _gemma(d: dict[str, Any], base: dict[str, Any], default_types: list[str]) -> dict[str, Any]:
    if d.get("use_bidirectional_attention"):
        raise UnsupportedModelError("use_bidirectional_attention=true is not supported")
    bias = bool(d.get("attention_bias"))
    scalar = d.get("query_pre_attn_scalar")
    return {
        "qkv_bias": bias,
        "o_bias": bias,
        "hidden_act": hidden_act(d, "hidden_activation", "gelu_pytorch_tanh"),
        "sandwich_norms": True,
        "norm_weight_offset": 1.0,
        "embedding_scale": base["hidden_size"] ** 0.5,
        "attention_scale": None if scalar is None else float(scalar) ** -0.5,
        "attn_logit_softcap": d.get("attn_logit_softcapping"),
        "final_logit_softcap": d.get("final_logit_softcapping"),
        "layer_windows": _windows(d, base["num_layers"], default_types),
    }


def _gemma2(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    layers = base["num_layers"]
    pattern = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    return _gemma(d, base, pattern)


def gemma3_layer_types(d: dict[str, Any], layers: int) -> list[str]:
    """Gemma 3's layer types: as listed, else one full layer after every few sliding ones."""
    if d.get("layer_types"):
        return list(d["layer_types"])
    every = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6)
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)]


def _gemma3(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    pattern = gemma3_layer_types(d, base["num_layers"])
    return {**_gemma(d, base, pattern), "qk_norm": True}


def _phi3(d: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    return {
        "layer_windows": _windows(d, base["num_layers"], _all_sliding(d, base["num_layers"])),
        "rope_restarts_past_window": True,
    }


_QWEN = words("use_sliding_window sliding_window max_window_layers layer_types attention_bias")
_GEMMA = words(
    "hidden_activation query_pre_attn_scalar attn_logit_softcapping final_logit_softcapping "
    "sliding_window layer_types attention_bias use_bidirectional_attention"
)
FAMILIES: tuple[Family, ...] = (
    Family("llama", ("LlamaForCausalLM",), ("llama",), words("attention_bias mlp_bias"), _llama),
    Family(
        "mistral",
        ("MistralForCausalLM",),
        ("mistral",),
        words("sliding_window layer_types"),
        _mistral,
    ),
    Family(
        "mixtral",
        ("MixtralForCausalLM",),
        ("mixtral",),
        words("sliding_window layer_types num_local_experts num_experts_per_tok"),
        _mixtral,
    ),
    Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), _QWEN, _qwen2),
    Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), _QWEN, _qwen3),
    Family(
        "qwen3_moe",
        ("Qwen3MoeForCausalLM",),
        ("qwen3_moe",),
        _QWEN
        | words(
            "num_experts num_local_experts num_experts_per_tok moe_intermediate_size "
            "norm_topk_prob decoder_sparse_step mlp_only_layers"
        ),
        _qwen3_moe,
    ),
    Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), _GEMMA, _gemma2),
    Family(
        "gemma3",
        ("Gemma3ForCausalLM",),
        ("gemma3_text",),
        _GEMMA | words("sliding_window_pattern _sliding_window_pattern rope_local_base_freq"),
        _gemma3,
    ),
    Family(
        "phi3",
        ("Phi3ForCausalLM",),
        ("phi3",),
        words("sliding_window layer_types original_max_position_embeddings"),
        _phi3,
    ),
)
DEFAULT_HEAD_DIMS = {"qwen3": 128, "qwen3_moe": 128, "gemma2": 256, "gemma3": 256}
TIED_BY_DEFAULT = ("gemma2", "gemma3")
