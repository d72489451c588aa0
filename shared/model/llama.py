"""A Llama-family decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) over a paged KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import torch
from torch import nn

from shared.model.attention import AttentionMetadata, paged_attention
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache
from shared.model.layers import Linear, RMSNorm, RotaryEmbedding, swiglu
from shared.model.quantized import GgmlBlocks, PackedGgmlWeight, stack_rows


class LlamaAttention(nn.Module):
    """Q, K and V in one fused projection; attention itself is the paged kernel."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size)
        self.o_proj = Linear(self.q_size, config.hidden_size)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        # Q and K are adjacent in the fused output: rotate them in one pass.
        qk_width = self.q_size + self.kv_size
        qk = RotaryEmbedding.rotate(qkv[:, :qk_width].view(t, -1, self.head_dim), *rope)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        v = qkv[:, qk_width:].view(t, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, self.layer, cache, meta)
        return self.o_proj(out.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward with the gate and up projections fused into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_up_proj(x), self.intermediate))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention block followed by a pre-norm MLP block, each with a residual."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # In place: x is this forward's own tensor (the embedding lookup's or a layer's sum),
        # and adding into it saves an allocation per residual.
        x = x.add_(self.self_attn(self.input_layernorm(x), rope, cache, meta))
        return x.add_(self.mlp(self.post_attention_layernorm(x)))


class LlamaForCausalLM(nn.Module):
    """The whole decoder: embeddings, layers, final norm and the (possibly tied) output head.

    ``forward`` maps a packed batch of new tokens to hidden states and writes their K/V into
    the paged cache; ``compute_logits`` is applied only to the rows that need a next token.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Given an (empty) weight, Embedding skips its random init, which on the meta device
        # would import torch._dynamo: over a second of every start.
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta
        )
        # Tied or not, the head keeps its own transposed copy: the embedding needs rows by
        # token, the head needs the transpose for fast matmuls.
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rope.tables(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, cache, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


def build_model(
    config: ModelConfig,
    weights: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    ggml: Mapping[str, GgmlBlocks] | None = None,
) -> LlamaForCausalLM:
    """A ready-to-run model from Hugging Face-named weights, without a throwaway random init.

    ``ggml`` (raw GGUF blocks by Hugging Face name, for an fp32 model on CPU with the kernels
    loaded) lets the projections that have them multiply few-row inputs from their blocks.
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    fused = {
        k: v.to(device=device, dtype=dtype) for k, v in _fuse_hf_weights(weights, config).items()
    }
    expected = model.state_dict()
    for name, tensor in fused.items():
        if name not in expected:
            raise ValueError(f"unexpected weight {name!r}")
        if expected[name].shape != tensor.shape:
            want = tuple(expected[name].shape)
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {want}")
    missing = set(expected) - set(fused)
    if missing:
        raise ValueError(f"missing weights: {sorted(missing)[:5]}")
    model.load_state_dict(fused, strict=False, assign=True)
    # The rotary tables were computed on the CPU even under the meta device (see RotaryEmbedding).
    model.rope.to(device)
    if torch.device(device).type == "cpu":
        # Only the projections much wider than their input gain from oneDNN's packed layout.
        for module in model.modules():
            if isinstance(module, LlamaMLP):
                module.gate_up_proj.pack_for_cpu()
        model.lm_head.pack_for_cpu()
    if ggml:
        attach_ggml_weights(model, ggml)
        # Few-row inputs now go to the kernels, so the fused QKV's fp32 copy serves only long
        # inputs, for which oneDNN's packed layout is faster too (at few rows it was slower).
        for module in model.modules():
            if isinstance(module, LlamaAttention) and module.qkv_proj.ggml is not None:
                module.qkv_proj.pack_for_cpu()
    return model.eval()


def decoder_layers(model: LlamaForCausalLM) -> list[LlamaDecoderLayer]:
    """The model's layers, typed (``nn.ModuleList`` items are plain modules to a type checker)."""
    return [cast(LlamaDecoderLayer, module) for module in model.layers]


def layer_projections(layer: LlamaDecoderLayer) -> tuple[Linear, Linear, Linear, Linear]:
    """A layer's projections in the order a forward pass runs them: QKV, output, gate/up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def attach_ggml_weights(model: LlamaForCausalLM, ggml: Mapping[str, GgmlBlocks]) -> None:
    """Gives each projection whose every part has kernel-readable blocks its packed weight."""
    config = model.config
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    wiring: list[tuple[Linear, list[str]]] = [(model.lm_head, [head])]
    for i, module in enumerate(model.layers):
        layer = cast(LlamaDecoderLayer, module)
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        wiring += [
            (layer.self_attn.qkv_proj, [f"{attn}.{p}_proj.weight" for p in "qkv"]),
            (layer.self_attn.o_proj, [f"{attn}.o_proj.weight"]),
            (layer.mlp.gate_up_proj, [f"{mlp}.{p}_proj.weight" for p in ("gate", "up")]),
            (layer.mlp.down_proj, [f"{mlp}.down_proj.weight"]),
        ]
    for linear, names in wiring:
        blocks = stack_rows([ggml.get(n) for n in names])
        if blocks is not None:
            linear.attach_ggml(PackedGgmlWeight(blocks))


def _fuse_hf_weights(
    weights: dict[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Hugging Face names and layouts -> this module's: fused and transposed projections."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        if not name.endswith("rotary_emb.inv_freq"):
            out[name.removeprefix("model.")] = tensor
    head = out.pop("lm_head.weight", None)
    if config.tie_word_embeddings:
        head = out.get("embed_tokens.weight")
    if head is not None:
        out["lm_head.weight"] = head.t().contiguous()
    for i in range(config.num_layers):
        attn, mlp = f"layers.{i}.self_attn", f"layers.{i}.mlp"
        out[f"{attn}.qkv_proj.weight"] = _stack_t(out, attn, ("q", "k", "v"))
        out[f"{attn}.o_proj.weight"] = out.pop(f"{attn}.o_proj.weight").t().contiguous()
        out[f"{mlp}.gate_up_proj.weight"] = _stack_t(out, mlp, ("gate", "up"))
        out[f"{mlp}.down_proj.weight"] = out.pop(f"{mlp}.down_proj.weight").t().contiguous()
    return out


def _stack_t(weights: dict[str, torch.Tensor], prefix: str, parts: tuple[str, ...]) -> torch.Tensor:
    return torch.cat([weights.pop(f"{prefix}.{p}_proj.weight") for p in parts]).t().contiguous()
