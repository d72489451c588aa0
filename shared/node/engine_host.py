"""The engine as a node sees it: one narrow facade over ``LLMEngine`` with one threading
contract, the step loop that drives it, and the watchdog that notices a stuck step."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from shared.cluster_messages import MAX_FINISHING
from shared.engine.cache_exchange import CachedBlock, PrefixImport
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.types import EngineLoad, EngineStats, ImportSlot, RequestOutput, StepTiming
from shared.kv.hashing import BlockHash
from shared.lifecycle import awaited_task
from shared.model.kv_cache import PagedKVCache
from shared.node.step_loop import StepLoop
from shared.sampling_params import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A step is stuck past this many times the time a full step takes at the measured speed.
FULL_STEP_MARGIN = 3.0
OnOutputs = Callable[[list[RequestOutput]], Awaitable[None]]


@dataclasses.dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """``finishing``: ``(tokens it may still generate, tokens in its KV)`` of the running
    sequences nearest their ``max_tokens``, fewest remaining first."""

    load: EngineLoad
    stats: EngineStats
    timings: list[StepTiming]
    finishing: list[tuple[int, int]]
    unsunk_blocks: int = 0
    cached_blocks: int = 0
    pool_evictions: int = 0


def engine_thread() -> ThreadPoolExecutor:
    """The thread a node's engine steps on, and with ``CRESCENT_ENGINE_THREAD_LOAD`` (the
    default) is loaded on. OpenMP (torch's intra-op pool) gives every thread that runs
    parallel work a team of its own, and once a process has more such threads than cores,
    libgomp stops spinning between parallel regions and sleeps instead: a prefill's hundreds
    of regions then each wait for a wake-up. Loading here keeps one team per process."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")


