"""Turns next-token logits into chosen tokens (and their logprobs), one rule set per row."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shared.model.logits_processing import SequenceLogitsProcessor, bitmask_words
from shared.sampling_params import MIN_TEMPERATURE, SamplingParams

log = logging.getLogger(__name__)
NO_TOKEN = -1
# What a logprob of -inf is reported as (OpenAI reports impossible tokens the same way), so
# every reported number is finite.
LOGPROB_FLOOR = -9999.0
_NEG_INF = float("-inf")


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
    """One row's result: a token id in the vocabulary, or ``NO_TOKEN`` with ``error`` saying
    why this row could not be sampled."""

    token_id: int
    logprobs: TokenLogprobs | None
    error: str | None = None


@dataclass(slots=True)
class _Cleaned:
    """Logits with NaN as -inf, and a row holding +inf entries turned into a uniform choice
    among them (0 there, -inf elsewhere); per row, the greedy id and whether any candidate
    is left."""

    logits: torch.Tensor
    greedy: list[int]
    usable: list[bool]
    logprobs: torch.Tensor | None

    @classmethod
    def of(
        cls, logits: torch.Tensor, want_logprobs: bool, raw: torch.Tensor | None = None
    ) -> _Cleaned:
        """``raw``, when given, are the logits before per-sequence processing: logprobs are
        reported of those."""
        finite = _greedy_if_finite(logits)
        if finite is not None:
            # Nothing to clean: each row's best token, found without torch's elementwise ops
            # (each of which wakes a thread team for one vocabulary-wide row).
            x, facts = logits.float(), [finite, [1] * len(finite)]
        else:
            x = _clean(logits)
            facts = torch.stack([x.argmax(dim=-1), (x > _NEG_INF).any(dim=-1).long()]).tolist()
        logprobs = None
        if want_logprobs:
            logprobs = torch.log_softmax(x if raw is None else _clean(raw), dim=-1)
        return cls(x, facts[0], [bool(u) for u in facts[1]], logprobs)


def _greedy_if_finite(logits: torch.Tensor) -> list[int] | None:
    """Each row's argmax when every logit is finite (CPU float32 logits only), else None."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    rows = logits.detach().numpy()
    if not np.isfinite(rows).all():
        return None
    return [int(i) for i in rows.argmax(axis=-1)]


def _clean(logits: torch.Tensor) -> torch.Tensor:
    x = logits.float()
    x = x.masked_fill(x.isnan(), _NEG_INF)
    inf = x.isposinf()
    return torch.where(inf.any(dim=-1, keepdim=True), torch.where(inf, 0.0, _NEG_INF), x)


