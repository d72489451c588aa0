"""How the scheduler asks ``policy.place``: one request's terms (``PlacementQuery``) and the
scheduler's placement rule (``PlacementOptions``) go in, and out come the placement to offer
and the figures priced on the same rule: whether an overload is hopeless before the catalogue
is asked, how long its answer may be waited for, and the TTFT floor the heartbeat reports.

Pure: no I/O, no framework; the view is read and the round-robin turn advanced, nothing else.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView
from services.scheduler.objectives import tbt_objective, ttft_objective
from services.scheduler.policy import (
    Placement,
    PlacementRequest,
    Rejection,
    objective_applies,
    place,
    place_round_robin,
)
from shared.kv.tiers import DRAM
from shared.messages import GenerateRequest
from shared.rpc.types import PrefixHolder

#: What a lookup may cost a request that only a cached prefix can let in (``lookup_budget``).
OVERLOAD_LOOKUP_S = 0.01


@dataclass(frozen=True, slots=True)
class PlacementOptions:
    """The scheduler's placement rule: its objectives (None: none), the cache-oblivious
    round-robin baseline instead of the cost model, and prefilling on decode nodes."""

    slo_s: float | None = None
    tbt_slo_s: float | None = None
    round_robin: bool = False
    local_prefill: bool = False


@dataclass(frozen=True, slots=True)
class PlacementQuery:
    """One request's terms: its size, the objectives it must meet (its own or the
    scheduler's), and whether it resumes one already accepted (never refused by them)."""

    ask: PlacementRequest
    slo_s: float | None = None
    tbt_slo_s: float | None = None
    resumed: bool = False


class Placer:
    """Owns the scheduler's placement rule and the round-robin turn; every placement and every
    figure derived from one goes through ``_place``.

    Invariant: the view is only read, and only ``decide`` advances the turn, so pricing a
    figure never changes which node the round-robin baseline picks next.
    """

    def __init__(self, view: ClusterView, options: PlacementOptions) -> None:
        self.view = view
        self.options = options
        self._turn = 0

    def query(self, request: GenerateRequest, wall_now: float) -> PlacementQuery:
        """The request's terms: its own objectives where it names them (the time left of its
        deadline at ``wall_now``, a tighter time between tokens), else the scheduler's."""
        spec = request.sampling
        tbt_slo_s = tbt_objective(spec.tbt_slo_s, self.options.tbt_slo_s)
        size = len(request.prompt_token_ids)
        ask = PlacementRequest(size, spec.max_tokens, request.request_id, tbt_slo_s)
        ttft_slo_s = ttft_objective(spec.ttft_deadline, self.options.slo_s, wall_now)
        return PlacementQuery(ask, ttft_slo_s, tbt_slo_s, request.resume)

    def decide(
        self,
        query: PlacementQuery,
        holders: Sequence[PrefixHolder],
        avoid: Collection[str],
        now: float,
    ) -> Placement | Rejection:
        """Where the request goes now, on no node in ``avoid``."""
        if self.options.round_robin:
            self._turn += 1
        return self._place(query, holders, now, avoid, chosen=True)

    def hopeless(self, query: PlacementQuery, now: float) -> Rejection | None:
        """The refusal of an overload, before the catalogue is asked: when even a prompt
        cached whole on every node would miss the TTFT objective (queues alone are too long),
        no answer of cachemeta can save it, so the refusal costs no lookup."""
        if query.slo_s is None or query.resumed or self.options.round_robin:
            return None
        blocks = query.ask.num_prompt_tokens // max(self._block_size(now), 1)
        if blocks == 0:
            return None
        best = self._place(query, self._everywhere(blocks, now), now)
        return best if isinstance(best, Rejection) and best.cause == "ttft_slo" else None

    def lookup_budget(self, query: PlacementQuery, now: float) -> float | None:
        """How long cachemeta's answer may be waited for. Unbounded (its own timeout) unless
        the request would miss the scheduler's TTFT objective without any cached prefix: then
        only the cache can let it in, and a refusal must not wait behind a slow lookup (an
        overload is exactly when one is slow), so it gets ``OVERLOAD_LOOKUP_S``."""
        if self.options.slo_s is None or query.resumed:
            return None
        own = PlacementQuery(query.ask, self.options.slo_s, self.options.tbt_slo_s)
        plain = self._place(own, (), now)
        missed = isinstance(plain, Rejection) and plain.cause == "ttft_slo"
        return OVERLOAD_LOOKUP_S if missed else None

    def ttft_floor(self, now: float) -> float:
        """The shortest time to first token a new request could get now (one token, cached
        on the best prefill node); what gateways compare with the objective to refuse an
        overload without asking (``NodeStatus.ttft_floor_s``). 0 without an objective."""
        if self.options.slo_s is None:
            return 0.0
        one_token = PlacementQuery(PlacementRequest(self._block_size(now) + 1, 1))
        best = self._place(one_token, self._everywhere(1, now), now)
        if isinstance(best, Rejection):
            return 0.0  # no node at all: the scheduler answers that itself, truthfully
        if not objective_applies(best.predicted_wait_s):
            return 0.0  # a node would start it at once: let in whatever it costs
        return self.expected_ttft_s(best)

    def expected_ttft_s(self, placement: Placement) -> float:
        """The placement's predicted TTFT as its prefill node's measured misses stretch it."""
        return placement.predicted_ttft_s * self.view.calibration.scale(placement.prefill_node)

    def _place(
        self,
        query: PlacementQuery,
        holders: Sequence[PrefixHolder],
        now: float,
        avoid: Collection[str] = (),
        *,
        chosen: bool = False,
    ) -> Placement | Rejection:
        """The one call into the policy. Only a ``chosen`` placement (one to offer) follows
        the round-robin baseline, prefills locally, or is spared the objectives by a resume;
        a figure is priced on the cost model as it stands."""
        opts = self.options
        if chosen and opts.round_robin:
            return place_round_robin(
                query.ask, self.view, self._turn, now, query.slo_s,
                tbt_slo_s=query.tbt_slo_s, avoid=avoid, resumed=query.resumed,
            )  # fmt: skip
        return place(
            query.ask, self.view, holders, now, query.slo_s, tbt_slo_s=query.tbt_slo_s,
            avoid=avoid, resumed=chosen and query.resumed,
            local_prefill=chosen and opts.local_prefill,
        )  # fmt: skip

    def _everywhere(self, blocks: int, now: float) -> list[PrefixHolder]:
        """The first ``blocks`` blocks held in DRAM by every prefill node."""
        return [PrefixHolder(n.node_id, DRAM, blocks) for n in self.view.targets("prefill", now)]

    def _block_size(self, now: float) -> int:
        nodes = self.view.targets("prefill", now)
        return nodes[0].block_size if nodes else 0
