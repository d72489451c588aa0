"""Model resolution, GGUF conversion and weight loading."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from shared.config import EngineSettings
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_model
from shared.engine.runner import ModelRunner
from shared.errors import ModelNotFoundError
from shared.model import cpu_kernels, files, gguf_convert
from shared.model.config import ModelConfig
from shared.model.files import ModelFiles, resolve_model
from shared.model.gguf_mapped import dequantized, load_mapped
from shared.model.kv_cache import KVLayout, PagedKVCache
from shared.model.layers import Linear
from shared.model.loader import load_state_dict
from shared.sampling_params import SamplingParams
from tests.engine.conftest import TINY, tiny_weights


def test_default_model_converts_into_cache(model_files: ModelFiles, cache_dir: Path) -> None:
    assert model_files.path.parent == cache_dir / "models"
    assert model_files.path.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_files.path / name).is_file(), name
    tok_config = json.loads((model_files.path / "tokenizer_config.json").read_text())
    assert (model_files.path / "chat_template.jinja").is_file() or tok_config.get("chat_template")
    assert not [p for p in (cache_dir / "models").iterdir() if p.name.endswith(".tmp")]


def test_config_from_gguf_metadata(model_files: ModelFiles) -> None:
    c = model_files.config
    assert (c.num_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 100000.0 and c.rms_norm_eps == pytest.approx(1e-5)
    assert c.max_position_embeddings == 8192 and c.tie_word_embeddings
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    assert c.model_id


def test_second_resolve_reuses_the_conversion(
    model_files: ModelFiles, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = model_files.path / "model.safetensors"
    before = (model_files.path.stat().st_mtime_ns, weights.stat().st_mtime_ns)

    def no_conversion(source: Path, out_dir: Path) -> ModelConfig:
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "convert_gguf", no_conversion)
    again = resolve_model(None, cache_dir)
    assert again == model_files
    assert (again.path.stat().st_mtime_ns, weights.stat().st_mtime_ns) == before


def test_smollm2_weights_are_read_from_the_file(model_files: ModelFiles) -> None:
    state, mapped = load_state_dict(model_files), load_mapped(model_files)
    # The norms are all the folder keeps; the embedding and every projection are the GGUF's.
    assert set(state) == {"model.norm.weight"} | {
        f"model.layers.{i}.{n}.weight"
        for i in range(30)
        for n in ("input_layernorm", "post_attention_layernorm")
    }
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in state.values())
    assert "lm_head.weight" not in state and "lm_head.weight" not in mapped
    shapes = {k: (w.out_features, w.in_features) for k, w in mapped.items()}
    assert shapes["model.embed_tokens.weight"] == (49152, 576)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (576, 576)
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (192, 576)
    assert shapes["model.layers.29.mlp.down_proj.weight"] == (576, 1536)
    assert len(mapped) == 1 + 30 * 7
    assert mapped["model.layers.0.self_attn.q_proj.weight"].rope_heads == 9
    assert mapped["model.layers.0.self_attn.v_proj.weight"].rope_heads == 0


@pytest.mark.slow
def test_weights_equal_transformers(model_files: ModelFiles, hf_model: Any) -> None:
    ours = load_state_dict(model_files) | dequantized(load_mapped(model_files))
    theirs = hf_model.state_dict()
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for layer in (0, 1, 15, 29):
        names += [k for k in ours if k.startswith(f"model.layers.{layer}.")]
    assert len(names) == 2 + 4 * 9
    for name in names:
        assert torch.equal(ours[name], theirs[name]), name


def _write_tiny_folder(folder: Path) -> dict[str, torch.Tensor]:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    tensors = tiny_weights()
    names = sorted(tensors)
    half = len(names) // 2
    # Two shards, one stored in bf16, plus a buffer loaders must skip.
    first = {k: tensors[k] for k in names[:half]}
    second = {k: tensors[k].to(torch.bfloat16) for k in names[half:]}
    second["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(2)
    save_file(first, str(folder / "model-00001-of-00002.safetensors"))
    save_file(second, str(folder / "model-00002-of-00002.safetensors"))
    return tensors


def test_bf16_weights_of_a_folder_stay_bf16_and_compute_alike(
    tmp_path: Path, cache_dir: Path
) -> None:
    if not cpu_kernels.load(cache_dir):
        pytest.skip("the CPU kernels cannot be built on this machine")
    tensors = _write_tiny_folder(tmp_path / "tiny-llama")
    folder = resolve_model(str(tmp_path / "tiny-llama"), tmp_path / "cache")
    in_place = load_model(EngineSettings(device="cpu", cache_dir=cache_dir), folder)
    widened = load_model(EngineSettings(device="cpu", cpu_kernels="off"), folder)
    # The second shard's projections are bf16 on disk: views of it, in bf16, no fp32 copy.
    bf16 = {n for n in sorted(tensors)[len(tensors) // 2 :] if n.endswith("proj.weight")}
    assert bf16
    kept = {
        name: m.ggml
        for name, m in in_place.named_modules()
        if isinstance(m, Linear) and m.ggml is not None
    }
    assert kept and all(m.blocks_only for m in in_place.modules() if getattr(m, "ggml", None))
    assert {p.qtype for w in kept.values() for p in w.parts} == {30}  # BF16
    prompts = [[5, 17, 99, 3, 250, 7], list(range(40, 110))]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ours = [o.output_token_ids for o in _engine(in_place).generate(prompts, greedy)]
    theirs = [o.output_token_ids for o in _engine(widened).generate(prompts, greedy)]
    assert ours == theirs and all(len(t) == 12 for t in ours)


def _engine(model: Any) -> LLMEngine:
    config = EngineConfig(num_kv_blocks=32, max_model_len=1024, eos_token_ids=(2,))
    cache = PagedKVCache(KVLayout.for_model(model.config, config.block_size, "float32"), 32)
    return LLMEngine(ModelRunner(model, cache, False), config, model.config.model_id)


def test_tiny_hf_folder_loads(tmp_path: Path) -> None:
    tensors = _write_tiny_folder(tmp_path / "tiny-llama")
    files = resolve_model(str(tmp_path / "tiny-llama"), tmp_path / "cache")
    assert files.path == tmp_path / "tiny-llama"
    # The reader spells out the rope and the context that TINY leaves to their defaults.
    assert files.config.rope_specs == TINY.rope_specs
    assert files.config.context_length == TINY.context_length
    plain = dataclasses.replace(files.config, ropes=(), max_context=0)
    assert plain == dataclasses.replace(TINY, model_id="tiny-llama")
    state = load_state_dict(files)
    assert set(state) == set(tensors)
    for name, tensor in state.items():
        assert tensor.dtype == torch.float32
        assert torch.allclose(tensor, tensors[name], rtol=1e-2, atol=1e-2), name
    assert not (tmp_path / "cache").exists()


def _fake_gguf(path: Path) -> Path:
    path.write_bytes(files.GGUF_MAGIC + b"\0" * 16)
    return path


def _fake_conversion(out_dir: Path, model_id: str) -> None:
    config = {**TINY.to_hf_dict(), files.MODEL_ID_KEY: model_id}
    (out_dir / "config.json").write_text(json.dumps(config))
    save_file({"model.norm.weight": torch.ones(16)}, str(out_dir / "model.safetensors"))


def test_losing_a_conversion_race_uses_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _fake_gguf(tmp_path / "race.gguf")
    cache = tmp_path / "cache"
    target = cache / "models" / f"race-{files.cache_key(source)}"

    def convert_while_another_process_wins(src: Path, out_dir: Path) -> ModelConfig:
        target.mkdir()
        _fake_conversion(target, "winner")
        _fake_conversion(out_dir, "loser")
        return TINY

    monkeypatch.setattr(gguf_convert, "convert_gguf", convert_while_another_process_wins)
    resolved = resolve_model(source, cache)
    assert resolved.path == target and resolved.config.model_id == "winner"
    assert [p.name for p in (cache / "models").iterdir()] == [target.name]


def test_failed_conversion_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _fake_gguf(tmp_path / "broken.gguf")
    cache = tmp_path / "cache"

    def failing(src: Path, out_dir: Path) -> ModelConfig:
        (out_dir / "config.json").write_text("{}")
        raise ModelNotFoundError("unsupported")

    monkeypatch.setattr(gguf_convert, "convert_gguf", failing)
    with pytest.raises(ModelNotFoundError):
        resolve_model(source, cache)
    assert list((cache / "models").iterdir()) == []


def test_changed_gguf_gets_a_new_cache_key(tmp_path: Path) -> None:
    source = _fake_gguf(tmp_path / "m.gguf")
    key = files.cache_key(source)
    source.write_bytes(files.GGUF_MAGIC + b"\1" * 32)
    assert files.cache_key(source) != key


def test_gguf_names_map_to_hf_names() -> None:
    assert gguf_convert.hf_tensor_name("blk.7.attn_k.weight") == (
        "model.layers.7.self_attn.k_proj.weight"
    )
    assert gguf_convert.hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ModelNotFoundError):
        gguf_convert.hf_tensor_name("rope_freqs.weight")
