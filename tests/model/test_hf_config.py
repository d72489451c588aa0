"""Reading config.json family by family, refusing what Crescent does not implement by name,
and the rope kinds' frequencies against transformers' own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.errors import UnsupportedModelError
from shared.model.files import resolve_model
from shared.model.hf_config import read_hf_config
from shared.model.rope import dynamic_inverse_frequencies, inverse_frequencies

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}


def _refused(config: dict[str, Any], *names: str) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        read_hf_config(config, "m")
    message = str(info.value)
    for name in names:
        assert name in message
    return message


def test_an_unsupported_architecture_is_named_with_the_supported_ones() -> None:
    message = _refused(LLAMA | {"architectures": ["Qwen2MoeForCausalLM"]}, "Qwen2MoeForCausalLM")
    for supported in ("LlamaForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM"):
        assert supported in message


def test_an_unsupported_model_type_is_named() -> None:
    config = {k: v for k, v in LLAMA.items() if k != "architectures"} | {"model_type": "gpt2"}
    _refused(config, "'gpt2'")


def test_a_config_field_nothing_reads_is_named() -> None:
    _refused(LLAMA | {"use_magic_attention": True}, "LlamaForCausalLM", "'use_magic_attention'")


def test_a_field_of_another_family_is_refused() -> None:
    # Llama has no soft-capping: a config asking for it must not be served as if it had none.
    _refused(LLAMA | {"final_logit_softcapping": 30.0}, "'final_logit_softcapping'")


@pytest.mark.parametrize(
    ("rope", "name"),
    [
        ({"rope_type": "mrope", "rope_theta": 1e4}, "'mrope'"),
        ({"rope_type": "yarn", "factor": 2.0, "mrope_section": [1, 2]}, "'mrope_section'"),
    ],
)
def test_unsupported_rope_settings_are_named(rope: dict[str, Any], name: str) -> None:
    _refused(LLAMA | {"rope_parameters": rope}, name)


def test_unsupported_values_are_named() -> None:
    _refused(LLAMA | {"hidden_act": "relu"}, "'relu'")
    _refused(LLAMA | {"quantization_config": {"quant_method": "awq"}}, "awq")
    gemma = LLAMA | {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}
    _refused(gemma | {"use_bidirectional_attention": True}, "use_bidirectional_attention")


def test_a_folder_with_an_unsupported_config_is_refused_at_resolve(tmp_path: Path) -> None:
    folder = tmp_path / "phi-moe"
    folder.mkdir()
    config = LLAMA | {"architectures": ["PhimoeForCausalLM"], "model_type": "phimoe"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedModelError, match="PhimoeForCausalLM is not supported"):
        resolve_model(folder, tmp_path / "cache")


def test_family_features_are_read() -> None:
    gemma2 = read_hf_config(
        LLAMA
        | {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 8,
        },
        "g",
    )
    assert gemma2.sandwich_norms and gemma2.norm_weight_offset == 1.0
    assert gemma2.embedding_scale == pytest.approx(8.0)
    assert gemma2.attention_scale == pytest.approx(24**-0.5)
    assert gemma2.layer_windows == (8, None)  # Gemma 2 alternates, sliding first
    assert gemma2.tie_word_embeddings and gemma2.hidden_act == "gelu_pytorch_tanh"
    qwen2 = read_hf_config(
        LLAMA
        | {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "use_sliding_window": True,
            "max_window_layers": 1,
            "sliding_window": 32,
        },
        "q",
    )
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.layer_windows == (None, 32)


def _transformers_config(kind: str, **params: Any) -> Any:
    from transformers import LlamaConfig

    rope = {"rope_type": kind, "rope_theta": 10000.0, **params}
    return LlamaConfig(
        hidden_size=256, num_attention_heads=4, max_position_embeddings=512, rope_parameters=rope
    )


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("linear", {"factor": 2.0}),
        ("llama3", {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}),
        ("yarn", {"factor": 4.0, "original_max_position_embeddings": 128}),
        ("yarn", {"factor": 4.0, "original_max_position_embeddings": 128, "mscale": 2.0,
                  "mscale_all_dim": 1.0, "beta_fast": 16, "truncate": False}),
        ("longrope", {"short_factor": [1.0 + i / 32 for i in range(32)],
                      "long_factor": [2.0 + i / 8 for i in range(32)],
                      "original_max_position_embeddings": 128}),
    ],
)  # fmt: skip
def test_rope_frequencies_equal_transformers(kind: str, params: dict[str, Any]) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = _transformers_config(kind, **params)
    spec = read_hf_config(hf_config.to_dict(), "m").rope_specs[0]
    theirs, their_factor = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")
    ours, our_factor = inverse_frequencies(spec)
    assert torch.equal(ours, theirs) and our_factor == pytest.approx(their_factor)
    if kind == "longrope":
        long_theirs, _ = ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu", seq_len=129)
        assert torch.equal(inverse_frequencies(spec, long=True)[0], long_theirs)


def test_dynamic_frequencies_equal_transformers_at_each_length() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = _transformers_config("dynamic", factor=2.0)
    spec = read_hf_config(hf_config.to_dict(), "m").rope_specs[0]
    lengths = torch.tensor([513, 600, 1024])
    ours = dynamic_inverse_frequencies(spec, lengths)
    for row, length in enumerate(lengths):
        theirs, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf_config, "cpu", seq_len=length)
        assert torch.equal(ours[row], theirs)
