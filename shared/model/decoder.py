"""The decoder every family shares (pre-norm attention and MLP blocks over a paged KV cache),
with each family's differences switched on by ``ModelConfig``: biases, Q/K norms, Gemma's
sandwich norms, embedding scale and soft-capping, sliding windows, partial and scaled rotary
embeddings, and sparse mixtures of experts."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from shared.model.attention import AttentionMetadata, LayerAttention, paged_attention
from shared.model.config import ModelConfig
from shared.model.kv_cache import PagedKVCache
from shared.model.layers import Linear, RMSNorm, gated, softcap
from shared.model.moe import SparseMoe
from shared.model.rope import Rotary

RopeTables = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    """Q, K and V in one fused projection; attention itself is the paged kernel."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        hidden = config.hidden_size
        self.qkv_proj = Linear(hidden, self.q_size + 2 * self.kv_size, config.qkv_bias)
        self.o_proj = Linear(self.q_size, hidden, config.o_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.how = LayerAttention(
            scale=config.attention_scale,
            softcap=config.attn_logit_softcap,
            window=config.layer_window(layer),
        )

    def forward(
        self, x: torch.Tensor, rope: RopeTables, cache: PagedKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        qk_width = self.q_size + self.kv_size
        v = qkv[:, qk_width:].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is None or self.k_norm is None:
            # Q and K are adjacent in the fused output: rotate them in one pass.
            qk = Rotary.rotate(qkv[:, :qk_width].view(t, -1, self.head_dim), *rope)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = self.q_norm(qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim))
            k = self.k_norm(qkv[:, self.q_size : qk_width].view(t, -1, self.head_dim))
            q, k = Rotary.rotate(q, *rope), Rotary.rotate(k, *rope)
        out = paged_attention(q, k, v, self.layer, cache, meta, self.how)
        return self.o_proj(out.reshape(t, self.q_size))


class DenseMlp(nn.Module):
    """A gated feed-forward (SwiGLU or GeGLU) with gate and up fused into one matmul."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.act = config.hidden_act
        hidden, bias = config.hidden_size, config.mlp_bias
        self.gate_up_proj = Linear(hidden, 2 * config.intermediate_size, bias)
        self.down_proj = Linear(config.intermediate_size, hidden, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gated(self.gate_up_proj(x), self.intermediate, self.act))


class DecoderLayer(nn.Module):
    """A pre-norm attention block and a pre-norm MLP block, each added to the residual; with
    sandwich norms (Gemma) each block's output is normed again before the add."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_norm = RMSNorm(size, eps)
        self.self_attn = Attention(config, layer)
        self.mlp_norm = RMSNorm(size, eps)
        sparse = config.moe is not None and config.moe.sparse_layers[layer]
        self.mlp: nn.Module = (
            SparseMoe(size, config.moe) if sparse and config.moe else DenseMlp(config)
        )
        self.attn_out_norm = RMSNorm(size, eps) if config.sandwich_norms else None
        self.mlp_out_norm = RMSNorm(size, eps) if config.sandwich_norms else None

    def forward(
        self, x: torch.Tensor, rope: RopeTables, cache: PagedKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_norm(x), rope, cache, meta)
        if self.attn_out_norm is not None:
            attn = self.attn_out_norm(attn)
        # In place: x is this forward's own tensor (the embedding lookup's or a layer's sum),
        # and adding into it saves an allocation per residual.
        x = x.add_(attn)
        mlp = self.mlp(self.mlp_norm(x))
        if self.mlp_out_norm is not None:
            mlp = self.mlp_out_norm(mlp)
        return x.add_(mlp)


class DecoderForCausalLM(nn.Module):
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
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.ropes = nn.ModuleList(Rotary(s, config.context_length) for s in config.rope_specs)
        # Tied or not, the head keeps its own transposed copy: the embedding needs rows by
        # token, the head needs the transpose for fast matmuls.
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    @property
    def rope(self) -> Rotary:
        """The rope of the first layer (the only one, except in Gemma 3)."""
        return cast(Rotary, self.ropes[self.config.layer_rope(0)])

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
        rope_lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``rope_lengths``: per token, the length it is rotated for (``max(position + 1,
        prompt length)``), needed only where ``config.rope_depends_on_length``."""
        x = self.embed_tokens(input_ids)
        scale = self.config.embedding_scale
        if scale is not None:
            # transformers keeps the scale as a tensor of the weights' dtype.
            x = x * torch.tensor(scale, dtype=x.dtype)
        tables = [cast(Rotary, r).tables(positions, rope_lengths, x.dtype) for r in self.ropes]
        for i, layer in enumerate(self.layers):
            x = layer(x, tables[self.config.layer_rope(i)], cache, meta)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        cap = self.config.final_logit_softcap
        return logits if cap is None else softcap(logits, cap)


def decoder_layers(model: DecoderForCausalLM) -> list[DecoderLayer]:
    """The model's layers, typed (``nn.ModuleList`` items are plain modules to a type checker)."""
    return [cast(DecoderLayer, module) for module in model.layers]


def layer_projections(layer: DecoderLayer) -> tuple[Linear, Linear, Linear, Linear]:
    """A dense layer's projections in the order a forward pass runs them: QKV, output,
    gate/up, down."""
    attn, mlp = layer.self_attn, layer.mlp
    assert isinstance(mlp, DenseMlp)
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
