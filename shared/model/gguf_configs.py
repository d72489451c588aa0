"""The transformers config.json each GGUF architecture's metadata means.

One reader per ``general.architecture`` (``llama_config`` ... ``phi3_config``), built from the
metadata and from which tensors exist (biases, experts, a separate output head). Settings a
GGUF cannot carry are derived the way llama.cpp's runtime (``src/models/<arch>.cpp``) derives
them, each noted where it happens.
"""

from __future__ import annotations

from typing import Any

from shared.errors import UnsupportedModelError
from shared.model.gguf_meta import GgufMeta
from shared.model.gguf_rope import read_rope


def _layer_has(meta: GgufMeta, kind: str, suffix: str = "weight") -> list[bool]:
    # The converter's --fuse-qkv stores q, k and v (and their biases) as one attn_qkv.
    kinds = (kind, "attn_qkv") if kind in ("attn_q", "attn_k", "attn_v") else (kind,)
    return [
        any(f"blk.{i}.{k}.{suffix}" in meta.tensors for k in kinds)
        for i in range(meta.layer_count())
    ]


def _bias(meta: GgufMeta, kinds: tuple[str, ...], what: str) -> bool:
    """Whether every layer has a bias on each of ``kinds`` (True) or none of them has one;
    transformers has one switch for them all."""
    present = [_layer_has(meta, kind, "bias") for kind in kinds]
    flat = [p for layer in present for p in layer]
    if any(flat) and not all(flat):
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch} {what} biases on some of {', '.join(kinds)} only"
        )
    return all(flat)


def _no_bias(meta: GgufMeta, kinds: tuple[str, ...]) -> None:
    for kind in kinds:
        if any(_layer_has(meta, kind, "bias")):
            raise UnsupportedModelError(f"{meta.source}: {meta.arch} has no {kind} bias")


def _common(meta: GgufMeta, default_context: int = 2048) -> dict[str, Any]:
    hidden = meta.int_value("embedding_length")
    heads = meta.int_value("attention.head_count")
    head_dim = meta.int_value("attention.key_length", hidden // heads)
    if meta.int_value("attention.value_length", head_dim) != head_dim:
        raise UnsupportedModelError(
            f"{meta.source}: value heads of another size than key heads are not supported"
        )
    if "token_embd.weight" not in meta.tensors:
        raise UnsupportedModelError(f"{meta.source}: GGUF file has no token_embd.weight")
    # The embedding's rows are the vocabulary the model computes logits for (Gemma 3's
    # converter trims rows past the tokenizer's).
    vocab = meta.tensors["token_embd.weight"][0]
    meta.mark_read("vocab_size")
    config: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta.int_value("feed_forward_length"),
        "num_hidden_layers": meta.layer_count(),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.int_value("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "max_position_embeddings": meta.int_value("context_length", default_context),
        # Required by llama.cpp for every architecture here.
        "rms_norm_eps": meta.required_float("attention.layer_norm_rms_epsilon"),
        "tie_word_embeddings": "output.weight" not in meta.tensors,
        "dtype": "float32",
    }
    for name in ("bos", "eos", "padding"):
        token = meta.token_id(name)
        if token is not None:
            config["pad_token_id" if name == "padding" else f"{name}_token_id"] = token
    return config


def _no_window(meta: GgufMeta) -> None:
    window = meta.int_value("attention.sliding_window", 0)
    if window:
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch}.attention.sliding_window={window} is not supported"
        )


