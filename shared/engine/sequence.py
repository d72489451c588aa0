"""One request's state inside the engine: its tokens, its blocks and how far it is computed."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.kv.hashing import BlockHash
from shared.kv.pool import KVBlock
from shared.sampling_params import SamplingParams

if TYPE_CHECKING:
    from shared.model.logits_processing import SequenceLogitsProcessor
    from shared.model.sampler import TokenLogprobs


class SequenceStatus(enum.Enum):
    """Where a sequence lives on its node. The engine's table holds it, by request id, from
    its arrival until its blocks go back to the pool, which is when it becomes FINISHED."""

    WAITING = "waiting"  # queued, or preempted, or an import that failed: computed here
    RUNNING = "running"  # admitted: the scheduler gives it tokens each step
    IMPORTING = "importing"  # blocks reserved, its prompt's KV being written in from elsewhere
    HELD = "held"  # finished, its blocks kept referenced until a decode node pulled them
    FINISHED = "finished"  # ended and its blocks freed: no longer in the engine's table


class FinishReason(enum.StrEnum):
    STOP = "stop"  # an end-of-sequence or stop token
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"  # the caller gave up on it
    ERROR = "error"  # computing or sampling it failed; other sequences go on


@dataclass(slots=True, eq=False)
class Sequence:
    """Owns the token ids (prompt then output), the block table and the compute progress.

    Invariants: ``num_computed_tokens <= len(token_ids)``; ``block_table`` covers at least
    ``num_computed_tokens`` tokens; ``block_hashes[i]`` is the chained hash of block ``i`` of
    ``token_ids`` and exists only for full blocks; ``block_table`` is empty once FINISHED.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    root_hash: BlockHash
    token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[KVBlock] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Prompt tokens reused from the prefix cache, or found here by an import; None until its
    # first admission looks (an import that failed is looked up again: what it reuses now).
    num_cached_tokens: int | None = None
    num_prompt_tokens_computed: int = 0
    num_published_blocks: int = 0  # leading blocks already offered to the prefix cache
    # Tokens of the prompt / the output whose blocks this sequence computed and newly cached.
    num_prompt_tokens_written: int = 0
    num_output_tokens_written: int = 0
    finish_reason: FinishReason | None = None
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # The status a stop or length finish leaves it in: HELD on a prefill node, whose blocks a
    # decode node pulls. An abort or error always ends FINISHED: nobody would pull its blocks.
    finishes_as: SequenceStatus = SequenceStatus.FINISHED
    quota_key: bytes = b""  # the tenant scope its cached blocks count against below DRAM
    cache_salt: bytes = b""  # its cache scope, before any narrowing by its rope
    rope_scope: str = ""  # how its tokens are rotated, where that depends on its length
    admitted_at: float = 0.0  # monotonic time of its first step (0: none yet), for its phases
    arrival: float = 0.0  # wall-clock time it reached the engine: when it is due, with no deadline
    # Rules that depend on the tokens it generated (penalties, grammar); None when it has none.
    logits_processor: SequenceLogitsProcessor | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        """True once it has its last token, whether or not its blocks are still held."""
        return self.status in (SequenceStatus.FINISHED, SequenceStatus.HELD)
