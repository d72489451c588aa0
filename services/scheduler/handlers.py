"""Bus adapter of the scheduler: heartbeats and disconnect events in; requests in, placed on a
prefill node that acknowledges them, and answered (``SubmitReply``) once one did; prefetches out
to the tierds whose S3 blocks a placed request will pull."""

from __future__ import annotations

import logging
import time

from services.scheduler.admission import AdmissionGate
from services.scheduler.cluster import ClusterView
from services.scheduler.feed import ClusterFeed
from services.scheduler.keeping import Keeper, KeepRefusal
from services.scheduler.lookup import (
    PrefixLookup,
    hash_scope,
    prompt_block_hashes,
    prompt_full_block_hashes,
)
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.objectives import tbt_objective, ttft_objective
from services.scheduler.policy import (
    Placement,
    PlacementRequest,
    Rejection,
    place,
    place_round_robin,
    record_placement,
)
from services.scheduler.prefetch import Prefetch, plan_prefetches
from services.scheduler.recent import RecentPlacements, merge
from services.scheduler.wire import prefetch_requests, prefill_task
from shared import subjects, tracing
from shared.bus import Bus, BusRequestError, NoResponders
from shared.cluster_messages import NodeStatus, TaskAck
from shared.kv.hashing import BlockHash
from shared.kv.tiers import DRAM, bandwidth_key
from shared.messages import AbortRequest, GenerateRequest, SubmitReply
from shared.rpc.types import PrefixHolder
from shared.stream_auth import seal_abort

log = logging.getLogger(__name__)
#: Prefill nodes tried for one request before it is refused.
MAX_TRIES = 3
#: What a lookup may cost a request that only a cached prefix can let in (``_lookup_budget``).
OVERLOAD_LOOKUP_S = 0.01