def _experts_config(meta: GgufMeta, dense_ok: bool) -> dict[str, Any]:
    """Expert count, experts per token and the dense layers of a mixture of experts."""
    count = meta.int_value("expert_count")
    used = meta.int_value("expert_used_count")
    routed = _layer_has(meta, "ffn_gate_inp")
    dense = [i for i, r in enumerate(routed) if not r]
    if dense and not dense_ok:
        raise UnsupportedModelError(f"{meta.source}: layer {dense[0]} has no experts")
    # llama.cpp routes by a softmax over all experts and renormalizes the chosen ones' weights
    # for llama and qwen3moe alike, whatever the file says; a file saying otherwise means a
    # model llama.cpp would run differently from its source.
    gating = meta.value("expert_gating_func")
    norm = meta.value("expert_weights_norm")
    scale = meta.value("expert_weights_scale")
    shared = meta.value("expert_shared_count", 0)
    if gating not in (None, 1) or norm is False or scale not in (None, 0.0, 1.0) or shared:
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch} experts with gating {gating}, weights norm {norm}, "
            f"scale {scale}, {shared} shared experts are not supported"
        )
    meta.mark_read("expert_shared_feed_forward_length")
    return {"count": count, "used": used, "dense": dense}


def _rope_checked(meta: GgufMeta, config: dict[str, Any], partial: bool = False) -> dict[str, Any]:
    if meta.has("rope.freq_base_swa") and meta.value("rope.freq_base_swa") != meta.value(
        "rope.freq_base", 10000.0
    ):
        raise UnsupportedModelError(
            f"{meta.source}: {meta.arch}.rope.freq_base_swa (a rope of its own for sliding "
            "layers) is not supported"
        )
    return read_rope(meta, config["head_dim"], config["max_position_embeddings"], partial)


def llama_config(meta: GgufMeta) -> dict[str, Any]:
    config = _common(meta)
    config["hidden_act"] = "silu"
    config["rope_parameters"] = _rope_checked(meta, config)
    window = meta.int_value("attention.sliding_window", 0)
    if "blk.0.ffn_gate_inp.weight" in meta.tensors:
        # Mixtral: the llama architecture with experts in every layer.
        experts = _experts_config(meta, dense_ok=False)
        _no_bias(meta, ("attn_q", "attn_k", "attn_v", "attn_output"))
        return config | {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_local_experts": experts["count"],
            "num_experts_per_tok": experts["used"],
            "sliding_window": window or None,
        }
    if meta.int_value("expert_count", 0) or meta.int_value("expert_used_count", 0):
        raise UnsupportedModelError(f"{meta.source}: llama experts without expert routers")
    attention_bias = _bias(meta, ("attn_q", "attn_k", "attn_v", "attn_output"), "attention")
    mlp_bias = _bias(meta, ("ffn_gate", "ffn_up", "ffn_down"), "MLP")
    if window:
        # llama.cpp's converter writes no window for Mistral, and its llama runtime attends
        # to the whole context; a file that does name one came from a sliding-window Mistral.
        if attention_bias or mlp_bias:
            raise UnsupportedModelError(f"{meta.source}: Mistral with biases is not supported")
        return config | {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "sliding_window": window,
        }
    return config | {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": attention_bias,
        "mlp_bias": mlp_bias,
    }


def qwen2_config(meta: GgufMeta) -> dict[str, Any]:
    config = _common(meta)
    _no_window(meta)
    if not _bias(meta, ("attn_q", "attn_k", "attn_v"), "attention"):
        raise UnsupportedModelError(f"{meta.source}: qwen2 without q/k/v biases")
    _no_bias(meta, ("attn_output", "ffn_gate", "ffn_up", "ffn_down"))
    return config | {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "rope_parameters": _rope_checked(meta, config),
    }


def qwen3_config(meta: GgufMeta) -> dict[str, Any]:
    config = _common(meta)
    _no_window(meta)
    _no_bias(meta, ("ffn_gate", "ffn_up", "ffn_down"))
    return config | {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "attention_bias": _bias(meta, ("attn_q", "attn_k", "attn_v", "attn_output"), "attention"),
        "rope_parameters": _rope_checked(meta, config),
    }


