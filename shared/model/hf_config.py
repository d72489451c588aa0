"""Reads a Hugging Face ``config.json`` into a ``ModelConfig`` through its family's reader.

Every key of the file must be understood: either a reader uses it, or it is known to change
nothing at inference (``INERT_KEYS``). Anything else, and any value Crescent does not
implement, is refused with ``UnsupportedModelError`` naming it; nothing falls back to Llama.
"""

from __future__ import annotations

from typing import Any

from shared.errors import UnsupportedModelError
from shared.model.config import ModelConfig
from shared.model.hf_families import (
    DEFAULT_HEAD_DIMS,
    FAMILIES,
    TIED_BY_DEFAULT,
    Family,
    gemma3_layer_types,
    hidden_act,
    int_key,
    words,
)
from shared.model.hf_rope import read_ropes

# Keys of any transformers config that do not change what a forward pass computes: training
# settings, generation defaults (the engine takes those per request) and bookkeeping.
INERT_KEYS = words(
    """
    architectures model_type transformers_version dtype torch_dtype use_cache initializer_range
    attention_dropout pad_token_id bos_token_id eos_token_id _name_or_path output_attentions
    output_hidden_states return_dict is_decoder is_encoder_decoder add_cross_attention
    tokenizer_class id2label label2id problem_type chunk_size_feed_forward pruned_heads
    torchscript use_bfloat16 tf_legacy_loss finetuning_task prefix sep_token_id
    decoder_start_token_id task_specific_params cross_attention_hidden_size tie_encoder_decoder
    max_length min_length do_sample early_stopping num_beams temperature top_k top_p typical_p
    repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size
    bad_words_ids num_return_sequences output_scores return_dict_in_generate forced_bos_token_id
    forced_eos_token_id remove_invalid_values exponential_decay_length_penalty suppress_tokens
    begin_suppress_tokens diversity_penalty num_beam_groups auto_map model_name embd_pdrop
    resid_pdrop router_aux_loss_coef output_router_logits router_jitter_noise pretraining_tp
    cache_implementation router_z_loss_coef crescent_model_id
    """
)
# Keys every family reads the same way.
_COMMON_KEYS = words(
    """
    vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads
    num_key_value_heads head_dim max_position_embeddings rms_norm_eps tie_word_embeddings
    hidden_act rope_theta rope_scaling rope_parameters partial_rotary_factor
    """
)


def supported_architectures() -> list[str]:
    return [arch for family in FAMILIES for arch in family.architectures]


def find_family(d: dict[str, Any]) -> Family:
    """The family of a config, from ``architectures`` (or ``model_type`` where it has none)."""
    architectures = d.get("architectures") or []
    supported = ", ".join(supported_architectures())
    if architectures:
        arch = architectures[0]
        for family in FAMILIES:
            if arch in family.architectures:
                return family
        raise UnsupportedModelError(f"{arch} is not supported; supported: {supported}")
    model_type = d.get("model_type")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise UnsupportedModelError(
        f"model_type {model_type!r} is not supported; supported: {supported}"
    )


def _check_words(d: dict[str, Any], family: Family) -> None:
    if d.get("quantization_config"):
        method = (d["quantization_config"] or {}).get("quant_method", "unknown")
        raise UnsupportedModelError(
            f"quantization_config ({method}) is not supported: serve a GGUF file of the model, "
            "or its unquantized Hugging Face folder"
        )
    unknown = sorted(set(d) - INERT_KEYS - _COMMON_KEYS - family.keys - {"quantization_config"})
    if unknown:
        raise UnsupportedModelError(
            f"{family.architectures[0]} config field {unknown[0]!r} is not supported"
            + (f" (nor {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else "")
        )


def _eos_ids(d: dict[str, Any]) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if isinstance(eos, list):
        return tuple(int(e) for e in eos)
    return () if eos is None else (int(eos),)


def read_hf_config(d: dict[str, Any], model_id: str) -> ModelConfig:
    """The ``ModelConfig`` of a Hugging Face config dict, or ``UnsupportedModelError``."""
    family = find_family(d)
    _check_words(d, family)
    heads = int_key(d, "num_attention_heads")
    hidden = int_key(d, "hidden_size")
    head_dim = int(d.get("head_dim") or DEFAULT_HEAD_DIMS.get(family.name) or hidden // heads)
    base: dict[str, Any] = {
        "model_id": model_id,
        "architecture": family.architectures[0],
        "vocab_size": int_key(d, "vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": int_key(d, "intermediate_size", 0),
        "num_layers": int_key(d, "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": int(d.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "max_position_embeddings": int_key(d, "max_position_embeddings", 2048),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", family.name in TIED_BY_DEFAULT)),
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_ids": _eos_ids(d),
    }
    # Gemma's MLP reads hidden_activation (its reader sets it); hidden_act is a leftover there.
    if not family.name.startswith("gemma"):
        base["hidden_act"] = hidden_act(d, "hidden_act", "silu")
    base |= family.read(d, base)
    types = gemma3_layer_types(d, base["num_layers"]) if family.name == "gemma3" else None
    rope = read_ropes(d, base, types)
    return ModelConfig(**(base | rope))