class Sampler:
    """Owns the random generators. A seeded row draws from a generator seeded with
    ``(seed, position)`` only, so its token depends on neither the batch it shares nor what
    the sequence did before: a completion resumed at position ``k`` on another node draws
    exactly what the first node would have. Unseeded rows share one generator seeded from
    the operating system. Logit values never make it raise or return an id outside the
    vocabulary; a row that cannot be sampled gets ``NO_TOKEN`` and fails alone."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._random = torch.Generator(device=device)
        self._random.seed()
        self._seeded = torch.Generator(device=device)

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        positions: Sequence[int],
        processors: Sequence[SequenceLogitsProcessor | None] = (),
    ) -> list[SampledToken]:
        """One token per row of ``logits``; ``positions[i]`` is the completion position the
        token of row ``i`` will take, ``processors[i]`` (if any) the rules that depend on what
        row ``i``'s sequence generated. Rows without one are sampled from their logits as
        they are."""
        want_logprobs = any(p.logprobs is not None for p in params)
        processed, failed = self._process(logits, processors)
        raw = logits if processed is not logits else None
        batch: _Cleaned | None = None
        try:
            batch = _Cleaned.of(processed, want_logprobs, raw)
        except Exception:  # each row then tries alone, so one bad row fails only itself
            log.exception("sampling a batch of %d rows failed", logits.shape[0])
        out: list[SampledToken] = []
        for row, (p, position) in enumerate(zip(params, positions, strict=True)):
            if row in failed:
                out.append(SampledToken(NO_TOKEN, None, failed[row]))
                continue
            try:
                if batch is None:
                    one = slice(row, row + 1)
                    alone = _Cleaned.of(
                        processed[one], p.logprobs is not None, None if raw is None else raw[one]
                    )
                    out.append(self._sample_row(alone, 0, p, position))
                else:
                    out.append(self._sample_row(batch, row, p, position))
            except Exception as exc:
                log.exception("sampling row %d failed", row)
                out.append(SampledToken(NO_TOKEN, None, f"sampling failed: {exc!r}"[:512]))
        return out

    def _process(
        self, logits: torch.Tensor, processors: Sequence[SequenceLogitsProcessor | None]
    ) -> tuple[torch.Tensor, dict[int, str]]:
        """The logits with each row's rules applied (the same tensor when no row has any),
        and the rows whose rules failed, with why."""
        if not any(processors):
            return logits, {}
        if logits.device.type == "cpu":  # numpy copies without waking torch's thread team
            processed = torch.from_numpy(logits.float().numpy().copy())
        else:
            processed = logits.float().clone()
        mask = np.empty(bitmask_words(logits.shape[-1]), dtype=np.int32)
        failed: dict[int, str] = {}
        for row, processor in enumerate(processors):
            if processor is None:
                continue
            try:
                _apply_on_cpu(processor, processed[row], mask)
            except Exception as exc:
                log.exception("processing the logits of row %d failed", row)
                failed[row] = f"processing the logits failed: {exc!r}"[:512]
        return processed, failed

    def _sample_row(
        self, batch: _Cleaned, row: int, p: SamplingParams, position: int
    ) -> SampledToken:
        if not batch.usable[row]:
            return SampledToken(NO_TOKEN, None, "the model gave no token a finite logit")
        logits = batch.logits[row]
        if p.greedy:
            token = batch.greedy[row]
        else:
            token = _draw(logits, p, self._generator(p.seed, position))
        if not 0 <= token < logits.shape[-1] or logits[token] == _NEG_INF:
            # A draw can only land outside the candidates through a numerical accident;
            # the most likely token is then the one answer that is surely allowed.
            token = batch.greedy[row]
        lp = None
        if batch.logprobs is not None and p.logprobs is not None:
            lp = _token_logprobs(batch.logprobs[row], token, p.logprobs)
        return SampledToken(token, lp)

    def _generator(self, seed: int | None, position: int) -> torch.Generator:
        if seed is None:
            return self._random
        self._seeded.manual_seed(position_seed(seed, position))
        return self._seeded


def _apply_on_cpu(processor: SequenceLogitsProcessor, row: torch.Tensor, mask: np.ndarray) -> None:
    """The rules run on a numpy view of the row (a copy, written back, on another device)."""
    if row.device.type == "cpu":
        processor.apply(row.numpy(), mask)
        return
    on_cpu = row.cpu()
    processor.apply(on_cpu.numpy(), mask)
    row.copy_(on_cpu)


def position_seed(seed: int, position: int) -> int:
    """The 64-bit seed of the draw at ``position`` of a completion seeded with ``seed``."""
    data = seed.to_bytes(8, "little") + position.to_bytes(8, "little")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _draw(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    # Shifting the maximum to 0 keeps every scaled value finite or -inf: the best token keeps
    # weight 1, so the softmax always has mass. The floor keeps the divisor a normal float32.
    scaled = (logits - logits.max()) / max(p.temperature, MIN_TEMPERATURE)
    if 0 < p.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, _NEG_INF)
    if p.top_p < 1.0:
        scaled = _top_p_filter(scaled, p.top_p)
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose probability mass reaches top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # A token stays if the mass before it is still below top_p; the first token always stays.
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, _NEG_INF)


def _token_logprobs(row: torch.Tensor, token: int, num_top: int) -> TokenLogprobs:
    row = row.clamp(min=LOGPROB_FLOOR)
    top: list[tuple[int, float]] = []
    if num_top:
        values, ids = torch.topk(row, min(num_top, row.shape[-1]))
        top = list(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(token, float(row[token]), top)