class SchedulerHandlers:
    """Owns the cluster view, the admission gate and the requests being placed; every
    decision is ``policy.place``'s.

    Invariants: a placement is recorded in the view in the same event-loop step that computes
    it (nothing is awaited in between), so requests placed concurrently each see the ones
    before; a request is answered accepted only after a prefill node acknowledged it, and a
    node that refused or did not answer is never tried twice for it. The prompts a node was
    given to prefill in the last seconds count as cached there (``RecentPlacements``: the
    catalogue lists them only once the node has synced, and the same prompt asked again
    meanwhile would be computed again elsewhere). A tierd is in the view as a source of pulls
    only (placement takes only prefill and decode nodes as targets). A
    prefetch is a hint: it goes out before the task (so the move overlaps the queue wait), at
    most once per request, and its failure never fails the request.
    """

    def __init__(
        self,
        bus: Bus,
        view: ClusterView,
        lookup: PrefixLookup,
        metrics: SchedulerMetrics,
        gate: AdmissionGate,
        *,
        cache_secret: str,
        secret_fingerprint: str = "",
        slo_s: float | None = None,
        tbt_slo_s: float | None = None,
        ack_timeout_s: float = 1.0,
        round_robin: bool = False,
        prefetch: bool = True,
        local_prefill: bool = False,
        keeper: Keeper | None = None,
    ) -> None:
        self.bus = bus
        self.view = view
        self.lookup = lookup
        self.metrics = metrics
        self.gate = gate
        self.cache_secret = cache_secret
        self.slo_s = slo_s
        self.tbt_slo_s = tbt_slo_s
        self.ack_timeout_s = ack_timeout_s
        self.round_robin = round_robin
        self.prefetch = prefetch
        self.local_prefill = local_prefill
        self.keeper = keeper
        self.recent = RecentPlacements()
        self.feed = ClusterFeed(view, self.recent, secret_fingerprint)
        self._turn = 0

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        await self.feed.on_heartbeat(subject, status)

    async def on_disconnect(self, data: bytes) -> None:
        await self.feed.on_disconnect(data)

    async def on_request(self, request: GenerateRequest) -> SubmitReply:
        """Places the request and answers once a prefill node took it, or says why not."""
        now = time.monotonic()
        refused = self.gate.enter(now, resumed=request.resume)
        if refused is not None:
            return self._refuse(request, refused)
        if request.resume:
            self.metrics.replaced("resume")
        try:
            return await self._keep_and_place(request)
        except Exception:
            log.exception("placing a request failed")
            return SubmitReply(accepted=False, error="the scheduler failed", error_code=503)
        finally:
            self.gate.leave(time.monotonic())

    async def _keep_and_place(self, request: GenerateRequest) -> SubmitReply:
        """Records the request's keep in the catalogue's ledger first (a keep over quota is
        refused before any work), places the request, and undoes the keep if it was not."""
        if request.resume:
            # Its first attempt recorded the keep; its prompt now ends with generated tokens.
            request.sampling.keep = ""
        if not request.sampling.keep or self.keeper is None:
            return await self._place(request)
        kept = await self.keeper.record(request, self._full_block_hashes(request))
        if isinstance(kept, KeepRefusal):
            log.info("refused %s: %s", request.request_id, kept.message)
            return SubmitReply(
                accepted=False, error=kept.message, error_code=kept.status, error_kind=kept.kind
            )
        reply = await self._place(request)
        if not reply.accepted:
            await self.keeper.undo(kept)
        return reply

    async def _place(self, request: GenerateRequest) -> SubmitReply:
        rid = request.request_id
        started, offering = time.monotonic(), 0.0  # the offers' round trips are not placement
        slo_s = ttft_objective(request.sampling.ttft_deadline, self.slo_s, time.time())
        tbt_slo_s = tbt_objective(request.sampling.tbt_slo_s, self.tbt_slo_s)
        ask = PlacementRequest(
            len(request.prompt_token_ids), request.sampling.max_tokens, rid, tbt_slo_s
        )
        hopeless = self._hopeless(ask, request.resume, slo_s, tbt_slo_s)
        if hopeless is not None:
            return self._refuse(request, hopeless)
        hashes: list[BlockHash] = []
        holders: list[PrefixHolder] = []
        if not self.round_robin:
            hashes = self._block_hashes(request)
        if hashes and request.sampling.cache_read:  # without it: priced as a full recompute
            holders = await self.lookup.match(hashes, self._lookup_budget(ask, request.resume))
            holders = merge(holders, self.recent.holders(hashes, time.monotonic()))
        avoid: set[str] = set()
        prefetched: set[Prefetch] = set()
        for _ in range(MAX_TRIES):
            decision = self._decide(ask, holders, avoid, request.resume, slo_s, tbt_slo_s)
            if isinstance(decision, Rejection):
                return self._refuse(request, decision)
            record_placement(self.view, decision, ask)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "placing %s on %s%s: holders %s, pulls %s, predicted TTFT %.3f s, "
                    "bandwidths %s, holders' last heartbeats %s", rid, decision.prefill_node,
                    " (local prefill)" if decision.local else "", holders, decision.pulls,
                    decision.predicted_ttft_s, self._priced_bandwidths(decision, holders),
                    self._holders_seen(holders),
                )  # fmt: skip
            if self.prefetch:
                await self._prefetch(decision, hashes, prefetched)
            expected_s = decision.predicted_ttft_s * self.view.calibration.scale(
                decision.prefill_node
            )
            offered = time.monotonic()
            ack = await self._offer(decision, request, expected_s)
            if ack is not None and ack.accepted:
                placed_s, offer_s = offered - started - offering, time.monotonic() - offered
                tracing.record("placement", tracing.current(), placed_s, ago_s=offer_s)
                self.metrics.placed(decision, ask)
                self.lookup.touch(hashes[: _matched(holders)])
                ready_in_s = decision.predicted_ttft_s
                self.recent.record(hashes, decision.prefill_node, time.monotonic(), ready_in_s)
                return SubmitReply(
                    accepted=True,
                    prefill_node=decision.prefill_node,
                    prefill_epoch=ack.epoch,
                    decode_node=decision.decode_node,
                    placement_s=offered - started - offering,
                    predicted_ttft_s=expected_s,
                )
            offering += time.monotonic() - offered
            self.view.withdraw(rid)
            if ack is not None and ack.error_code is not None:
                return SubmitReply(accepted=False, error=ack.reason, error_code=ack.error_code)
            avoid.add(decision.prefill_node)
            self.metrics.replaced("offer_refused")
        return SubmitReply(
            accepted=False, error="no prefill node accepted the request", error_code=503
        )

    def _priced_bandwidths(
        self, decision: Placement, holders: list[PrefixHolder]
    ) -> dict[str, float]:
        """Bytes/s placement assumed for each lower-tier holder, as seen from the chosen
        node (for the debug log: why a cached prefix was or was not pulled)."""
        node = self.view.nodes.get(decision.prefill_node)
        if node is None:
            return {}
        transfer = self.view.fallback_bandwidth(node)
        out = {"transfer": transfer}
        for h in holders:
            if h.tier != DRAM:
                key = bandwidth_key(h.node_id, h.tier)
                out[key] = self.view.tier_bandwidth(node, h.node_id, h.tier, transfer)
        return out

    def _holders_seen(self, holders: list[PrefixHolder]) -> dict[str, str]:
        """How long ago each holder's last heartbeat came, and whether it may be pulled from
        (for the debug log: a holder placement could not use)."""
        now, out = time.monotonic(), {}
        for node_id in {h.node_id for h in holders}:
            node = self.view.nodes.get(node_id)
            if node is None:
                out[node_id] = "never seen"
                continue
            usable = "source" if self.view.source_alive(node, now) else "not a source"
            gone = ", disconnected" if node.disconnected else ""
            out[node_id] = f"{now - node.last_seen:.1f} s ago ({usable}{gone})"
        return out

    def _hopeless(
        self, ask: PlacementRequest, resumed: bool, slo_s: float | None, tbt_slo_s: float | None
    ) -> Rejection | None:
        """An overload is refused before the catalogue is asked: when even a prompt cached
        whole on every node would miss the TTFT objective (queues alone are too long), no
        answer of cachemeta can save it, so the refusal costs no lookup."""
        if slo_s is None or resumed or self.round_robin:
            return None
        now = time.monotonic()
        blocks = ask.num_prompt_tokens // max(self._block_size(now), 1)
        if blocks == 0:
            return None
        everywhere = [
            PrefixHolder(n.node_id, "dram", blocks) for n in self.view.targets("prefill", now)
        ]
        best = place(ask, self.view, everywhere, now, slo_s, tbt_slo_s=tbt_slo_s)
        return best if isinstance(best, Rejection) and best.cause == "ttft_slo" else None

    def ttft_floor(self) -> float:
        """The shortest time to first token a new request could get now (one token, cached
        on the best prefill node); what gateways compare with the objective to refuse an
        overload without asking (``NodeStatus.ttft_floor_s``). 0 without an objective."""
        if self.slo_s is None:
            return 0.0
        now = time.monotonic()
        ask = PlacementRequest(self._block_size(now) + 1, 1)
        blocks = 1
        everywhere = [
            PrefixHolder(n.node_id, "dram", blocks) for n in self.view.targets("prefill", now)
        ]
        best = place(ask, self.view, everywhere, now, None)
        if isinstance(best, Rejection):
            return 0.0  # no node at all: the scheduler answers that itself, truthfully
        return best.predicted_ttft_s * self.view.calibration.scale(best.prefill_node)

    def _lookup_budget(self, ask: PlacementRequest, resumed: bool) -> float | None:
        """How long cachemeta's answer may be waited for. Unbounded (its own timeout) unless
        the request would miss the TTFT objective without any cached prefix: then only the
        cache can let it in, and a refusal must not wait behind a slow lookup (an overload
        is exactly when one is slow), so it gets ``OVERLOAD_LOOKUP_S``."""
        if self.slo_s is None or resumed:
            return None
        plain = place(ask, self.view, [], time.monotonic(), self.slo_s, tbt_slo_s=self.tbt_slo_s)
        missed = isinstance(plain, Rejection) and plain.cause == "ttft_slo"
        return OVERLOAD_LOOKUP_S if missed else None

    def _block_size(self, now: float) -> int:
        nodes = self.view.targets("prefill", now)
        return nodes[0].block_size if nodes else 0

    def _decide(
        self,
        ask: PlacementRequest,
        holders: list[PrefixHolder],
        avoid: set[str],
        resumed: bool,
        slo_s: float | None,
        tbt_slo_s: float | None,
    ) -> Placement | Rejection:
        now = time.monotonic()
        if self.round_robin:
            self._turn += 1
            return place_round_robin(
                ask, self.view, self._turn, now, slo_s, tbt_slo_s=tbt_slo_s,
                avoid=avoid, resumed=resumed,
            )  # fmt: skip
        return place(
            ask, self.view, holders, now, slo_s, tbt_slo_s=tbt_slo_s, avoid=avoid,
            resumed=resumed, local_prefill=self.local_prefill,
        )  # fmt: skip

    async def _prefetch(
        self, placement: Placement, hashes: list[BlockHash], done: set[Prefetch]
    ) -> None:
        """Asks each tierd the placement pulls S3 blocks from to move them to NVMe while the
        request waits in its prefill node's queue (``plan_prefetches`` decides which);
        ``done`` holds what this request already asked for, and grows."""
        try:
            wanted = [p for p in plan_prefetches(placement, self.view, hashes) if p not in done]
        except Exception:
            log.exception("planning the prefetches of a placement failed")
            return
        for prefetch in wanted:
            done.add(prefetch)
            subject = subjects.prefetches(prefetch.tierd_id)
            try:
                for message in prefetch_requests(prefetch):
                    await self.bus.publish(subject, message)
            except Exception as exc:
                log.warning("could not ask tierd %s for a prefetch: %s", prefetch.tierd_id, exc)
                continue
            self.metrics.prefetched(len(prefetch.block_hashes))

    async def _offer(
        self, placement: Placement, request: GenerateRequest, expected_ttft_s: float
    ) -> TaskAck | None:
        """Hands the task to the prefill node; None when it did not answer."""
        node = placement.prefill_node
        task = prefill_task(request, placement, expected_ttft_s)
        subject = subjects.local_tasks(node) if placement.local else subjects.prefill_tasks(node)
        try:
            return await self.bus.request(subject, task, TaskAck, self.ack_timeout_s)
        except NoResponders:
            log.warning("prefill node %s is gone; placing %s elsewhere", node, request.request_id)
        except BusRequestError as exc:
            # It may have taken the task and lost only its answer: make sure it stops.
            log.warning("prefill node %s did not answer (%s); placing elsewhere", node, exc)
            abort = AbortRequest(request_id=request.request_id, only_node=node)
            await self.bus.publish(subjects.ABORTS, seal_abort(abort, request.stream_key))
        return None

    def _block_hashes(self, request: GenerateRequest) -> list[BlockHash]:
        scope = hash_scope(self.view.live("prefill", time.monotonic()))
        if scope is None:
            if self.lookup.index is not None:
                self.metrics.fell_back("no_hash_scope")
            return []
        return prompt_block_hashes(
            request.prompt_token_ids, scope, self.cache_secret, request.tenant, request.cache_salt
        )

    def _full_block_hashes(self, request: GenerateRequest) -> list[BlockHash]:
        scope = hash_scope(self.view.live("prefill", time.monotonic()))
        if scope is None:
            return []  # no prefill node: the placement is refused anyway
        return prompt_full_block_hashes(
            request.prompt_token_ids, scope, self.cache_secret, request.tenant, request.cache_salt
        )

    def _refuse(self, request: GenerateRequest, rejection: Rejection) -> SubmitReply:
        self.metrics.rejected(rejection)
        log.info("refused %s: %s", request.request_id, rejection.cause)
        return SubmitReply(
            accepted=False,
            error=rejection.reason,
            error_code=rejection.status,
            retry_after_s=rejection.retry_after_s,
        )


def _matched(holders: list[PrefixHolder]) -> int:
    return max((h.num_blocks for h in holders), default=0)
