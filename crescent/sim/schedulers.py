"""Where the simulator places each request: the live scheduler's placement, or a baseline.

``cost`` is the live policy (``services.scheduler.policy.place``: queue wait + fetch of the
cached blocks the node lacks + prefill of the rest, over every holder in the cluster) and
``round-robin`` the live scheduler's cache-oblivious baseline (``place_round_robin``). The other
baselines, after Mooncake's (Qin et al., FAST 2025), choose the prefill node by a simple rule:
``random``; ``load``, the fewest queued tokens; ``cache-aware``, the longest prefix in the
node's own pool, ties by load (Mooncake's local cache-aware scheduling). Each of them computes
what its node lacks, pulling nothing, and leaves the decode node to the live ranking
(``place_on``), so only the prefill choice differs between schedulers.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from crescent.sim.catalogue import Match
from crescent.sim.cli import SCHEDULERS
from services.scheduler.cluster import ClusterView
from services.scheduler.index import load_of
from services.scheduler.policy import (
    Placement,
    PlacementRequest,
    Rejection,
    place,
    place_on,
    place_round_robin,
)
from shared.kv.tiers import DRAM


class Scheduler(Protocol):
    def __call__(
        self, request: PlacementRequest, match: Match, now: float
    ) -> Placement | Rejection: ...


def _cost(view: ClusterView) -> Scheduler:
    def choose(request: PlacementRequest, match: Match, now: float) -> Placement | Rejection:
        return place(request, view, match.holders, now, common=match.common)

    return choose


def _round_robin(view: ClusterView) -> Scheduler:
    turns = iter(range(1 << 62))

    def choose(request: PlacementRequest, match: Match, now: float) -> Placement | Rejection:
        return place_round_robin(request, view, next(turns), now)

    return choose


def _local_blocks(view: ClusterView, node_id: str, request: PlacementRequest, match: Match) -> int:
    """Leading blocks of the prompt ``node_id``'s own pool holds, usable ones."""
    held = max((h.num_blocks for h in match.holders if h.node_id == node_id), default=0)
    if not held and match.common is not None and match.common.holds(node_id):
        held = match.common.num_blocks
    limit = max(request.num_prompt_tokens - 1, 0) // view.nodes[node_id].block_size
    return min(held, limit)


def _least_loaded(view: ClusterView, accept: Callable[[str], bool] = lambda _: True) -> str:
    """The prefill node with the fewest tokens ahead (then the lowest id) that ``accept``s."""
    best: tuple[int, str] | None = None
    index = view.prefill_index
    for entries in index.classes.values():
        found = next((e for e in entries if accept(e[1])), None)
        if found is not None and (best is None or found < best):
            best = found
    for node_id in index.measured:
        entry = (load_of(view.nodes[node_id]), node_id)
        if accept(node_id) and (best is None or entry < best):
            best = entry
    if best is None:
        raise ValueError("no prefill node to place on")
    return best[1]


def _on(view: ClusterView, pick: Callable[[PlacementRequest, Match], str]) -> Scheduler:
    def choose(request: PlacementRequest, match: Match, now: float) -> Placement | Rejection:
        node_id = pick(request, match)
        local = _local_blocks(view, node_id, request, match)
        return place_on(request, view, node_id, local, now)

    return choose


def _random(view: ClusterView, seed: int) -> Scheduler:
    rng = random.Random(seed)
    ids = sorted(n for n, load in view.nodes.items() if load.role == "prefill")
    return _on(view, lambda request, match: rng.choice(ids))


def _load(view: ClusterView) -> Scheduler:
    return _on(view, lambda request, match: _least_loaded(view))


def _cache_aware(view: ClusterView) -> Scheduler:
    prefills = {n for n, load in view.nodes.items() if load.role == "prefill"}
    block_size = min(view.nodes[n].block_size for n in prefills)

    def pick(request: PlacementRequest, match: Match) -> str:
        limit = max(request.num_prompt_tokens - 1, 0) // block_size
        listed = {
            h.node_id: min(h.num_blocks, limit)
            for h in match.holders
            if h.tier == DRAM and h.node_id in prefills
        }
        longest = max(listed.values(), default=0)
        common = match.common
        shared = 0 if common is None else min(common.num_blocks, limit)
        if common is not None and shared >= max(longest, 1):
            ids = {n for n, blocks in listed.items() if blocks == shared}
            return _least_loaded(view, lambda n: n in ids or (n not in listed and common.holds(n)))
        if longest == 0:
            return _least_loaded(view)
        return min((load_of(view.nodes[n]), n) for n, b in listed.items() if b == longest)[1]

    return _on(view, pick)


def make_scheduler(name: str, view: ClusterView, seed: int = 0) -> Scheduler:
    """The scheduler called ``name`` (one of ``SCHEDULERS``) over ``view``."""
    if name == "cost":
        return _cost(view)
    if name == "round-robin":
        return _round_robin(view)
    if name == "random":
        return _random(view, seed)
    if name == "load":
        return _load(view)
    if name == "cache-aware":
        return _cache_aware(view)
    raise ValueError(f"unknown scheduler {name!r}; known: {', '.join(SCHEDULERS)}")
