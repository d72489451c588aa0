"""A discrete-event simulation of a Crescent cluster replaying a request trace, placed by the
live scheduler's own code.

P prefill and D decode nodes (``nodes.py``), each with a KV pool (a ``BlockPool`` evicting by
one of tierd's policies), behind a scheduler (``schedulers.py``) that sees what the live one
sees: a ``ClusterView`` the nodes' loads are reported into as they change, and cachemeta's
answer for the prompt's blocks (``catalogue.py``). Requests arrive at the trace's times times
``time_scale``. A request's first token comes when its prefill ends (after the pull of the
cached blocks its node lacks); the decode node then pulls its KV and decodes the rest, which
the time per output token (TPOT) counts. Times are simulated seconds; the wall clock only
times the simulator and the scheduler's calls.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from crescent.sim.catalogue import Catalogue, matched_by
from crescent.sim.costs import CostModel, cost_model
from crescent.sim.nodes import DecodeNode, Job, PrefillNode
from crescent.sim.pool import BlockPool, block_key
from crescent.sim.report import SimResult, summarize
from crescent.sim.schedulers import make_scheduler
from crescent.traces import TraceRecord, scaled
from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.policy import Placement, PlacementRequest, record_placement
from services.scheduler.timing import StepTimes, prefill_seconds

_ARRIVE, _PREFILLED, _HANDED_OFF, _STEPPED = range(4)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate. ``capacity_blocks``: each node's pool (None: unlimited); ``policy``:
    its eviction policy (tierd's); ``time_scale``: arrival times are the trace's times this;
    the objectives default to the cost model's."""

    prefill_nodes: int = 16
    decode_nodes: int = 16
    capacity_blocks: int | None = 4000
    policy: str = "lru"
    scheduler: str = "cost"
    cost_model: str = "a800"
    time_scale: float = 1.0
    num_requests: int | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    seed: int = 0
    decode_pools: bool = True


def cluster_view(cost: CostModel) -> ClusterView:
    """The scheduler's view of a cluster of ``cost`` nodes: they never miss a heartbeat, and
    their step times are the cost model's, as if fitted."""
    return ClusterView(
        math.inf,
        timing=StepTimes(cost.prefill, role_priors={"decode": cost.decode}),
        costs=CostParams(
            max_num_batched_tokens=cost.max_num_batched_tokens,
            default_fetch_bandwidth=cost.fetch_bandwidth,
            default_block_bytes=cost.block_bytes,
            pull_overhead_s=cost.pull_overhead_s,
        ),
    )


