"""Decides, step by step, which sequences run and how many of their tokens are computed."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from shared.engine.kv_manager import KVCacheManager
from shared.engine.partial_blocks import PartialHit
from shared.engine.prefill_order import (
    MIN_PREFILL_SHARE,
    feasible_first,
    share_budget,
    urgency,
)
from shared.engine.sequence import Sequence, SequenceStatus
from shared.engine.tenant_share import TenantService, contended_budget, favour, in_turns
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

    Each step gives every running sequence that decodes its next token first, then shares
    what is left of the token budget between the prompts being prefilled and those waiting to
    be admitted, most urgent first (``shared.engine.prefill_order``: by TTFT deadline and
    priority; those whose rest fits an equal share finish first, the most urgent of the others
    takes what is left; a prompt that cannot meet its due time at ``prompt_token_s`` yields
    to those that can; tenants take weighted turns, the least served for its weight first:
    ``tenant_share``; while several tenants were served lately, the least served computes as
    it would alone and the others' prompt tokens in a step take no longer than
    ``tenant_step_s``), while the sequence cap and the pool allow; with
    ``by_deadline`` False, in arrival order, each taking whole steps. Decodes go first so that
    a long prompt's chunks never hold a running stream back for the rest of its prefill, and a
    short prompt is not held back for the whole of a long one either. When a running sequence
    cannot get a block, the most recently admitted one is preempted: its blocks go back to the
    pool (and stay in the prefix cache), and it is recomputed later from its tokens.
    """

    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        restart: RopeRestart | None = None,
        min_share: int = MIN_PREFILL_SHARE,
        by_deadline: bool = True,
        tenant_step_s: float = 0.0,
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.restart = restart
        self.min_share = min_share
        # False: first come, first served, each prompt taking whole steps (vLLM's fcfs).
        self.by_deadline = by_deadline
        self.tenants = TenantService()
        # While tenants share the node, the longest the prompt tokens of all but the least
        # served take in a step (0: no bound).
        self.tenant_step_s = tenant_step_s
        # Seconds a prompt token takes on this node lately (0: not measured yet); the engine
        # keeps it current from its steps (``EngineStats.prompt_token_s``).
        self.prompt_token_s = 0.0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_decodes(out, self.max_num_batched_tokens)
        self._schedule_prompts(out, budget)
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

    def urgency(self, seq: Sequence) -> float:
        if not self.by_deadline:
            return seq.arrival
        return urgency(seq.params.priority, seq.params.ttft_deadline, seq.arrival)

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        for seq in list(self.running):  # in the order they were admitted
            if budget == 0:
                break
            if (
                seq.status is SequenceStatus.RUNNING
                and _left(seq) == 1
                and self._place(seq, 1, out)
            ):
                budget -= 1
        return budget

    def _schedule_prompts(self, out: SchedulerOutput, budget: int) -> None:
        prompts = [s for s in self.running if s.status is SequenceStatus.RUNNING and _left(s) > 1]
        room = self.max_num_seqs - len(self.running)
        waiting = [] if out.preempted or room <= 0 else self._most_urgent_waiting(room)
        now = time.monotonic()
        left = {id(s): self._left_to_compute(s) for s in prompts + waiting}
        if self.by_deadline:
            wall = time.time()
            candidates = in_turns(
                prompts + waiting,
                _tenant,
                lambda seq: self._placed_by(seq, left[id(seq)], wall),
                lambda t: self.tenants.served(t, now),
                lambda seq: left[id(seq)],
                lambda seq: seq.params.tenant_weight,
            )
        else:
            candidates = sorted(prompts + waiting, key=self.urgency)
        min_share = self.min_share if self.by_deadline else 0
        remaining = [left[id(s)] for s in candidates]
        grants = share_budget(remaining, budget, min_share)
        if self.by_deadline:
            grants = self._favour_least_served(candidates, grants, budget, now)
        admitting = True
        for seq, grant in zip(candidates, grants, strict=True):
            if grant == 0:
                continue
            if seq.status is SequenceStatus.RUNNING:
                placed = self._place(seq, grant, out)
            elif seq.status is SequenceStatus.WAITING and admitting and not out.preempted:
                # The first that does not fit stops admissions: later ones, smaller maybe,
                # would take the blocks the more urgent one waits for.
                placed = admitting = self._admit(seq, grant, out)
            else:
                placed = False
            if placed:
                self.tenants.add(_tenant(seq), grant, now, seq.params.tenant_weight)

    def _favour_least_served(
        self, candidates: list[Sequence], grants: list[int], budget: int, now: float
    ) -> list[int]:
        """``grants``, the tenants other than the one served least lately bounded to a step
        of ``tenant_step_s`` while several tenants are active (``tenant_share``)."""
        if not candidates or self.tenant_step_s <= 0 or self.prompt_token_s <= 0:
            return grants  # nothing to bound: spare the hot path the tenants' tally
        tenants = [_tenant(s) for s in candidates]
        active = self.tenants.active(now, tenants)
        cap = contended_budget(budget, len(active), self.tenant_step_s, self.prompt_token_s)
        if cap >= budget:
            return grants
        return favour(grants, tenants, self.tenants.favoured(active, now), cap)

    def _placed_by(self, seq: Sequence, left_tokens: int, now: float) -> float:
        """Its urgency, after every prompt that can still meet its due time if it cannot."""
        return feasible_first(self.urgency(seq), left_tokens, now, self.prompt_token_s)

    def _most_urgent_waiting(self, count: int) -> list[Sequence]:
        return sorted(self.waiting, key=self.urgency)[:count]

    def _left_to_compute(self, seq: Sequence) -> int:
        """Tokens a sequence has left to compute; for one not admitted yet, less what the
        prefix cache would give it now."""
        if seq.status is SequenceStatus.WAITING and seq.num_computed_tokens == 0:
            return seq.num_tokens - self._reuse(seq)[2]
        return _left(seq)

    def _reuse(self, seq: Sequence) -> tuple[list[KVBlock], PartialHit | None, int]:
        cached = self.kv.find_cached_prefix(seq)
        partial = self.kv.find_partial_block(seq, len(cached))
        reused = len(cached) * self.kv.block_size + (partial.num_tokens if partial else 0)
        return cached, partial, reused

    def _place(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> bool:
        """Schedules ``num_new`` more tokens of a running sequence, preempting the most
        recently admitted ones while the pool is short; False if ``seq`` itself was."""
        if self.restart is not None and self.restart.due(seq):
            self._preempt(seq, out)
            self.restart.rescope(seq)
            return False
        while not self.kv.allocate(seq, num_new):
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        out.chunks.append(ScheduledChunk(seq, num_new))
        return True

    def _admit(self, seq: Sequence, grant: int, out: SchedulerOutput) -> bool:
        cached: list[KVBlock] = []
        partial: PartialHit | None = None
        reused = 0
        if seq.num_computed_tokens == 0:  # looked up again: blocks may have moved since
            cached, partial, reused = self._reuse(seq)
        num_computed = seq.num_computed_tokens + reused
        num_new = min(seq.num_tokens - num_computed, grant)
        if not self.kv.allocate(seq, num_new + reused, cached, partial):
            return False
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = reused
        seq.num_computed_tokens = num_computed
        self.waiting.remove(seq)
        seq.status = SequenceStatus.RUNNING
        seq.admitted_at = seq.admitted_at or time.monotonic()
        self.running.append(seq)
        out.chunks.append(ScheduledChunk(seq, num_new))
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        out.chunks = [c for c in out.chunks if c.seq is not seq]


def _tenant(seq: Sequence) -> bytes:
    return seq.quota_key  # the keyed hash of its tenant: the scope its blocks count against


def _left(seq: Sequence) -> int:
    return seq.num_tokens - seq.num_computed_tokens
