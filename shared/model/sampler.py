"""Turns next-token logits into chosen tokens (and their logprobs), one rule set per row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shared.sampling_params import SamplingParams


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probability of the chosen token and of the ``len(top)`` most likely ones.

    Logprobs are of the model's own distribution (the raw logits), before temperature and
    filters, so they mean the same thing whatever the sampling settings were.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass(slots=True)
class SampledToken:
    token_id: int
    logprobs: TokenLogprobs | None


class Sampler:
    """Stateless: every random draw uses the generator handed in for that row, so a seeded
    request draws the same numbers whichever batch it shares."""

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
    ) -> list[SampledToken]:
        logits = logits.float()
        greedy_ids = logits.argmax(dim=-1).tolist()
        want_logprobs = any(p.logprobs is not None for p in params)
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        out: list[SampledToken] = []
        for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
            token = greedy_ids[row] if p.greedy else _draw(logits[row], p, gen)
            lp = None
            if logprobs is not None and p.logprobs is not None:
                lp = _token_logprobs(logprobs[row], token, p.logprobs)
            out.append(SampledToken(token, lp))
        return out


def _draw(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    scaled = logits / p.temperature
    if p.top_k > 0 and p.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if p.top_p < 1.0:
        scaled = _top_p_filter(scaled, p.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose probability mass reaches top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # A token stays if the mass before it is still below top_p; the first token always stays.
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _token_logprobs(row: torch.Tensor, token: int, num_top: int) -> TokenLogprobs:
    top: list[tuple[int, float]] = []
    if num_top:
        values, ids = torch.topk(row, num_top)
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(token, float(row[token]), top)
