"""The engine loop: requests in, one scheduled step at a time, token outputs out."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from shared.engine.cache_exchange import CacheExchange
from shared.engine.config import EngineConfig
from shared.engine.handover import Handover
from shared.engine.kv_manager import KVCacheManager
from shared.engine.request_checks import check_request_fits
from shared.engine.rope_scopes import RopeScopes
from shared.engine.runner import ModelRunner
from shared.engine.scheduler import RopeRestart, Scheduler, SchedulerOutput
from shared.engine.sequence import FinishReason, Sequence, SequenceStatus
from shared.engine.sequence_rules import finish_reason, logits_processor
from shared.engine.step_threads import StepThreads
from shared.engine.types import (
    EngineLoad,
    EngineStats,
    ImportSlot,
    RequestOutput,
    StepTiming,
)
from shared.errors import InvalidRequestError
from shared.kv.checksum import BlockChecksum
from shared.kv.hashing import BlockHash, quota_key, root_hash
from shared.kv.keeps import PINNED, PoolKeeps
from shared.kv.pool import BlockPool
from shared.model.grammar import Grammars
from shared.model.sampler import SampledToken
from shared.sampling_params import SamplingParams

log = logging.getLogger(__name__)
Sampled = list[tuple[Sequence, SampledToken]]
MAX_ERROR_LENGTH = 512


class LLMEngine:
    """Owns the scheduler, the KV cache manager, the model runner and the one table of the
    sequences it knows, by request id, from their arrival until their blocks are freed. Each
    one's status says where it lives (``SequenceStatus``): WAITING or RUNNING in the
    scheduler, IMPORTING or HELD outside it (``Handover``); none in the table is FINISHED.

    Threading contract. One thread (a node's engine thread) drives ``step`` and makes every
    call that changes requests (``add_request``, ``abort_request``, ``begin_import``,
    ``finish_import``, ``fail_all``), between two steps and holding ``lock``. Other threads
    only do bookkeeping that leaves the WAITING, RUNNING and IMPORTING sequences and their
    blocks alone (``held_block_ids``, ``release_held``, ``load``, the exchange's pins and
    cached-block imports, the pool's counters), holding ``lock``. ``step`` holds ``lock``
    while it plans and while it books its results, but not during the forward pass and its
    thread count (``_execute``, ``StepThreads``): that pass reads and writes only the KV of
    the batch's own blocks, which bookkeeping never touches, so heartbeats, pins and
    releases need not wait for a long prefill.
    """

    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig,
        model_id: str,
        grammars: Grammars | None = None,
        checksum: BlockChecksum | None = None,
    ):
        self.config = config
        # The key of the checksums its blocks carry to other nodes and tiers: a node sets its
        # cache secret's; an engine whose blocks never leave the process keeps the empty one.
        self.checksum = checksum if checksum is not None else BlockChecksum(b"")
        self.grammars = grammars  # None: requests with a grammar are refused
        self.runner = runner
        self.model_id = model_id
        self.pool = BlockPool(config.num_kv_blocks)
        self.kv = KVCacheManager(
            self.pool, config.block_size, config.enable_prefix_caching, runner.cache.copy_block
        )
        self._rope_scopes = RopeScopes(runner.model.config, self._root)
        restart_at = runner.model.config.rope_restart_length
        restart = None if restart_at is None else RopeRestart(restart_at, self._rope_scopes.rescope)
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            restart,
            by_deadline=config.prefill_order != "arrival",
            tenant_step_s=config.tenant_step_s,
        )
        # The prompt blocks requests asked to keep (``SamplingParams.keep``).
        self.keeps = PoolKeeps(self.pool)
        self.exchange = CacheExchange(
            self.pool, config.block_size, self._root, self._checksum, self.keeps
        )
        self.eos_token_ids = frozenset(config.eos_token_ids)
        self.stats = EngineStats()
        self._sequences: dict[str, Sequence] = {}
        self.handover = Handover(self.kv, self.scheduler, self.stats)
        self._roots: dict[bytes, BlockHash] = {}
        self.lock = threading.RLock()
        # Recent step timings, drained by the node into its heartbeats.
        self.step_timings: deque[StepTiming] = deque(maxlen=256)
        # Each step's thread count: the host's core ledger share, one for prompt steps while
        # processes outside the ledger take cores.
        self.threads = StepThreads()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: bytes = b"",
        hold_blocks: bool = False,
    ) -> None:
        """Queues a request; raises ``InvalidRequestError`` if it can never be served.

        With ``hold_blocks`` the request's blocks stay referenced when it finishes, until
        ``release_held`` — how a prefill node keeps a prompt's KV until it is pulled.
        """
        seq = self._new_sequence(request_id, prompt_token_ids, params, cache_salt)
        if hold_blocks:
            seq.finishes_as = SequenceStatus.HELD
        self._sequences[request_id] = seq
        self.scheduler.add(seq)

    def held_block_ids(self, request_id: str) -> list[int] | None:
        """Block ids of a finished request whose blocks are held, in token order."""
        seq = self._sequences.get(request_id)
        if seq is None or seq.status is not SequenceStatus.HELD:
            return None
        return [b.block_id for b in seq.block_table]

    def release_held(self, request_id: str) -> bool:
        """Returns a held request's blocks to the pool (they stay in the prefix cache)."""
        if not self.handover.release(self._sequences.get(request_id)):
            return False
        del self._sequences[request_id]
        return True

    def begin_import(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        first_token: int,
        params: SamplingParams,
        cache_salt: bytes = b"",
    ) -> ImportSlot | None:
        """Reserves blocks for a prompt computed elsewhere, whose first output token is known.

        Leading blocks this node already caches are reused; the slot says which prompt blocks
        the caller must fill (by writing their bytes into the KV tensor) before
        ``finish_import``. None when the pool has no room now.
        """
        seq = self._new_sequence(request_id, prompt_token_ids, params, cache_salt)
        slot = self.handover.reserve(seq, first_token)
        if slot is not None:
            self._sequences[request_id] = seq
        return slot

    def finish_import(self, request_id: str, ok: bool) -> None:
        """Starts decoding an imported request. If its blocks could not be filled, it is
        recomputed from its tokens instead: slower, never wrong. Raises ``KeyError`` when
        the request is not importing (unknown, aborted or already finished importing)."""
        seq = self._sequences.get(request_id)
        if seq is None:
            raise KeyError(
                f"request {request_id!r} is not importing: the engine has no such request"
            )
        self.handover.finish_import(seq, ok)

    def abort_request(self, request_id: str) -> bool:
        """Drops a request and frees its blocks; False if it was not in flight (a held one is
        not: its blocks wait for ``release_held``)."""
        seq = self._sequences.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self._end(seq, FinishReason.ABORT)
        return True

    def fail_all(self, error: str) -> list[RequestOutput]:
        """Ends every request in flight, importing ones included, with an error output: the
        last resort of a host whose steps keep failing for a reason the engine cannot pin on
        any request. Held requests stay held: their KV is computed, and a pull may want it."""
        in_flight = [s for s in self._sequences.values() if not s.is_finished]
        return [self._fail(seq, error) for seq in in_flight]

    def load(self) -> EngineLoad:
        """A snapshot of how busy the engine is, for heartbeats and placement."""
        queued = sum(s.num_tokens - s.num_computed_tokens for s in self.scheduler.waiting)
        queued += sum(
            s.num_tokens - s.num_computed_tokens
            for s in self.scheduler.running
            if s.num_computed_tokens < s.num_prompt_tokens
        )
        return EngineLoad(
            queued_tokens=queued,
            running_seqs=len(self.scheduler.running),
            waiting_seqs=len(self.scheduler.waiting),
            free_blocks=self.pool.num_free_blocks,
            total_blocks=self.pool.num_blocks,
            held_requests=sum(s.status is SequenceStatus.HELD for s in self._sequences.values()),
        )

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_unfinished_requests(self) -> int:
        """Requests waiting, running or importing (held ones have finished)."""
        with self.lock:  # ``release_held`` may change the table from a bookkeeping thread
            return sum(not s.is_finished for s in self._sequences.values())

    def step(self) -> list[RequestOutput]:
        """Runs one batch through the model and returns the requests that got a token, or
        that failed (an error output each). It never raises because the model did.

        ``lock`` is held while the step plans and while it books its results, not while the
        model runs, so bookkeeping that leaves the batch's sequences alone (heartbeat
        snapshots, pins for peers) need not wait for a long forward pass.
        """
        with self.lock:
            self.keeps.expire(time.time())
            plan = self.scheduler.schedule()
            if plan.is_empty():
                return []
            context = sum(c.seq.num_computed_tokens for c in plan.chunks)
        self.threads.begin(op_by_op=not self.runner.fuses(plan))
        started = time.perf_counter()
        try:
            sampled, failed = self._execute(plan)
        finally:
            elapsed = time.perf_counter() - started
            self.threads.end(elapsed)
        with self.lock:
            tokens = sum(c.num_new for c in plan.chunks)
            self.step_timings.append(StepTiming(len(plan.chunks), tokens, context, elapsed))
            self.stats.note_prompt_step(tokens, elapsed)
            self.scheduler.prompt_token_s = self.stats.prompt_token_s
            self._advance(plan, failed)
            self.stats.steps += 1
            self.stats.failed_steps += bool(failed)
            self.stats.preemptions += len(plan.preempted)
            outputs = [self._fail(seq, error) for seq, error in failed.items()]
            outputs += [self._append(seq, token) for seq, token in sampled]
            if not self.has_unfinished_requests():
                self.threads.idle()
            return outputs

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[RequestOutput]:
        """Convenience for scripts and tests: runs prompts to completion as one batch."""
        ids = [f"gen-{id(self)}-{i}" for i in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts, strict=True):
            self.add_request(request_id, prompt, params)
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def _execute(self, plan: SchedulerOutput) -> tuple[Sampled, dict[Sequence, str]]:
        """The step's sampled tokens, and the sequences that failed it with the reason.

        When the batch raises, each chunk runs again alone (it rewrites the same KV slots, so
        that is safe): the chunks that still fail are the culprits and the others keep their
        results. When no chunk fails alone the cause is unknown, and the whole batch fails,
        once, rather than being retried forever.
        """
        try:
            return self.runner.execute(plan), {}
        except Exception as exc:
            log.exception("a step of %d sequences failed; retrying each alone", len(plan.chunks))
            cause = _describe(exc)
        sampled: Sampled = []
        failed: dict[Sequence, str] = {}
        for chunk in plan.chunks if len(plan.chunks) > 1 else ():
            try:
                sampled += self.runner.execute(SchedulerOutput([chunk]))
            except Exception as exc:
                log.exception("request %s fails on its own", chunk.seq.request_id)
                failed[chunk.seq] = _describe(exc)
        if not failed:
            return [], {c.seq: cause for c in plan.chunks}
        return sampled, failed

    def _fail(self, seq: Sequence, error: str) -> RequestOutput:
        """Ends a sequence with an error output. Its blocks go back to the pool even when it
        asked to hold them: nobody would ever release a failed request's blocks."""
        self._end(seq, FinishReason.ERROR)
        self.stats.failed_requests += 1
        return RequestOutput.of(seq, [], [], error)

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        """Ends an unfinished sequence FINISHED, out of the scheduler and the table, its
        blocks freed (an importing one's too: ``remove`` frees those of one in no queue)."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.scheduler.remove(seq)
        del self._sequences[seq.request_id]

    def _advance(self, plan: SchedulerOutput, failed: dict[Sequence, str]) -> None:
        for chunk in plan.chunks:
            seq = chunk.seq
            if seq in failed:
                continue
            start = seq.num_computed_tokens
            prompt_part = max(0, min(seq.num_prompt_tokens, start + chunk.num_new) - start)
            seq.num_prompt_tokens_computed += prompt_part
            self.stats.prompt_tokens_computed += prompt_part
            seq.num_computed_tokens += chunk.num_new
            self.kv.cache_computed_blocks(seq)
            if seq.params.keep and start < seq.num_prompt_tokens <= seq.num_computed_tokens:
                self._keep_prompt(seq)

    def _keep_prompt(self, seq: Sequence) -> None:
        """Applies a request's keep to its prompt's full blocks, now all computed or found
        cached: a keep of the tenant's ledger the scheduler recorded before placing it."""
        hashes = self.kv.prompt_block_hashes(seq)
        p, now = seq.params, time.time()
        if p.keep == "drop":
            self.keeps.release(hashes)
            return
        until = PINNED if p.keep == "pin" else now + p.keep_ttl_s
        kept = self.keeps.keep(hashes, until, now)
        if kept < len(hashes):
            log.info(
                "kept %d of the %d prompt blocks of %s (the keeps hold %d of %d blocks)",
                kept, len(hashes), seq.request_id, len(self.keeps), self.keeps.max_kept,
            )  # fmt: skip

    def _append(self, seq: Sequence, sampled: SampledToken) -> RequestOutput:
        if sampled.error is not None:
            return self._fail(seq, sampled.error)
        if seq.num_output_tokens == 0:
            self.stats.prompt_tokens_cached += seq.num_cached_tokens or 0
        rules = seq.logits_processor
        if rules is not None and not rules.accept(sampled.token_id):
            return self._fail(seq, "the sampled token does not follow the grammar")
        seq.token_ids.append(sampled.token_id)
        if sampled.logprobs is not None:
            seq.output_logprobs.append(sampled.logprobs)
        self.stats.output_tokens += 1
        reason = finish_reason(seq, sampled.token_id, self.eos_token_ids, self.config.max_model_len)
        if reason is not None:
            self.handover.finish(seq, reason)
            if seq.status is SequenceStatus.FINISHED:
                del self._sequences[seq.request_id]
        logprobs = [sampled.logprobs] if sampled.logprobs is not None else []
        return RequestOutput.of(seq, [sampled.token_id], logprobs)

    def _new_sequence(
        self, request_id: str, prompt: list[int], params: SamplingParams, cache_salt: bytes
    ) -> Sequence:
        if request_id in self._sequences:  # held ones too: their id names their blocks
            raise InvalidRequestError(
                f"request id {request_id!r} is already in flight", "request_id"
            )
        check_request_fits(prompt, params, self.runner.model.config.vocab_size, self.config)
        seq = Sequence(request_id, list(prompt), params, b"", arrival=time.time())
        self._rope_scopes.assign(seq, cache_salt, params.output_offset)
        seq.quota_key = quota_key(cache_salt)
        seq.logits_processor = logits_processor(
            prompt, params, self.grammars, self.runner.model.config.vocab_size, self.eos_token_ids
        )
        return seq

    def _checksum(self, block_id: int) -> int:
        return self.checksum(self.runner.cache.block_buffer(block_id).data)

    def _root(self, cache_salt: bytes) -> BlockHash:
        root = self._roots.get(cache_salt)
        if root is None:
            root = root_hash(
                self.model_id, self.config.block_size, self.config.kv_dtype, cache_salt
            )
            self._roots[cache_salt] = root
        return root


def _describe(exc: Exception) -> str:
    return f"the engine failed on this request: {type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]
