"""The statuses of a sequence whose KV changes nodes: HELD on the prefill node that computed its
prompt, until the decode node has pulled its blocks; IMPORTING on that decode node, while those
blocks are written in. Each move checks the status it starts from."""

from __future__ import annotations

from shared.engine.kv_manager import KVCacheManager
from shared.engine.scheduler import Scheduler
from shared.engine.sequence import FinishReason, Sequence, SequenceStatus
from shared.engine.types import EngineStats, ImportSlot
from shared.errors import InvalidRequestError

HELD, IMPORTING = SequenceStatus.HELD, SequenceStatus.IMPORTING


class Handover:
    """Owns the moves into and out of HELD and IMPORTING. The engine owns the table of
    sequences; it drops a sequence once a move here leaves it FINISHED.

    Invariant: a HELD or IMPORTING sequence is in no scheduler queue and keeps a reference on
    each of its blocks, so nothing evicts them: a HELD one until ``release``, an IMPORTING
    one until ``finish_import`` hands it to the scheduler or the engine ends it.
    """

    def __init__(self, kv: KVCacheManager, scheduler: Scheduler, stats: EngineStats) -> None:
        self.kv = kv
        self.scheduler = scheduler
        self.stats = stats

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends a sequence that got its last token: out of the scheduler, and HELD with its
        blocks where its request asked (``Sequence.finishes_as``), else FINISHED and freed."""
        seq.finish_reason = reason
        seq.status = seq.finishes_as
        self.scheduler.remove(seq, free_blocks=seq.status is not HELD)

    def release(self, seq: Sequence | None) -> bool:
        """Frees a HELD sequence's blocks (they stay in the prefix cache) and ends it
        FINISHED; False, changing nothing, for any other sequence or none."""
        if seq is None or seq.status is not HELD:
            return False
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        return True

    def reserve(self, seq: Sequence, first_token: int) -> ImportSlot | None:
        """Moves a new sequence, whose prompt was computed elsewhere and sampled
        ``first_token``, to IMPORTING with blocks for its prompt: the leading ones this node
        caches and fresh ones the caller fills. None, changing nothing, when the pool has no
        room now."""
        assert seq.status is SequenceStatus.WAITING and not seq.block_table, "a new sequence"
        rules = seq.logits_processor
        if rules is not None and not rules.accept(first_token):
            raise InvalidRequestError("the first token does not follow the grammar", "grammar")
        hits = self.kv.find_cached_prefix(seq)
        if not self.kv.allocate(seq, seq.num_prompt_tokens, hits):
            return None
        seq.token_ids.append(first_token)
        seq.num_cached_tokens = len(hits) * self.kv.block_size
        seq.status = IMPORTING
        return ImportSlot(len(hits), [b.block_id for b in seq.block_table[len(hits) :]])

    def finish_import(self, seq: Sequence, ok: bool) -> None:
        """Hands an IMPORTING sequence to the scheduler: RUNNING with its KV in place when
        ``ok``, else WAITING with its blocks freed, to be computed here from its tokens.
        Raises ``KeyError`` for a sequence that is not importing."""
        if seq.status is not IMPORTING:
            raise KeyError(f"request {seq.request_id!r} is {seq.status.value}, not importing")
        if ok:
            seq.num_computed_tokens = seq.num_prompt_tokens
            imported = seq.num_prompt_tokens - (seq.num_cached_tokens or 0)
            self.stats.prompt_tokens_imported += imported
            self.kv.cache_computed_blocks(seq, computed_here=False)
            self.scheduler.resume(seq)
            return
        self.kv.free(seq)
        # What the import found cached says nothing of what the recomputation will reuse:
        # its admission looks again.
        seq.num_cached_tokens = None
        seq.status = SequenceStatus.WAITING
        self.scheduler.add(seq)
