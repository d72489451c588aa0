"""GGUF files of every model family, read back into the Hugging Face folders they came from.

llama.cpp's own ``convert_hf_to_gguf.py`` writes a GGUF file of each tiny random model
(``tests/support``); Crescent's converter must turn it back into the same tensors, under the
same names, and a config.json that means the same to transformers and to Crescent. Where the
GGUF cannot carry a setting, the file means the model with llama.cpp's value for it
(``gguf_reference_folder``). Also: files Crescent cannot read are refused by name.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from shared.errors import ModelNotFoundError
from shared.model.config import ModelConfig
from shared.model.files import ModelFiles, dequantized_folder, resolve_model
from shared.model.gguf_convert import read_gguf
from shared.model.gguf_mapped import dequantized, load_mapped
from shared.model.gguf_rope import llama3_from_rope_freqs
from tests.support.llama_cpp import (
    GGUF_DROPS,
    GGUF_SOURCES,
    gguf_reference_folder,
    tiny_gguf_file,
)
from tests.support.tiny_models import FAMILIES, tiny_model_folder

PROMPT_LENGTH = 100
# What a converted config.json may say differently from its source: the GGUF's llama
# architecture has no Mistral (the same network as Llama without biases, once its window is
# gone), and the padding token comes from the tokenizer files, which the source config does
# not repeat.
_NOT_COMPARED = {"crescent_model_id", "dtype", "pad_token_id"}
_RENAMED = {"mistral": {"architectures", "model_type", "attention_bias", "mlp_bias"}}


@dataclasses.dataclass(frozen=True)
class Case:
    """One family's GGUF file, the folder it means and its conversion."""

    name: str
    gguf: Path
    reference: Path
    files: ModelFiles


@pytest.fixture(scope="module", params=FAMILIES)
def case(request: pytest.FixtureRequest, cache_dir: Path) -> Case:
    name = request.param
    gguf = tiny_gguf_file(name, cache_dir)
    return Case(name, gguf, gguf_reference_folder(name, cache_dir), resolve_model(gguf, cache_dir))


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(shard))
    return tensors


def _weights(files: ModelFiles) -> dict[str, torch.Tensor]:
    """Every weight of a converted folder: those it keeps in fp32, and those it reads from
    the GGUF file in place, expanded by the gguf package's dequantizer."""
    return _tensors(files.path) | dequantized(load_mapped(files))


@pytest.mark.slow
def test_tensors_equal_the_source_folder(case: Case) -> None:
    ours, theirs = _weights(case.files), _tensors(case.reference)
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.float32
        assert torch.equal(ours[name], tensor), name


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(_same(ours[k], theirs[k]) for k in ours)
    if isinstance(ours, list) and isinstance(theirs, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, float) and isinstance(theirs, int | float):
        return math.isclose(ours, theirs, rel_tol=1e-7)
    return bool(ours == theirs)


@pytest.mark.slow
def test_config_means_what_the_source_config_means(case: Case) -> None:
    from transformers import AutoConfig

    ours = json.loads((case.files.path / "config.json").read_text())
    # Every value the converted file sets is the source's, with transformers' defaults
    # filled in for what the source left out (and its aliases: num_experts is Qwen3-MoE's
    # num_local_experts).
    theirs = AutoConfig.from_pretrained(case.reference)
    skip = _NOT_COMPARED | _RENAMED.get(case.name, set())
    differ = {k: (v, getattr(theirs, k, None)) for k, v in ours.items() if k not in skip}
    assert {k: v for k, v in differ.items() if not _same(*v)} == {}
    # And Crescent reads both alike.
    source = json.loads((case.reference / "config.json").read_text())
    expected = ModelConfig.from_hf_dict(source, model_id=case.files.config.model_id)
    assert case.files.config == dataclasses.replace(
        expected, architecture=case.files.config.architecture
    )


