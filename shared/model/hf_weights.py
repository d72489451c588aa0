"""Hugging Face weight names and layouts -> the decoder's: projections fused and transposed,
Gemma's norm offset applied, experts stacked. Every weight of the file must be used and
every weight of the model found; anything else is an error that names it."""

from __future__ import annotations

import torch

from shared.errors import UnsupportedModelError
from shared.model.config import ModelConfig

Weights = dict[str, torch.Tensor]


class _Source:
    """The file's weights, handed out once each; what is never taken is reported."""

    def __init__(self, weights: Weights) -> None:
        self._left = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}

    def take(self, name: str) -> torch.Tensor:
        try:
            return self._left.pop(name)
        except KeyError:
            raise UnsupportedModelError(f"missing weight {name!r}") from None

    def maybe(self, name: str) -> torch.Tensor | None:
        return self._left.pop(name, None)

    def has(self, name: str) -> bool:
        return name in self._left

    def check_used(self) -> None:
        if self._left:
            names = sorted(self._left)
            raise UnsupportedModelError(
                f"unexpected weight {names[0]!r}"
                + (f" and {len(names) - 1} more" if len(names) > 1 else "")
            )


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


def _fused(src: _Source, prefix: str, fused: str, parts: tuple[str, ...], kind: str) -> Weights:
    """A projection fused by output rows: stored fused (Phi-3) or as its parts; its bias
    likewise when there is one."""
    out: Weights = {}
    whole = src.maybe(f"{prefix}.{fused}.{kind}")
    if whole is None:
        pieces = [src.maybe(f"{prefix}.{p}.{kind}") for p in parts]
        if all(p is None for p in pieces) and kind == "bias":
            return out
        if any(p is None for p in pieces):
            missing = next(p for p, w in zip(parts, pieces, strict=True) if w is None)
            raise UnsupportedModelError(f"missing weight {prefix}.{missing}.{kind!r}")
        whole = torch.cat([p for p in pieces if p is not None])
    out[kind] = _t(whole) if kind == "weight" else whole
    return out


def _norm(src: _Source, name: str, offset: float) -> torch.Tensor:
    weight = src.take(name)
    # transformers computes (1.0 + w) in fp32 at every step; adding it once is the same value.
    return weight + offset if offset else weight


def _linear(src: _Source, prefix: str, ours: str, out: Weights) -> None:
    out[f"{ours}.weight"] = _t(src.take(f"{prefix}.weight"))
    bias = src.maybe(f"{prefix}.bias")
    if bias is not None:
        out[f"{ours}.bias"] = bias


def _attention(src: _Source, hf: str, ours: str, config: ModelConfig, out: Weights) -> None:
    for kind in ("weight", "bias"):
        for k, v in _fused(src, hf, "qkv_proj", ("q_proj", "k_proj", "v_proj"), kind).items():
            out[f"{ours}.qkv_proj.{k}"] = v
    _linear(src, f"{hf}.o_proj", f"{ours}.o_proj", out)
    if config.qk_norm:
        for n in ("q_norm", "k_norm"):
            out[f"{ours}.{n}.weight"] = _norm(src, f"{hf}.{n}.weight", config.norm_weight_offset)


def _dense_mlp(src: _Source, hf: str, ours: str, out: Weights) -> None:
    for kind in ("weight", "bias"):
        for k, v in _fused(src, hf, "gate_up_proj", ("gate_proj", "up_proj"), kind).items():
            out[f"{ours}.gate_up_proj.{k}"] = v
    _linear(src, f"{hf}.down_proj", f"{ours}.down_proj", out)


def _experts(src: _Source, hf: str, ours: str, config: ModelConfig, out: Weights) -> None:
    assert config.moe is not None
    moe = config.moe
    # Mixtral's hub files name the block block_sparse_moe and its experts' matrices w1-w3.
    mixtral = src.has(f"{hf}.block_sparse_moe.gate.weight")
    block = f"{hf}.block_sparse_moe" if mixtral else f"{hf}.mlp"
    out[f"{ours}.router.weight"] = _t(src.take(f"{block}.gate.weight"))
    fused_gate_up = src.maybe(f"{block}.experts.gate_up_proj")
    if fused_gate_up is not None:  # transformers 5's in-memory layout, saved as it is
        out[f"{ours}.gate_up"] = fused_gate_up.transpose(1, 2).contiguous()
        out[f"{ours}.down"] = src.take(f"{block}.experts.down_proj").transpose(1, 2).contiguous()
        return
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    gate_up, down = [], []
    for e in range(moe.num_experts):
        gate, up, dn = (src.take(f"{block}.experts.{e}.{n}.weight") for n in names)
        gate_up.append(torch.cat([gate, up]).t())
        down.append(dn.t())
    out[f"{ours}.gate_up"] = torch.stack(gate_up).contiguous()
    out[f"{ours}.down"] = torch.stack(down).contiguous()


def _norms(src: _Source, hf: str, ours: str, config: ModelConfig, out: Weights) -> None:
    offset = config.norm_weight_offset
    names = [("input_layernorm", "input_norm")]
    if config.sandwich_norms:
        names += [
            ("post_attention_layernorm", "attn_out_norm"),
            ("pre_feedforward_layernorm", "mlp_norm"),
            ("post_feedforward_layernorm", "mlp_out_norm"),
        ]
    else:
        names.append(("post_attention_layernorm", "mlp_norm"))
    for theirs, mine in names:
        out[f"{ours}.{mine}.weight"] = _norm(src, f"{hf}.{theirs}.weight", offset)


def fuse_hf_weights(weights: Weights, config: ModelConfig) -> Weights:
    """The decoder's state dict from a Hugging Face one (``lm_head.weight`` may be absent
    when the head is tied to the embedding)."""
    src = _Source(weights)
    out: Weights = {"embed_tokens.weight": src.take("model.embed_tokens.weight")}
    out["norm.weight"] = _norm(src, "model.norm.weight", config.norm_weight_offset)
    head = src.maybe("lm_head.weight")
    if config.tie_word_embeddings:
        head = out["embed_tokens.weight"]
    elif head is None:
        raise UnsupportedModelError("missing weight 'lm_head.weight' of an untied model")
    out["lm_head.weight"] = _t(head)
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        _norms(src, hf, ours, config, out)
        _attention(src, f"{hf}.self_attn", f"{ours}.self_attn", config, out)
        if config.moe is not None and config.moe.sparse_layers[i]:
            _experts(src, hf, f"{ours}.mlp", config, out)
        else:
            _dense_mlp(src, f"{hf}.mlp", f"{ours}.mlp", out)
    src.check_used()
    return out
