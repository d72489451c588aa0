"""What each GGUF architecture means in Hugging Face terms: its config.json and tensor names.

One ``ArchSpec`` per ``general.architecture`` Crescent reads. Its ``config`` (a reader in
``gguf_configs``) builds the transformers config dict from the metadata; ``layer_names`` map
llama.cpp's per-layer tensor names to transformers'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.errors import UnsupportedModelError
from shared.model import gguf_configs
from shared.model.gguf_meta import GgufMeta

_ATTENTION = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
}
_MLP = {"ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# Gemma's four norms around attention and MLP ("sandwich" norms).
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_PHI3 = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    # Phi-3's fused gate and up projections: llama.cpp keeps them fused as ffn_up.
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


@dataclass(frozen=True, slots=True)
class Experts:
    """Where a mixture of experts' tensors go: the router, and each expert's gate, up and
    down projections (``{e}`` is the expert's index)."""

    router: str
    gate: str
    up: str
    down: str


_MIXTRAL_EXPERTS = Experts(
    router="block_sparse_moe.gate",
    gate="block_sparse_moe.experts.{e}.w1",
    up="block_sparse_moe.experts.{e}.w3",
    down="block_sparse_moe.experts.{e}.w2",
)
_QWEN_EXPERTS = Experts(
    router="mlp.gate",
    gate="mlp.experts.{e}.gate_proj",
    up="mlp.experts.{e}.up_proj",
    down="mlp.experts.{e}.down_proj",
)


@dataclass(frozen=True, slots=True)
class ArchSpec:
    """How to read one GGUF architecture.

    ``layer_names``: llama.cpp's per-layer tensor names (without ``blk.N.`` and the
    ``.weight``/``.bias`` suffix) to transformers' (without ``model.layers.N.``).
    ``permute_qk``: the converter reordered q/k rows for llama.cpp's rope (llama only).
    ``norm_offset``: the converter stored norm weights plus this (Gemma's ``1 + w``).
    ``experts``: where expert tensors go; None when the architecture has none.
    """

    name: str
    layer_names: dict[str, str]
    config: Callable[[GgufMeta], dict[str, Any]]
    permute_qk: bool = False
    norm_offset: float = 0.0
    experts: Callable[[dict[str, Any]], Experts | None] = field(default=lambda c: None)


ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec(
        "llama",
        _ATTENTION | _MLP | _NORMS,
        gguf_configs.llama_config,
        permute_qk=True,
        experts=lambda c: _MIXTRAL_EXPERTS if c["model_type"] == "mixtral" else None,
    ),
    "qwen2": ArchSpec("qwen2", _ATTENTION | _MLP | _NORMS, gguf_configs.qwen2_config),
    "qwen3": ArchSpec("qwen3", _ATTENTION | _MLP | _NORMS | _QK_NORMS, gguf_configs.qwen3_config),
    "qwen3moe": ArchSpec(
        "qwen3moe",
        _ATTENTION | _MLP | _NORMS | _QK_NORMS,
        gguf_configs.qwen3moe_config,
        experts=lambda c: _QWEN_EXPERTS,
    ),
    "gemma2": ArchSpec(
        "gemma2", _ATTENTION | _MLP | _GEMMA_NORMS, gguf_configs.gemma2_config, norm_offset=1.0
    ),
    "gemma3": ArchSpec(
        "gemma3",
        _ATTENTION | _MLP | _GEMMA_NORMS | _QK_NORMS,
        gguf_configs.gemma3_config,
        norm_offset=1.0,
    ),
    "phi3": ArchSpec("phi3", _PHI3 | _NORMS, gguf_configs.phi3_config),
}


def arch_spec(meta: GgufMeta) -> ArchSpec:
    """The spec of the file's architecture, or ``UnsupportedModelError`` listing them."""
    spec = ARCHS.get(meta.arch)
    if spec is None:
        raise UnsupportedModelError(
            f"{meta.source}: GGUF architecture {meta.arch!r} is not supported; supported: "
            + ", ".join(ARCHS)
        )
    return spec


def hf_config(meta: GgufMeta) -> tuple[ArchSpec, dict[str, Any]]:
    """The architecture's spec and the transformers config dict the file means; refuses
    metadata of the architecture that no reader understood."""
    spec = arch_spec(meta)
    config = spec.config(meta)
    unread = meta.unread_keys()
    if unread:
        raise UnsupportedModelError(
            f"{meta.source}: GGUF metadata {unread[0]!r} is not supported"
            + (f" (nor {', '.join(map(repr, unread[1:]))})" if len(unread) > 1 else "")
        )
    return spec, config
