"""Values the engine hands out: per-step outputs, load snapshots, running totals, timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.engine.sequence import FinishReason, Sequence
from shared.model.sampler import TokenLogprobs


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request. A request whose computation failed ends with
    ``finish_reason`` ERROR, ``finished`` true, no new token and ``error`` saying why."""

    request_id: str
    new_token_ids: list[int]
    output_token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    finish_reason: FinishReason | None = None
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    error: str | None = None
    admitted_at: float = 0.0  # monotonic time of the sequence's first step
    # Tokens of the prompt / the output it computed and newly cached (full blocks).
    num_prompt_tokens_written: int = 0
    num_output_tokens_written: int = 0

    @classmethod
    def of(
        cls, seq: Sequence, new: list[int], logprobs: list[TokenLogprobs], error: str | None = None
    ) -> RequestOutput:
        """The output of ``seq`` as it stands, with this step's new tokens."""
        return cls(
            request_id=seq.request_id,
            new_token_ids=new,
            output_token_ids=seq.output_token_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens or 0,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            new_logprobs=logprobs,
            error=error,
            admitted_at=seq.admitted_at,
            num_prompt_tokens_written=seq.num_prompt_tokens_written,
            num_output_tokens_written=seq.num_output_tokens_written,
        )


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


#: A step computing at least this many tokens counts as a prompt step (``EngineStats``).
PROMPT_STEP_TOKENS = 64


@dataclass(slots=True)
class EngineStats:
    """Running totals since start; the basis of the engine's metrics."""

    steps: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    output_tokens: int = 0
    preemptions: int = 0
    prompt_tokens_imported: int = 0
    failed_requests: int = 0  # ended with an error output
    failed_steps: int = 0  # batches whose forward pass or sampling raised
    # Seconds per token of recent prompt steps (a moving average; 0 until one ran): how long
    # a full step takes on this model and machine.
    prompt_token_s: float = 0.0

    def note_prompt_step(self, tokens: int, seconds: float) -> None:
        if tokens < PROMPT_STEP_TOKENS:
            return  # mostly decodes: their per-token cost says nothing about a full step
        rate = seconds / tokens
        old = self.prompt_token_s
        self.prompt_token_s = 0.8 * old + 0.2 * rate if old else rate


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One engine step: sequences in the batch, tokens computed, tokens already in their KV
    cache (what attention reads), and the step's wall time."""

    num_seqs: int
    num_tokens: int
    num_context_tokens: int
    seconds: float
