"""Engine sizing: explicit values, decided by whoever builds the engine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How big the engine's batches and KV pool are.

    ``max_num_batched_tokens`` bounds the tokens of one forward pass: a longer prompt is
    prefilled in chunks, interleaved with the decode steps of running sequences.
    """

    block_size: int = 32
    num_kv_blocks: int = 1024
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    enable_prefix_caching: bool = True
    prefill_order: str = "deadline"  # or "arrival" (``shared.engine.prefill_order``)
    tenant_step_s: float = 0.0  # a step's prompt time while tenants share (0: unbounded)
    kv_dtype: str = "float32"
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "num_kv_blocks",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
