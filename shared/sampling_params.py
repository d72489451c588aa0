"""How one request wants its tokens chosen; plain data, shared by the API layer and the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shared.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20
# A smaller positive temperature is greedy in all but name and overflows the scaled logits;
# vLLM clamps to the same floor.
MIN_TEMPERATURE = 0.01
MAX_TEMPERATURE = 2.0
# The wire's bound; any value from the vocabulary size up keeps every token.
MAX_TOP_K = 1 << 31


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
        _check_int(self.max_tokens, "max_tokens", 1, None, "at least 1")
        _check_float(self.temperature, "temperature")
        t = self.temperature
        if t != 0.0 and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
            raise InvalidRequestError(
                f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and "
                f"{MAX_TEMPERATURE:g}, got {t!r}",
                "temperature",
            )
        _check_float(self.top_p, "top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        _check_int(self.top_k, "top_k", -1, MAX_TOP_K, f"-1, 0 or between 1 and {MAX_TOP_K}")
        if self.seed is not None:
            _check_int(self.seed, "seed", 0, 2**63 - 1, "a non-negative 63-bit integer")
        _check_int(self.output_offset, "output_offset", 0, None, "a non-negative integer")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", 0, MAX_TOP_LOGPROBS, f"0 to {MAX_TOP_LOGPROBS}")


def _check_int(value: object, name: str, lo: int, hi: int | None, what: str) -> None:
    # bool is an int subclass in Python, but True is no count.
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        raise InvalidRequestError(f"{name} must be {what}, got {value!r}", name)


def _check_float(value: object, name: str) -> None:
    # NaN passes every range check (each comparison is false), so finiteness comes first.
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{name} must be a finite number, got {value!r}", name)