def _logits(folder: Path, prompt: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        logits: torch.Tensor = model(prompt[None]).logits[0]
    return logits


@pytest.mark.slow
def test_transformers_logits_equal_the_source_folder(case: Case) -> None:
    vocab = case.files.config.vocab_size
    prompt = torch.randint(3, vocab, (PROMPT_LENGTH,), generator=torch.Generator().manual_seed(11))
    ours = _logits(dequantized_folder(case.gguf, case.files.path.parent.parent), prompt)
    theirs = _logits(case.reference, prompt)
    assert ours.shape == (PROMPT_LENGTH, vocab)
    torch.testing.assert_close(ours, theirs, rtol=0.0, atol=1e-5)


@pytest.mark.slow
def test_the_gguf_drops_only_what_llama_cpp_cannot_carry(cache_dir: Path) -> None:
    """The folders the GGUF files mean differ from the tiny models in the listed settings."""
    for name in FAMILIES:
        source = tiny_model_folder(GGUF_SOURCES.get(name, name), cache_dir)
        reference = gguf_reference_folder(name, cache_dir)
        theirs = json.loads((source / "config.json").read_text())
        ours = json.loads((reference / "config.json").read_text())
        assert {k: v for k, v in ours.items() if theirs.get(k) != v} == GGUF_DROPS.get(name, {})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-linear", "qwen2", "gemma3"])
def test_fused_qkv_is_split_back(name: str, cache_dir: Path) -> None:
    """The converter's --fuse-qkv stacks q, k and v (llama's q/k reordered, biases too)."""
    gguf = tiny_gguf_file(name, cache_dir, flags=("--fuse-qkv",))
    files = resolve_model(gguf, cache_dir)
    ours, theirs = _weights(files), _tensors(gguf_reference_folder(name, cache_dir))
    assert sorted(ours) == sorted(theirs)
    for key, tensor in theirs.items():
        assert torch.equal(ours[key], tensor), key


# Quantized files: the projections whose Hugging Face tensor is the GGUF tensor itself, and the
# embedding, are read from the file in place (llama's q/k rows put back in order as they are
# computed); experts and the fused tensors split apart are kept in fp32.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "phi3", "qwen3-moe"])
def test_mapped_weights_are_the_dequantized_weights(name: str, cache_dir: Path) -> None:
    gguf = tiny_gguf_file(name, cache_dir, outtype="q8_0")
    files = resolve_model(gguf, cache_dir)
    mapped = load_mapped(files)
    kept = _tensors(files.path)
    everything = _tensors(dequantized_folder(gguf, cache_dir))
    assert mapped and not set(mapped) & set(kept)
    assert set(mapped) | set(kept) == set(everything)
    assert not [k for k in mapped if ".experts." in k]
    assert all(w.qtype == 8 for w in mapped.values())  # Q8_0
    for key, tensor in dequantized(mapped).items():
        assert torch.equal(tensor, everything[key]), key
    projections = {k for k, v in everything.items() if v.dim() == 2 and "proj" in k}
    expected = {k for k in projections if ".experts." not in k and ".gate." not in k}
    assert expected <= set(mapped)
    # Views of the file's own pages, not copies: each lies in a mapping of the file.
    regions = _mappings_of(gguf)
    for key, w in mapped.items():
        start, end = w.blocks.data_ptr(), w.blocks.data_ptr() + w.blocks.numel()
        assert any(lo <= start and end <= hi for lo, hi in regions), key


def _mappings_of(path: Path) -> list[tuple[int, int]]:
    """The address ranges where this process maps ``path``."""
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == str(path.resolve()):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            found.append((lo, hi))
    return found


# Refusals: files Crescent does not read are refused before anything is written, by name.


def _write_gguf(path: Path, arch: str, keys: dict[str, Any], tensors: dict[str, Any]) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama(path: Path, **extra: Any) -> Path:
    keys = {
        "llama.embedding_length": 8,
        "llama.block_count": 1,
        "llama.feed_forward_length": 16,
        "llama.attention.head_count": 2,
        "llama.context_length": 64,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
    }
    tensors = {"token_embd.weight": np.zeros((32, 8), dtype=np.float32)}
    return _write_gguf(path, "llama", keys | extra, tensors)


def _refused(path: Path, tmp_path: Path, *names: str) -> str:
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(path, tmp_path / "cache")
    message = str(info.value)
    for name in names:
        assert name in message
    assert not list((tmp_path / "cache" / "models").iterdir())
    return message


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    tensors = {"token_embd.weight": np.zeros((32, 8), dtype=np.float32)}
    path = _write_gguf(tmp_path / "moe.gguf", "qwen2moe", {}, tensors)
    message = _refused(path, tmp_path, "'qwen2moe'")
    assert "supported: llama, qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3" in message
    bert = _write_gguf(tmp_path / "bert.gguf", "bert", {}, tensors)
    _refused(bert, tmp_path, "'bert'")


def test_unknown_rope_scaling_is_refused(tmp_path: Path) -> None:
    path = _llama(tmp_path / "rope.gguf", **{"llama.rope.scaling.type": "ntk-by-parts"})
    _refused(path, tmp_path, "rope.scaling.type", "'ntk-by-parts'", "linear, yarn")


def test_unknown_metadata_is_refused(tmp_path: Path) -> None:
    path = _llama(tmp_path / "scale.gguf", **{"llama.attention.scale": 0.5})
    _refused(path, tmp_path, "'llama.attention.scale'")


def test_unknown_tensor_is_refused(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "sinks.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("embedding_length", 8), ("block_count", 1), ("feed_forward_length", 16)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((32, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_sinks.weight", np.zeros(2, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    _refused(path, tmp_path, "'blk.0.attn_sinks.weight'")


@pytest.mark.parametrize(("layers", "scalar"), [(26, 32), (46, 16)])
def test_gemma2_attention_scale_is_llama_cpps(tmp_path: Path, layers: int, scalar: int) -> None:
    """The GGUF has no query_pre_attn_scalar: llama.cpp scales by the head size, except for
    Gemma 2 27B (46 layers), which scales by hidden / heads."""
    keys = {
        "gemma2.embedding_length": 64,
        "gemma2.block_count": layers,
        "gemma2.feed_forward_length": 128,
        "gemma2.attention.head_count": 4,
        "gemma2.attention.key_length": 32,
        "gemma2.attention.value_length": 32,
        "gemma2.context_length": 256,
        "gemma2.attention.layer_norm_rms_epsilon": 1e-6,
    }
    tensors = {"token_embd.weight": np.zeros((32, 64), dtype=np.float32)}
    path = _write_gguf(tmp_path / "gemma2.gguf", "gemma2", keys, tensors)
    _, _, config = read_gguf(path)
    assert config["query_pre_attn_scalar"] == scalar
    # What llama.cpp's gemma2 runtime assumes when the file leaves them out.
    assert config["attn_logit_softcapping"] == 50.0
    assert config["final_logit_softcapping"] == 30.0
    assert config["sliding_window"] == 4096
    assert config["layer_types"][:2] == ["sliding_attention", "full_attention"]


def _converter_rope_freqs(
    theta: float, dim: int, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """The divisors llama.cpp's converter writes for Llama 3 rope scaling (float32 math)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for freq in inv_freq:
        wavelen = float(2 * math.pi / freq)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize(
    ("theta", "dim", "factor", "original"),
    [(500000.0, 128, 8.0, 8192), (500000.0, 64, 32.0, 8192), (10000.0, 16, 8.0, 64)],
)
def test_llama3_rope_is_recovered_from_rope_freqs(
    theta: float, dim: int, factor: float, original: int
) -> None:
    """Llama 3.1 (8B: head 128, factor 8), Llama 3.2 (1B: head 64, factor 32), the tiny one."""
    freqs = _converter_rope_freqs(theta, dim, factor, 1.0, 4.0, original)
    assert llama3_from_rope_freqs(freqs, theta, dim, 131072) == {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": original,
    }
    assert llama3_from_rope_freqs(freqs * 1.01, theta, dim, 131072) is None