class EngineHost:
    """Owns the engine thread, the step loop and the watchdog of one node's engine.

    Threading contract. Two kinds of call reach the engine, and nothing else does:

    * **Changes** (``add``, ``abort``, ``begin_import``, ``finish_import``, ``admit``): run on
      the engine thread, between two steps, so no request changes while a step runs.
    * **Bookkeeping** (``pin``, ``unpin``, ``offer_sink``, ``mark_sunk``, ``forget_sunk``,
      ``held_block_ids``, ``release_held``, ``num_leading_cached``, ``begin_prefix_import``,
      ``drain_events``, ``snapshot``, ``load_snapshot``): run on a bookkeeping thread holding
      the engine's lock. A step holds that lock while it plans and while it books its
      results, but not during its forward pass, so these calls may overlap a forward pass;
      they touch only blocks no running sequence is writing (cached, pinned, held or free
      blocks) and the pool's counters.

    The steps themselves run back to back on the engine thread (``StepLoop``), which queues
    each step's outputs for the event loop to deliver in order while the next step runs.

    Invariant: the step loop never ends while the host runs: a failing step, or a failing
    output handler, is logged and contained. ``stuck`` reports a step running longer than
    ``step_timeout_s`` (longer for a model whose full step is measured to take longer); the
    node then reports itself unhealthy and gets no new work.
    """

    def __init__(
        self,
        engine: LLMEngine,
        on_outputs: OnOutputs,
        step_timeout_s: float,
        thread: ThreadPoolExecutor | None = None,
    ) -> None:
        self.engine = engine
        self._on_outputs = on_outputs
        self.step_timeout_s = step_timeout_s
        # ``thread``: the one that may have loaded the engine (see ``engine_thread``).
        self._thread = thread or engine_thread()
        self._books = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-books")
        self._steps = StepLoop(engine, self._thread, self._enqueue)
        self._outputs: asyncio.Queue[list[RequestOutput] | None] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.loop_ended = False

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Its owner awaits it in ``stop``, and ``_loop_done`` reports its failure.
        self._task = awaited_task(self._deliveries(), "engine-deliveries")
        self._task.add_done_callback(self._loop_done)
        self._steps.start().add_done_callback(self._steps_done)

    async def stop(self) -> None:
        await asyncio.to_thread(self._steps.stop)
        self._outputs.put_nowait(None)
        if self._task is not None:
            await self._task
        self._thread.shutdown(wait=True)
        self._books.shutdown(wait=True)

    def stuck(self, now: float | None = None) -> bool:
        """True while a step has run longer than ``step_bound_s`` (or the loop died)."""
        if self.loop_ended:
            return True
        started = self._steps.step_started
        now = time.monotonic() if now is None else now
        return started is not None and now - started > self.step_bound_s()

    def step_bound_s(self) -> float:
        """``step_timeout_s``, or ``FULL_STEP_MARGIN`` times a full step (the engine's token
        budget at its measured speed) where that is longer: a large model's prompt step on a
        CPU can rightly take minutes."""
        engine = self.engine
        full_step_s = engine.config.max_num_batched_tokens * engine.stats.prompt_token_s
        return max(self.step_timeout_s, FULL_STEP_MARGIN * full_step_s)

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def cache(self) -> PagedKVCache:
        """The KV tensor pulls write into and the block server reads from."""
        return self.engine.runner.cache

    @property
    def block_bytes(self) -> int:
        return self.engine.runner.cache.layout.block_bytes

    def block_checksums(self, block_ids: list[int]) -> list[int]:
        """The checksums of blocks no running sequence writes (held or cached ones), in the
        node's key; safe off the engine thread."""
        cache, checksum = self.engine.runner.cache, self.engine.checksum
        return [checksum(cache.block_buffer(b).data) for b in block_ids]

    def pool_usage(self) -> tuple[int, int]:
        """(blocks in the pool, blocks holding KV someone may want: referenced or cached).
        Read without the lock: two counters, a beat's worth of staleness is fine."""
        pool = self.engine.pool
        used = pool.num_blocks - pool.num_free_blocks + pool.num_cached_blocks
        return pool.num_blocks, min(pool.num_blocks, used)

    async def follow_keeps(self, ledger: dict[bytes, float], asked_at: float) -> int:
        """Applies the tenants' keep ledger to the pool; returns how many keeps ended."""
        keeps = self.engine.keeps
        return await self._book(lambda: keeps.follow(ledger, asked_at, time.time()))

    @property
    def last_step_s(self) -> float:
        """How long the last engine step took, timed on the engine's thread."""
        return self._steps.last_step_s

    # -- changes (engine thread, between steps) -------------------------------------------

    async def add(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        salt: bytes,
        *,
        hold_blocks: bool = False,
        imports: Sequence[tuple[PrefixImport, list[int]]] = (),
    ) -> None:
        """Caches pulled prefix blocks (each import with its verified checksums) and queues
        the request in the same call, so nothing evicts the pulled blocks in between.
        Raises ``InvalidRequestError`` if the engine can never serve it."""
        engine = self.engine

        def admit() -> None:
            for imp, checksums in imports:
                engine.exchange.finish_import(imp, checksums)
            engine.add_request(request_id, prompt, params, salt, hold_blocks=hold_blocks)

        await self._change(admit)

    async def cache_imports(self, imports: Sequence[tuple[PrefixImport, list[int]]]) -> None:
        """Caches pulled blocks without a request (their request went away meanwhile)."""

        def finish() -> None:
            for imp, checksums in imports:
                self.engine.exchange.finish_import(imp, checksums)

        await self._change(finish)

    async def abort(self, request_id: str) -> bool:
        return await self._change(lambda: self.engine.abort_request(request_id))

    async def begin_import(
        self,
        request_id: str,
        prompt: list[int],
        first_token: int,
        params: SamplingParams,
        salt: bytes,
    ) -> ImportSlot | None:
        return await self._change(
            lambda: self.engine.begin_import(request_id, prompt, first_token, params, salt)
        )

    async def finish_import(self, request_id: str, ok: bool) -> None:
        await self._change(lambda: self.engine.finish_import(request_id, ok))

    async def _change(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._steps.submit(self._locked(fn)))

    # -- bookkeeping (under the lock, may overlap a forward pass) -------------------------

    async def held_block_ids(self, request_id: str) -> list[int] | None:
        return await self._book(lambda: self.engine.held_block_ids(request_id))

    async def release_held(self, request_id: str) -> bool:
        return await self._book(lambda: self.engine.release_held(request_id))

    async def pin(self, hashes: list[BlockHash]) -> list[tuple[int, int]]:
        """Pins the leading cached blocks of ``hashes``; the caller's lease owns the pin."""
        return await self._book(lambda: self.engine.exchange.pin(hashes))

    async def unpin(self, block_ids: list[int]) -> None:
        await self._book(lambda: self.engine.exchange.unpin(block_ids))

    async def offer_sink(
        self, max_blocks: int, skip: Callable[[BlockHash], bool]
    ) -> list[CachedBlock]:
        return await self._book(lambda: self.engine.exchange.offer_sink(max_blocks, skip))

    async def mark_sunk(self, hashes: list[BlockHash]) -> int:
        return await self._book(lambda: self.engine.pool.mark_sunk(hashes))

    async def forget_sunk(self) -> None:
        await self._book(self.engine.pool.forget_sunk)

    def prompt_hashes(self, prompt: list[int], salt: bytes) -> list[BlockHash]:
        """Pure hashing: needs no lock."""
        return self.engine.exchange.prompt_hashes(prompt, salt)

    async def num_leading_cached(self, hashes: list[BlockHash]) -> int:
        return await self._book(lambda: self.engine.exchange.num_leading_cached(hashes))

    async def begin_prefix_import(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        first_block: int,
        num_blocks: int,
    ) -> PrefixImport | None:
        exchange = self.engine.exchange
        return await self._book(
            lambda: exchange.begin_import(prompt, salt, hashes, first_block, num_blocks)
        )

    async def drain_events(self) -> tuple[list[CachedBlock], list[BlockHash]]:
        return await self._book(self.engine.exchange.drain_events)

    async def snapshot(self) -> list[CachedBlock]:
        return await self._book(self.engine.exchange.snapshot)

    async def load_snapshot(self) -> LoadSnapshot:
        engine = self.engine

        def take() -> LoadSnapshot:
            timings = list(engine.step_timings)[-64:]
            engine.step_timings.clear()
            running = engine.scheduler.running
            finishing = sorted(
                (max(s.params.max_tokens - s.num_output_tokens, 0), s.num_tokens) for s in running
            )[:MAX_FINISHING]
            stats = dataclasses.replace(engine.stats)
            pool = engine.pool
            return LoadSnapshot(
                engine.load(), stats, timings, finishing, pool.num_unsunk,
                pool.num_cached_blocks, pool.num_evicted,
            )  # fmt: skip

        return await self._book(take)

    async def _book(self, fn: Callable[[], T]) -> T:
        result = await asyncio.get_running_loop().run_in_executor(self._books, self._locked(fn))
        self._steps.wake()
        return result

    def _locked(self, fn: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            with self.engine.lock:
                return fn()

        return run

    # -- outputs ------------------------------------------------------------------------

    def _enqueue(self, outputs: list[RequestOutput]) -> None:
        """Called on the engine thread: hands a step's outputs to the event loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._outputs.put_nowait, outputs)

    async def _deliveries(self) -> None:
        while (outputs := await self._outputs.get()) is not None:
            await self._deliver(outputs)

    async def _deliver(self, outputs: list[RequestOutput]) -> None:
        try:
            await self._on_outputs(outputs)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A publish failing (say, during a NATS outage) must not end the loop; the
            # gateway fills what it missed from the ledger's replay.
            log.exception("handling %d engine outputs failed", len(outputs))

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.loop_ended = True
            log.error("engine loop ended", exc_info=task.exception())

    def _steps_done(self, done: Future[None]) -> None:
        if not done.cancelled() and done.exception() is not None:
            self.loop_ended = True
            log.error("engine step loop ended", exc_info=done.exception())
