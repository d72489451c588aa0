"""The logits rules of one sequence that depend on what it generated: logit bias, the
repetition, frequency and presence penalties, min_tokens and the grammar mask.

Applied in that order to the raw logits of a row, before temperature and the top-k/top-p
filters (``shared.model.sampler``):

1. ``logit_bias``: ``l[t] += bias[t]``;
2. ``repetition_penalty`` ``r`` for every token ``t`` in the prompt or the completion:
   ``l[t] / r`` where ``l[t] > 0``, else ``l[t] * r``;
3. ``frequency_penalty`` ``f`` and ``presence_penalty`` ``p``, with ``c[t]`` the number of times
   ``t`` appears in the completion: ``l[t] -= f * c[t] + p * (c[t] > 0)``;
4. ``min_tokens``: while the completion is shorter, its stop tokens (the end-of-sequence ids
   unless ``ignore_eos``, and ``stop_token_ids``) get ``-inf``;
5. the grammar: every token it does not allow next gets ``-inf``.

The rules run on numpy arrays, one row at a time: a row is 49,152 values here, and numpy's
single-threaded loops cost a few microseconds each where torch's elementwise ops wake a team
of threads for every one of them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from shared.model.grammar import GrammarMatcher
from shared.sampling_params import SamplingParams

_NEG_INF = float("-inf")


def bitmask_words(vocab_size: int) -> int:
    """int32 words of a bitmask with one bit per token."""
    return (vocab_size + 31) // 32


def apply_bitmask(row: np.ndarray, mask: np.ndarray) -> None:
    """Sets to ``-inf`` every value of ``row`` whose bit in ``mask`` (int32 words, low bit
    first) is 0."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[: row.shape[-1]]
    np.copyto(row, _NEG_INF, where=~bits.view(np.bool_))


class SequenceLogitsProcessor:
    """Owns what one sequence's rules remember: how often each token was generated (for the
    frequency and presence penalties), which tokens prompt and completion hold (for the
    repetition penalty), the completion's length (for min_tokens) and the grammar matcher.

    Invariant: it has seen every token of the completion exactly once, in order: those before
    ``params.output_offset`` (which end the prompt of a resumed sequence) when it was made,
    the others through ``accept``.
    """

    __slots__ = ("_banned", "_bias", "_counts", "_seen", "generated", "matcher", "params")

    def __init__(
        self,
        params: SamplingParams,
        vocab_size: int,
        prompt: Sequence[int],
        eos_token_ids: Collection[int],
        matcher: GrammarMatcher | None = None,
    ) -> None:
        self.params = params
        self.matcher = matcher
        self.generated = 0
        p = params
        self._counts: np.ndarray | None = None
        if p.frequency_penalty or p.presence_penalty:
            self._counts = np.zeros(vocab_size, dtype=np.float32)
        self._seen: np.ndarray | None = None
        if p.repetition_penalty != 1.0:
            self._seen = np.zeros(vocab_size, dtype=np.bool_)
            self._seen[np.asarray(prompt, dtype=np.int64)] = True
        self._bias: tuple[np.ndarray, np.ndarray] | None = None
        if p.logit_bias:
            ids, values = zip(*p.logit_bias, strict=True)
            self._bias = (np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=np.float32))
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
        self._banned = np.asarray(sorted(stops), dtype=np.int64)
        start = len(prompt) - p.output_offset
        for token in prompt[start:] if p.output_offset else ():
            self._count(token)

    def accept(self, token_id: int) -> bool:
        """Takes the token just generated; False if the grammar did not allow it."""
        self._count(token_id)
        if self._seen is not None:
            self._seen[token_id] = True
        return self.matcher is None or self.matcher.accept(token_id)

    def _count(self, token_id: int) -> None:
        self.generated += 1
        if self._counts is not None:
            self._counts[token_id] += 1

    @property
    def finished(self) -> bool:
        """The grammar is complete: nothing but an end-of-sequence token may follow."""
        return self.matcher is not None and self.matcher.finished

    def apply(self, row: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Applies every rule, in place, to one row of float32 logits. ``mask`` is a scratch
        bitmask (int32, contiguous) the grammar is written into."""
        p = self.params
        if self._bias is not None:
            np.add.at(row, *self._bias)
        if self._seen is not None:
            r = np.float32(p.repetition_penalty)
            positive = row > 0
            row[self._seen & positive] /= r
            row[self._seen & ~positive] *= r
        if self._counts is not None:
            penalty = self._counts * np.float32(p.frequency_penalty)
            penalty += (self._counts > 0).astype(np.float32) * np.float32(p.presence_penalty)
            row -= penalty
        if self.generated < p.min_tokens and self._banned.size:
            row[self._banned] = _NEG_INF
        if self.matcher is not None:
            if mask is None:
                mask = np.empty(bitmask_words(row.shape[-1]), dtype=np.int32)
            self.matcher.fill_bitmask(mask.ctypes.data, mask.nbytes)
            apply_bitmask(row, mask)
