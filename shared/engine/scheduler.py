"""Decides, step by step, which sequences run and how many of their tokens are computed."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.engine.kv_manager import KVCacheManager
from shared.engine.partial_blocks import PartialHit
from shared.engine.sequence import Sequence, SequenceStatus
from shared.kv.pool import KVBlock


@dataclass(slots=True)
class ScheduledChunk:
    """``num_new`` tokens of ``seq`` starting at ``seq.num_computed_tokens``."""

    seq: Sequence
    num_new: int

    @property
    def reaches_end(self) -> bool:
        """True when this chunk computes the sequence's last known token, so it samples."""
        return self.seq.num_computed_tokens + self.num_new == self.seq.num_tokens


@dataclass(slots=True)
class RopeRestart:
    """A model whose tokens are all rotated anew once a sequence passes ``length`` (Phi-3's
    longrope): such a sequence is preempted there and ``rescope`` gives it its new cache
    scope, so it is computed again from its tokens, rotated for its new length."""

    length: int
    rescope: Callable[[Sequence], None]

    def due(self, seq: Sequence) -> bool:
        return not seq.rope_scope and seq.num_tokens > self.length


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work: single-token chunks first (decodes), then longer prompt chunks."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    """Owns the waiting queue and the running list.

    Each step gives every running sequence its next tokens first, decodes (one token each)
    before the chunks of prompts still being prefilled, then admits waiting sequences while
    the token budget, the sequence cap and the pool allow. Decodes go first so that a long
    prompt's chunks, each as large as the budget, never hold a running stream back for the
    rest of its prefill: they share each step with the decodes instead. When a running
    sequence cannot get a block, the most recently admitted one is preempted: its blocks go
    back to the pool (and stay in the prefix cache), and it is recomputed later from its
    tokens.
    """

    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        restart: RopeRestart | None = None,
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.restart = restart
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:
            self._admit_waiting(out, budget)
        out.chunks.sort(key=lambda c: c.num_new != 1)
        return out

    def remove(self, seq: Sequence, free_blocks: bool = True) -> None:
        """Takes a finished or aborted sequence out; its blocks go back to the pool unless the
        caller keeps them (a prefill node holds them until the decode node has pulled them)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if free_blocks:
            self.kv.free(seq)

    def resume(self, seq: Sequence) -> None:
        """Adds a sequence whose KV is already in its blocks straight to the running list."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # A stable sort: decodes first, each group in the order it was admitted.
        for seq in sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1):
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue
            if self.restart is not None and self.restart.due(seq):
                self._preempt(seq, out)
                self.restart.rescope(seq)
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate(seq, num_new):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.chunks.append(ScheduledChunk(seq, num_new))
                budget -= num_new
        return budget

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            cached: list[KVBlock] = []
            partial: PartialHit | None = None
            if seq.num_computed_tokens == 0:
                cached = self.kv.find_cached_prefix(seq)
                partial = self.kv.find_partial_block(seq, len(cached))
            reused = len(cached) * self.kv.block_size + (partial.num_tokens if partial else 0)
            num_computed = seq.num_computed_tokens + reused
            num_new = min(seq.num_tokens - num_computed, budget)
            if not self.kv.allocate(seq, num_new + reused, cached, partial):
                break
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = reused
            seq.num_computed_tokens = num_computed
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            seq.admitted_at = seq.admitted_at or time.monotonic()
            self.running.append(seq)
            out.chunks.append(ScheduledChunk(seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        out.chunks = [c for c in out.chunks if c.seq is not seq]
