"""A model's decode steps as one call into the CPU kernels (``decode_step.cpp``).

A decode step of a small model run op by op spends more time dispatching its hundreds of tensor
ops, and waking the thread pool for each, than multiplying: the fused step runs every layer of
a batch of one-token rows in one parallel region, with attention reading the paged cache in
place. It needs what the CPU kernels need (fp32 on a CPU with AVX-512) and every projection's
GGUF blocks; a model without them keeps the op-by-op path, which computes the same step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from shared.model.layers import Linear
from shared.model.llama import LlamaForCausalLM, decoder_layers, layer_projections

log = logging.getLogger(__name__)

HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head the kernel takes
# Rows of one fused step at most: past this the projections' weights are reused by enough
# rows that torch's BLAS on the fp32 copy wins (MAX_ROWS of shared/model/quantized.py).
MAX_FUSED_ROWS = 24


class FusedDecoder:
    """Owns the kernel's handle on one model's weights (shared with the model, not copied).

    Invariant: built only for an fp32 CPU model whose every projection has packed GGUF blocks.
    """

    def __init__(self, model: LlamaForCausalLM) -> None:
        config = model.config
        norms: list[torch.Tensor] = []
        for layer in decoder_layers(model):
            norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        norms.append(model.norm.weight)
        packed = [_ggml(linear) for linear in _projections(model)]
        dims = [
            config.num_layers,
            config.hidden_size,
            config.intermediate_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        ]
        self._kernel: Any = torch.classes.crescent.DecodeModel(
            model.embed_tokens.weight.detach(),
            [n.detach() for n in norms],
            [p.packed for p in packed],
            [p.qtype for p in packed],
            model.rope.cos,
            model.rope.sin,
            dims,
            config.rms_norm_eps,
        )

    @classmethod
    def build(cls, model: LlamaForCausalLM) -> FusedDecoder | None:
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


def _projections(model: LlamaForCausalLM) -> list[Linear]:
    """Every projection in the order the kernel takes them: each layer's, then the head."""
    layers = [p for layer in decoder_layers(model) for p in layer_projections(layer)]
    return [*layers, model.lm_head]


def _ggml(linear: Linear) -> Any:
    assert linear.ggml is not None
    return linear.ggml


def _unsupported_reason(model: LlamaForCausalLM) -> str | None:
    config = model.config
    if model.embed_tokens.weight.device.type != "cpu":
        return "the model is not on the CPU"
    if model.embed_tokens.weight.dtype != torch.float32:
        return "the model is not float32"
    if config.head_dim not in HEAD_DIMS:
        return f"head_dim {config.head_dim} is not one of {HEAD_DIMS}"
    if config.num_heads // config.num_kv_heads > MAX_GROUP:
        return f"more than {MAX_GROUP} query heads per KV head"
    if config.hidden_size % 32 or config.intermediate_size % 32:
        return "hidden or intermediate size not a multiple of 32"
    if any(linear.ggml is None for linear in _projections(model)):
        return "not every projection has GGUF blocks the CPU kernels read"
    return None
