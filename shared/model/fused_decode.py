"""A model's decode steps as one call into the CPU kernels (``decode_step.cpp``).

A decode step of a small model run op by op spends more time dispatching its hundreds of tensor
ops, and waking the thread pool for each, than multiplying: the fused step runs every layer of
a batch of one-token rows in one parallel region, with attention reading the paged cache in
place. It needs what the CPU kernels need (fp32 on a CPU with AVX-512) and every projection's
blocks (a GGUF's, or a bf16/fp16 folder's); a model without them keeps the op-by-op path,
which computes the same step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from shared.model.decoder import DecoderForCausalLM, decoder_layers, layer_projections
from shared.model.gguf_tensors import F32
from shared.model.layers import BlockEmbedding, Linear
from shared.model.quantized import GgmlWeight

log = logging.getLogger(__name__)

HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head the kernel takes
# Rows of one fused step at most: past this the projections' weights are reused by enough
# rows that torch's BLAS on the fp32 copy wins (MAX_ROWS of shared/model/quantized.py).
MAX_FUSED_ROWS = 24


class FusedDecoder:
    """Owns the kernel's handle on one model's weights (shared with the model, not copied).

    Invariant: built only for an fp32 CPU model whose every projection has GGUF blocks.
    """

    def __init__(self, model: DecoderForCausalLM) -> None:
        config = model.config
        norms: list[torch.Tensor] = []
        for layer in decoder_layers(model):
            norms += [layer.input_norm.weight, layer.mlp_norm.weight]
        norms.append(model.norm.weight)
        weights = [_ggml(linear) for linear in _projections(model)]
        parts = [p for w in weights for p in w.parts]
        dims = [
            config.num_layers,
            config.hidden_size,
            config.intermediate_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        ]
        embed, embed_qtype = _embedding_rows(model)
        self._kernel: Any = torch.classes.crescent.DecodeModel(
            embed,
            embed_qtype,
            [n.detach() for n in norms],
            [p.blocks for p in parts],
            [p.qtype for p in parts],
            [len(w.parts) for w in weights],
            _qkv_order(weights[0]),
            model.rope.cos,
            model.rope.sin,
            dims,
            config.rms_norm_eps,
        )

    @classmethod
    def build(cls, model: DecoderForCausalLM) -> FusedDecoder | None:
        """The fused step for ``model``, or None (with the reason logged) where it does not
        apply."""
        reason = _unsupported_reason(model)
        if reason is not None:
            log.info("fused decode step off: %s", reason)
            return None
        return cls(model)

    def __call__(
        self,
        token_ids: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        kv: torch.Tensor,
    ) -> torch.Tensor:
        """Next-token logits ``[rows, vocab]`` of rows that each add one token.

        ``token_ids`` int64 ``[rows]``; ``block_tables`` int32 ``[rows, blocks]`` (each row's
        KV blocks in order, padded); ``context_lens`` int32 ``[rows]``, the tokens each row
        attends to including its new one, whose K and V are written into ``kv`` at position
        ``context_len - 1``.
        """
        logits: torch.Tensor = self._kernel.step(token_ids, block_tables, context_lens, kv)
        return logits

    def stats(self) -> FusedStats:
        """How this decoder's steps ran so far."""
        steps, alone, contended, shared_ns, waited_ns, redone = self._kernel.stats()
        return FusedStats(steps, alone, contended, shared_ns / 1e9, waited_ns / 1e9, redone)


@dataclass(frozen=True, slots=True)
class FusedStats:
    """Counts of fused steps: all of them, those run on one thread because other processes
    had taken the cores, and the shared steps that found them taken (each of which sends the
    next steps to one thread for a while); over the shared steps, the seconds of all their
    threads together and how many of those went to waiting for each other; and the chunks of
    work computed again because the thread holding them took too long."""

    steps: int
    steps_alone: int
    contended_steps: int
    shared_thread_s: float
    shared_wait_s: float
    redone_chunks: int


def _projections(model: DecoderForCausalLM) -> list[Linear]:
    """Every projection in the order the kernel takes them: each layer's, then the head."""
    layers = [p for layer in decoder_layers(model) for p in layer_projections(layer)]
    return [*layers, model.lm_head]


def _ggml(linear: Linear) -> GgmlWeight:
    assert linear.ggml is not None
    return linear.ggml


def _embedding_rows(model: DecoderForCausalLM) -> tuple[torch.Tensor, int]:
    """The embedding table as rows of ggml blocks and their type (an fp32 table is type 0)."""
    embed = model.embed_tokens
    if isinstance(embed, BlockEmbedding):
        return embed.blocks.blocks, embed.blocks.qtype
    return embed.weight.detach().view(torch.uint8), F32


def _qkv_order(qkv: GgmlWeight) -> torch.Tensor:
    """Where each stored QKV output column goes (empty when stored in Hugging Face order)."""
    if qkv.gather is None:
        return torch.empty(0, dtype=torch.int32)
    order = torch.empty_like(qkv.gather)
    order[qkv.gather] = torch.arange(qkv.gather.numel())
    return order.to(torch.int32)


def _unsupported_reason(model: DecoderForCausalLM) -> str | None:
    config = model.config
    if not config.is_plain_llama:
        return f"{config.architecture} with these settings is computed op by op"
    if model.norm.weight.device.type != "cpu":
        return "the model is not on the CPU"
    if model.norm.weight.dtype != torch.float32:
        return "the model is not float32"
    if config.head_dim not in HEAD_DIMS:
        return f"head_dim {config.head_dim} is not one of {HEAD_DIMS}"
    if config.num_heads // config.num_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per KV head"
    if config.hidden_size % 32 or config.intermediate_size % 32:
        return "hidden or intermediate size not a multiple of 32"
    projections = _projections(model)
    if any(linear.ggml is None for linear in projections):
        return "not every projection has GGUF blocks the CPU kernels read"
    orders = {None if p.ggml.gather is None else tuple(p.ggml.gather.tolist())
              for p in projections[:-1:4] if p.ggml is not None}  # fmt: skip
    if len(orders) > 1:
        return "the layers keep Q and K rows in different orders"
    return None