def qwen3moe_config(meta: GgufMeta) -> dict[str, Any]:
    config = qwen3_config(meta)
    experts = _experts_config(meta, dense_ok=True)
    return config | {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": experts["count"],
        "num_experts_per_tok": experts["used"],
        "moe_intermediate_size": meta.int_value("expert_feed_forward_length"),
        # llama.cpp's qwen3moe always renormalizes the chosen experts' weights.
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": experts["dense"],
    }


def _swa_layers(meta: GgufMeta, every: int) -> list[str]:
    """Layer kinds as llama.cpp sets them: a per-layer list, or "every n-th layer is full"
    from ``attention.sliding_window_pattern`` or the architecture's own ``every``."""
    layers = meta.layer_count()
    pattern = meta.value("attention.sliding_window_pattern", every)
    if isinstance(pattern, list):
        if len(pattern) < layers:
            raise UnsupportedModelError(f"{meta.source}: sliding_window_pattern is too short")
        sliding = [bool(p) for p in pattern[:layers]]
    else:
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


def _gemma_common(meta: GgufMeta, big_layer_count: int) -> dict[str, Any]:
    config = _common(meta, default_context=8192)
    _no_bias(meta, ("ffn_gate", "ffn_up", "ffn_down"))
    # Gemma's attention scale is not in the file: llama.cpp uses 1/sqrt(head size), except
    # for the 27B models, recognised by their layer count, where the query is scaled by
    # hidden size / heads (as their query_pre_attn_scalar says).
    if config["num_hidden_layers"] == big_layer_count:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    else:
        scalar = config["head_dim"]
    return config | {
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": _bias(meta, ("attn_q", "attn_k", "attn_v", "attn_output"), "attention"),
        "query_pre_attn_scalar": scalar,
    }


def gemma2_config(meta: GgufMeta) -> dict[str, Any]:
    config = _gemma_common(meta, big_layer_count=46)
    # Defaults of llama.cpp's gemma2 runtime for what the file may leave out.
    return config | {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        # llama.cpp's gemma2 reads the output head from token_embd, whatever else the file has.
        "tie_word_embeddings": True,
        "attn_logit_softcapping": meta.float_value("attn_logit_softcapping", 50.0),
        "final_logit_softcapping": meta.float_value("final_logit_softcapping", 30.0),
        "sliding_window": meta.int_value("attention.sliding_window", 4096),
        "layer_types": _swa_layers(meta, 2),
        "rope_parameters": _rope_checked(meta, config),
    }


def gemma3_config(meta: GgufMeta) -> dict[str, Any]:
    config = _gemma_common(meta, big_layer_count=62)
    if meta.optional_float("attn_logit_softcapping"):
        raise UnsupportedModelError(f"{meta.source}: gemma3 has no attention logit softcapping")
    window = meta.int_value("attention.sliding_window", 0)
    if window > 0:
        layer_types = _swa_layers(meta, 6)
    else:
        layer_types = ["full_attention"] * config["num_hidden_layers"]
    full = read_rope(meta, config["head_dim"], config["max_position_embeddings"])
    # Sliding layers rotate with their own base and no scaling (llama.cpp's defaults).
    sliding = {"rope_type": "default", "rope_theta": meta.float_value("rope.freq_base_swa", 1e4)}
    return config | {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "final_logit_softcapping": meta.optional_float("final_logit_softcapping"),
        "sliding_window": window if window > 0 else None,
        "layer_types": layer_types,
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
    }


def phi3_config(meta: GgufMeta) -> dict[str, Any]:
    config = _common(meta, default_context=4096)
    _no_bias(meta, ("attn_qkv", "attn_output", "ffn_up", "ffn_down"))
    rope = _rope_checked(meta, config, partial=True)
    window = meta.int_value("attention.sliding_window", 0)
    config |= {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_act": "silu",
        # llama.cpp's phi3 runtime ignores the window for now; transformers applies it, and
        # the value is the source config's.
        "sliding_window": window or None,
        "rope_parameters": rope,
    }
    if "original_max_position_embeddings" in rope:
        config["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    return config