class Simulation:
    """Owns the cluster, its event queue and the jobs of one run. Invariant: the view holds
    every node's load as of its last change."""

    def __init__(self, config: SimConfig, records: Sequence[TraceRecord]) -> None:
        self.config = config
        self.cost = cost = cost_model(config.cost_model)
        self.view = view = cluster_view(cost)
        self.prefills = {
            f"prefill-{i:04d}": PrefillNode(self._load(f"prefill-{i:04d}", "prefill"), self._pool())
            for i in range(config.prefill_nodes)
        }
        self.decodes = {
            f"decode-{i:04d}": DecodeNode(
                self._load(f"decode-{i:04d}", "decode"),
                cost.decode,
                self._pool() if config.decode_pools else None,
            )
            for i in range(config.decode_nodes)
        }
        for load in [n.load for n in self.prefills.values()] + [
            n.load for n in self.decodes.values()
        ]:
            view.update(load)
        self.pools = {k: n.pool for k, n in self.prefills.items()}
        self.pools.update({k: n.pool for k, n in self.decodes.items() if n.pool is not None})
        self.catalogue = Catalogue(self.pools)
        self.schedule = make_scheduler(config.scheduler, view, config.seed)
        self.jobs = self._jobs(records)
        self._events: list[tuple[float, int, int, object]] = []
        self._serial = 0
        self.placement_s: list[float] = []
        self.found_blocks = self.requested_blocks = 0
        self.prefill_busy_s = 0.0
        # Wall-clock time of the pools' accesses (tierd's policies at work): a read of the
        # thread's CPU clock costs a system call, and there are two per access.
        self.pool_s = 0.0

    def _load(self, node_id: str, role: str) -> NodeLoad:
        cost = self.cost
        blocks = cost.decode_blocks if role == "decode" else self.config.capacity_blocks or 0
        return NodeLoad(
            node_id, role, 0, 0, blocks, blocks, cost.block_tokens, 0.0,
            block_bytes=cost.block_bytes, max_num_batched_tokens=cost.max_num_batched_tokens,
        )  # fmt: skip

    def _pool(self) -> BlockPool:
        config = self.config
        return BlockPool(config.capacity_blocks, config.policy, block_bytes=self.cost.block_bytes)

    def _jobs(self, records: Sequence[TraceRecord]) -> list[Job]:
        chosen = list(records)[: self.config.num_requests]
        chosen.sort(key=lambda r: r.timestamp_ms)
        start = chosen[0].timestamp_ms if chosen else 0
        bs, scale = self.cost.block_tokens, self.config.time_scale
        jobs = [
            Job(
                index=i,
                arrival=(r.timestamp_ms - start) / 1000 * scale,
                prompt_tokens=scaled(r.input_length, bs),
                output_tokens=scaled(r.output_length, bs),
                hash_ids=r.hash_ids,
                keys=tuple(map(block_key, r.hash_ids)),
            )
            for i, r in enumerate(chosen)
        ]
        matched = matched_by(job.keys for job in jobs)
        for job in jobs:
            job.listed = tuple(key for key in job.keys if key in matched)
        return jobs

    def _push(self, at: float, kind: int, what: object) -> None:
        self._serial += 1
        heapq.heappush(self._events, (at, self._serial, kind, what))

    def run(self) -> SimResult:
        # The pools hold millions of small objects and no cycles: a collection pass now and
        # then would stall the run (and land in the placement times) for nothing.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> SimResult:
        started = time.perf_counter()
        for job in self.jobs:
            self._push(job.arrival, _ARRIVE, job)
        events = self._events
        while events:
            now, _, kind, what = heapq.heappop(events)
            if kind == _ARRIVE:
                self._arrive(what, now)  # type: ignore[arg-type]
            elif kind == _PREFILLED:
                self._prefilled(what, now)  # type: ignore[arg-type]
            elif kind == _HANDED_OFF:
                self._handed_off(what, now)  # type: ignore[arg-type]
            elif what.wake == now:  # type: ignore[attr-defined]
                self._stepped(what, now)  # type: ignore[arg-type]
        wall_s = time.perf_counter() - started
        hit_rate = self.found_blocks / self.requested_blocks if self.requested_blocks else 0.0
        return summarize(self, hit_rate, wall_s)

    def _arrive(self, job: Job, now: float) -> None:
        request = PlacementRequest(job.prompt_tokens, job.output_tokens, str(job.index))
        match = self.catalogue.match(job.keys)
        # The scheduler's own time (CPU time of this thread): on a shared machine the wall
        # clock would also count the slices other processes take.
        started = time.thread_time()
        decision = self.schedule(request, match, now)
        if isinstance(decision, Placement):
            record_placement(self.view, decision, request)
        self.placement_s.append(time.thread_time() - started)
        if not isinstance(decision, Placement):
            job.rejected = True
            return
        job.placement = decision
        node = self.prefills[decision.prefill_node]
        local = min(node.pool.lookup_keys(job.keys), self._usable(job)) * self.cost.block_tokens
        job.queued_tokens = job.prompt_tokens - max(decision.num_cached_tokens, local)
        node.enqueue(job, now)
        self.view.update(node.load)
        if node.current is None:
            self._start(node, now)

    def _access(self, pool: BlockPool, keys: Sequence[bytes], now: float) -> int:
        started = time.perf_counter()
        hits = pool.access_keys(keys, now)
        self.pool_s += time.perf_counter() - started
        return hits

    def _store(self, node_id: str, pool: BlockPool, job: Job, now: float) -> None:
        """``node_id``'s pool stores (or reads) ``job``'s prompt, and the catalogue learns
        of it (of the blocks any prompt is matched by: ``Job.listed``)."""
        self._access(pool, job.keys, now)
        self.catalogue.stored(node_id, job.listed)

    def _usable(self, job: Job) -> int:
        """Blocks a hit may cover: the last prompt token is always computed."""
        return max(job.prompt_tokens - 1, 0) // self.cost.block_tokens

    def _start(self, node: PrefillNode, now: float) -> None:
        job = node.queue.popleft()
        node.current = job
        ids, usable = job.keys, self._usable(job)
        cached = min(node.pool.lookup_keys(ids), usable)
        fetched = 0
        assert job.placement is not None
        for pull in job.placement.pulls:
            source = self.pools.get(pull.node_id)
            if source is None:
                continue
            held = min(source.lookup_keys(ids), pull.first_block + pull.num_blocks, usable)
            if held > cached:
                fetched += held - cached
                cached = held
                self._access(source, ids[:held], now)  # a read is a use
        job.cached_blocks = cached
        self.found_blocks += cached
        self.requested_blocks += len(ids)
        cost, bs = self.cost, self.cost.block_tokens
        compute = prefill_seconds(
            cost.prefill, job.prompt_tokens - cached * bs, cached * bs, cost.max_num_batched_tokens
        )
        busy = cost.pull_seconds(fetched) + compute
        self.prefill_busy_s += busy
        self._push(now + busy, _PREFILLED, node)

    def _prefilled(self, node: PrefillNode, now: float) -> None:
        job = node.current
        assert job is not None
        self._store(node.load.node_id, node.pool, job, now)
        job.first_token = now
        node.finish(job, now)
        self.view.update(node.load)
        if node.queue:
            self._start(node, now)
        if job.output_tokens > 1:
            self._push(now + self.cost.handoff_seconds(job.prompt_tokens), _HANDED_OFF, job)
        else:
            job.finished = now

    def _handed_off(self, job: Job, now: float) -> None:
        assert job.placement is not None
        node = self.decodes[job.placement.decode_node]
        job.blocks = -(-(job.prompt_tokens + job.output_tokens) // self.cost.block_tokens)
        if node.pool is not None:
            self._store(node.load.node_id, node.pool, job, now)
        node.waiting.append(job)
        if not node.ending:
            node.start = now
            node.admit()
            node.plan()
            self._push(node.wake, _STEPPED, node)
        elif len(node.waiting) == 1 and job.blocks <= node.load.total_blocks - node.reserved:
            steps, at = node.join_boundary(now)
            if at < node.wake:
                node.wake, node.wake_steps = at, steps
                self._push(at, _STEPPED, node)
        node.report(now)
        self.view.update(node.load)

    def _stepped(self, node: DecodeNode, now: float) -> None:
        node.advance(node.wake_steps, now)
        node.admit()
        node.plan()
        if node.wake < math.inf:
            self._push(node.wake, _STEPPED, node)
        node.report(now)
        self.view.update(node.load)


def simulate(config: SimConfig, records: Sequence[TraceRecord]) -> SimResult:
    return Simulation(config, records).run()
