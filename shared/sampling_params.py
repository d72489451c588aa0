"""How one request wants its tokens chosen; plain data, shared by the API layer and the engine."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling and stopping rules of one sequence.

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` disable those filters.
    ``logprobs`` is the number of most likely alternatives to report per token (``None``: no
    logprobs at all; ``0``: only the chosen token's). ``seed`` makes sampling reproducible.
    ``output_offset`` is the position in the whole completion of the first token this sequence
    generates: non-zero only for a request resumed on another node after its first was lost.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    output_offset: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens!r}", "max_tokens"
            )
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 2, got {self.temperature!r}", "temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise InvalidRequestError(
                f"top_k must be -1, 0 or a positive integer, got {self.top_k!r}", "top_k"
            )
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):
            raise InvalidRequestError(
                f"seed must be a non-negative 63-bit integer, got {self.seed!r}", "seed"
            )
        if not isinstance(self.output_offset, int) or self.output_offset < 0:
            raise InvalidRequestError(
                f"output_offset must be a non-negative integer, got {self.output_offset!r}",
                "output_offset",
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequestError(
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}",
                "logprobs",
            )
