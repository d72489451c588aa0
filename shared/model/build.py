"""Builds a ready-to-run decoder from Hugging Face-named weights, without a random init."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from shared.errors import UnsupportedModelError
from shared.model.config import ModelConfig
from shared.model.decoder import DecoderForCausalLM, DenseMlp
from shared.model.hf_weights import fuse_hf_weights
from shared.model.layers import BlockEmbedding, Linear
from shared.model.quantized import GgmlBlocks, GgmlWeight

EMBED = "model.embed_tokens.weight"


def build_model(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    mapped: Mapping[str, GgmlBlocks] | None = None,
) -> DecoderForCausalLM:
    """A ready-to-run model from Hugging Face-named weights.

    ``mapped`` (for an fp32 model on CPU with the kernels loaded): weights absent from
    ``weights`` that stay in a GGUF file's blocks (``gguf_mapped``). A projection whose every
    part is there, and the embedding, keep no fp32 copy and compute from the blocks; a
    projection with only some parts there gets fp32 copies of them.
    """
    mapped = dict(mapped or {})
    wiring = _wiring(config)
    weights = dict(weights)
    for spellings in wiring.values():
        for names in spellings:
            present = [n for n in names if n in mapped]
            if present and len(present) != len(names):
                for n in present:  # a projection computes from one kind of weight
                    weights[n] = GgmlWeight(mapped.pop(n)).dequantize()
    for name, blocks in mapped.items():
        weights[name] = torch.empty(blocks.out_features, blocks.in_features, device="meta")
    with torch.device("meta"):
        model = DecoderForCausalLM(config)
    fused = {
        k: v if v.is_meta else v.to(device=device, dtype=dtype)
        for k, v in fuse_hf_weights(weights, config).items()
    }
    expected = model.state_dict()
    for name, tensor in fused.items():
        if name not in expected:
            raise UnsupportedModelError(f"unexpected weight {name!r}")
        if expected[name].shape != tensor.shape:
            want = tuple(expected[name].shape)
            raise UnsupportedModelError(
                f"weight {name!r} has shape {tuple(tensor.shape)}, expected {want}"
            )
    missing = set(expected) - set(fused)
    if missing:
        raise UnsupportedModelError(f"missing weights: {sorted(missing)[:5]}")
    model.load_state_dict(fused, strict=False, assign=True)
    # The rotary tables were computed on the CPU even under the meta device (see Rotary).
    model.ropes.to(device)
    _attach_blocks(model, wiring, mapped)
    if torch.device(device).type == "cpu":
        # Only the projections much wider than their input gain from oneDNN's packed layout.
        wide = [m.gate_up_proj for m in model.modules() if isinstance(m, DenseMlp)]
        for linear in [*wide, model.lm_head]:
            if linear.ggml is None:
                linear.pack_for_cpu()
    left = [name for name, t in model.state_dict().items() if t.is_meta]
    if left:
        raise UnsupportedModelError(f"weights with no values: {left[:5]}")
    return model.eval()


def block_weight_names(config: ModelConfig) -> set[str]:
    """The Hugging Face weights a model can keep as blocks only: the embedding and every
    dense projection, under each spelling a file may use."""
    spelled = {n for spellings in _wiring(config).values() for names in spellings for n in names}
    return spelled | {EMBED}


def _wiring(config: ModelConfig) -> dict[str, list[list[str]]]:
    """Each projection (by module path) and the ways a file may spell the Hugging Face weights
    it is made of: one fused tensor (Phi-3's) or its parts."""
    head = EMBED if config.tie_word_embeddings else "lm_head.weight"
    wiring = {"lm_head": [[head]]}
    for i in range(config.num_layers):
        attn, mlp, ours = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp", f"layers.{i}"
        wiring[f"{ours}.self_attn.qkv_proj"] = _spellings(attn, "qkv_proj", ("q", "k", "v"))
        wiring[f"{ours}.self_attn.o_proj"] = [[f"{attn}.o_proj.weight"]]
        if not (config.moe is not None and config.moe.sparse_layers[i]):
            wiring[f"{ours}.mlp.gate_up_proj"] = _spellings(mlp, "gate_up_proj", ("gate", "up"))
            wiring[f"{ours}.mlp.down_proj"] = [[f"{mlp}.down_proj.weight"]]
    return wiring


def _spellings(prefix: str, fused: str, parts: tuple[str, ...]) -> list[list[str]]:
    return [[f"{prefix}.{fused}.weight"], [f"{prefix}.{p}_proj.weight" for p in parts]]


def _attach_blocks(
    model: DecoderForCausalLM,
    wiring: dict[str, list[list[str]]],
    mapped: Mapping[str, GgmlBlocks],
) -> None:
    """Gives each projection whose weights are all in ``mapped`` those blocks as its only
    weights, and the embedding likewise."""
    if EMBED in mapped:
        model.embed_tokens = BlockEmbedding(mapped[EMBED])  # type: ignore[assignment]
    modules = dict(model.named_modules())
    for path, spellings in wiring.items():
        for names in spellings:
            if all(n in mapped for n in names):
                linear = modules[path]
                assert isinstance(linear, Linear)
                linear.attach_ggml(GgmlWeight([mapped[n] for n in names]))
                linear.drop_fp32()
