"""Values the engine hands out: per-step outputs, load snapshots, running totals, timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.engine.sequence import FinishReason
from shared.model.sampler import TokenLogprobs


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    output_token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    finish_reason: FinishReason | None = None
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass(slots=True)
class ImportSlot:
    """Prompt blocks ``first_block, first_block + 1, ...`` must be written into ``block_ids``."""

    first_block: int
    block_ids: list[int]


@dataclass(frozen=True, slots=True)
class EngineLoad:
    queued_tokens: int  # prompt tokens admitted or waiting but not yet computed
    running_seqs: int
    waiting_seqs: int
    free_blocks: int
    total_blocks: int
    held_requests: int


@dataclass(slots=True)
class EngineStats:
    """Running totals since start; the basis of the engine's metrics."""

    steps: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    prompt_tokens_imported: int = 0


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One engine step: sequences in the batch, tokens computed, tokens already in their KV
    cache (what attention reads), and the step's wall time."""

    num_seqs: int
    num_tokens: int
    num_context_tokens: int
    seconds: float
