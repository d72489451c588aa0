"""A workload described by its figures instead of a trace: an arrival rate, a mix of prompt and
output lengths, and how much of each prompt every request shares. ``records`` writes it as a
Mooncake-format trace (``crescent.traces``) the simulator replays.

Lengths are in the served model's tokens, as a gateway counts them. A trace counts 512-token
blocks, and the simulator scales them to its cost model's block (``traces.scaled``), so a
length is written as ``tokens * 512 / block_tokens`` trace tokens and comes back unchanged.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from crescent.traces import TRACE_BLOCK_TOKENS, TraceRecord


@dataclass(frozen=True, slots=True)
class Lengths:
    """One kind of request of a mix: its prompt and output tokens, and its weight."""

    prompt_tokens: int
    output_tokens: int
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Workload:
    """Poisson arrivals at ``rate_per_s``, each request's lengths drawn from ``mix`` by weight;
    the first ``shared_share`` of each prompt's blocks are the same for every request (a
    system prompt or a document everyone reads), the rest are its own. Invariant: a
    non-empty mix of positive lengths and weights, a positive rate, a share in [0, 1]."""

    rate_per_s: float
    mix: tuple[Lengths, ...]
    shared_share: float = 0.0
    requests: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.mix:
            raise ValueError("a workload needs at least one kind of request")
        for kind in self.mix:
            if min(kind.prompt_tokens, kind.output_tokens) < 1 or kind.weight <= 0:
                raise ValueError(f"lengths and weights must be positive: {kind}")
        if self.rate_per_s <= 0 or self.requests < 1:
            raise ValueError("a workload needs a positive rate and at least one request")
        if not 0.0 <= self.shared_share <= 1.0:
            raise ValueError(f"the shared share must be in [0, 1], not {self.shared_share}")

    def records(self, block_tokens: int) -> list[TraceRecord]:
        """The workload as a trace for a cost model of ``block_tokens`` tokens per block."""
        rng = random.Random(f"plan-workload:{self.seed}")
        per_token = TRACE_BLOCK_TOKENS / block_tokens
        weights = list(itertools.accumulate(kind.weight for kind in self.mix))
        longest = max(kind.prompt_tokens for kind in self.mix) * per_token
        shared_ids = int(longest // TRACE_BLOCK_TOKENS) + 1
        fresh = itertools.count(shared_ids)  # ids past the shared ones: a request's own
        out: list[TraceRecord] = []
        t = 0.0
        for _ in range(self.requests):
            t += rng.expovariate(self.rate_per_s)
            kind = rng.choices(self.mix, cum_weights=weights)[0]
            prompt = round(kind.prompt_tokens * per_token)
            blocks = -(-prompt // TRACE_BLOCK_TOKENS)
            shared = int(blocks * self.shared_share)
            ids = [*range(shared), *itertools.islice(fresh, blocks - shared)]
            output = round(kind.output_tokens * per_token)
            out.append(TraceRecord(round(t * 1000), prompt, output, tuple(ids)))
        return out

    def mean_lengths(self) -> tuple[float, float]:
        """The mix's mean prompt and output tokens, by weight."""
        total = sum(kind.weight for kind in self.mix)
        prompt = sum(kind.prompt_tokens * kind.weight for kind in self.mix) / total
        output = sum(kind.output_tokens * kind.weight for kind in self.mix) / total
        return prompt, output


def parse_mix(text: str) -> tuple[Lengths, ...]:
    """``PROMPT:OUTPUT[:WEIGHT],...`` (tokens; weight 1 when left out) as lengths; ValueError
    naming the bad item."""
    kinds = []
    for item in text.split(","):
        fields = item.strip().split(":")
        try:
            if len(fields) not in (2, 3):
                raise ValueError
            weight = float(fields[2]) if len(fields) == 3 else 1.0
            kinds.append(Lengths(int(fields[0]), int(fields[1]), weight))
        except ValueError:
            raise ValueError(f"{item.strip()!r} is not PROMPT:OUTPUT[:WEIGHT]") from None
        if min(kinds[-1].prompt_tokens, kinds[-1].output_tokens) < 1 or weight <= 0:
            raise ValueError(f"{item.strip()!r}: lengths and weight must be positive")
    return tuple(kinds)
