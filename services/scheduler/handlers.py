"""Bus adapter of the scheduler: heartbeats and disconnect events in; requests in, offered to
the prefill nodes ``placing.Offers`` names until one takes it, and answered (``SubmitReply``);
prefetches out to the tierds. It translates and runs effects only: the placement and its
figures are ``placer.py``'s, the offers' ``placing.py``'s, keeps and prefetches their own."""

from __future__ import annotations

import logging
import time

from services.scheduler.admission import AdmissionGate
from services.scheduler.cluster import ClusterView
from services.scheduler.explain import explain
from services.scheduler.feed import ClusterFeed
from services.scheduler.keeping import Keeper, keep_and_place
from services.scheduler.lookup import PrefixLookup
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.options import SchedulerOptions
from services.scheduler.placer import Placer
from services.scheduler.placing import Accepted, Offer, Offers, Refused, Silence, Withdraw
from services.scheduler.policy import Rejection
from services.scheduler.prefetch import Prefetch, Prefetcher
from services.scheduler.prompts import PromptHasher
from services.scheduler.recent import RecentPlacements, merge
from services.scheduler.wire import acceptance, prefetch_requests, prefill_task, refusal
from shared import subjects, tracing
from shared.bus import Bus, BusRequestError, NoResponders
from shared.cluster_messages import NodeStatus, TaskAck
from shared.kv.hashing import BlockHash
from shared.messages import AbortRequest, GenerateRequest, SubmitReply
from shared.rpc.types import PrefixHolder
from shared.stream_auth import seal_abort

log = logging.getLogger(__name__)


class SchedulerHandlers:
    """Owns the cluster view, the admission gate and the requests being placed.

    Invariants: a request is answered accepted only after a prefill node acknowledged it; the
    effects of ``Offers`` run in the order it gives them, and nothing is awaited between
    computing a placement and recording it. The prompts a node was given in the last seconds
    count as cached there (``RecentPlacements``: the catalogue lists them only once the node
    has synced). A tierd is in the view as a source of pulls only.
    """

    def __init__(
        self,
        bus: Bus,
        view: ClusterView,
        lookup: PrefixLookup,
        metrics: SchedulerMetrics,
        options: SchedulerOptions,
        keeper: Keeper | None = None,
    ) -> None:
        self.bus = bus
        self.view = view
        self.lookup = lookup
        self.metrics = metrics
        self.options = options
        self.keeper = keeper
        self.gate = AdmissionGate(options.max_pending)
        self.placer = Placer(view, options.placement)
        self.hasher = PromptHasher(view, options.cache_secret, not options.placement.round_robin)
        self.prefetcher = Prefetcher(
            view, self._send_prefetch, metrics.prefetched, enabled=options.prefetch
        )
        self.recent = RecentPlacements()
        self.feed = ClusterFeed(view, self.recent, options.secret_fingerprint)

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        await self.feed.on_heartbeat(subject, status)

    async def on_disconnect(self, data: bytes) -> None:
        await self.feed.on_disconnect(data)

    async def on_request(self, request: GenerateRequest) -> SubmitReply:
        """Places the request and answers once a prefill node took it, or says why not."""
        refused = self.gate.enter(time.monotonic(), resumed=request.resume)
        if refused is not None:
            return self._refuse(request, refused)
        if request.resume:
            self.metrics.replaced("resume")
        try:
            return await keep_and_place(
                self.keeper,
                request,
                lambda: self.hasher.full_blocks(request, time.monotonic()),
                lambda: self._place(request),
            )
        except Exception:
            log.exception("placing a request failed")
            return SubmitReply(accepted=False, error="the scheduler failed", error_code=503)
        finally:
            self.gate.leave(time.monotonic())

    def ttft_floor(self) -> float:
        """The TTFT floor the heartbeat reports (``Placer.ttft_floor``)."""
        return self.placer.ttft_floor(time.monotonic())

    async def _place(self, request: GenerateRequest) -> SubmitReply:
        started = time.monotonic()
        query = self.placer.query(request, time.time())
        hopeless = self.placer.hopeless(query, started)
        if hopeless is not None:
            return self._refuse(request, hopeless)
        hashes = self._block_hashes(request)
        holders: list[PrefixHolder] = []
        if hashes and request.sampling.cache_read:  # without it: priced as a full recompute
            budget_s = self.placer.lookup_budget(query, time.monotonic())
            holders = await self.lookup.match(hashes, budget_s)
            holders = merge(holders, self.recent.holders(hashes, time.monotonic()))
        return await self._offer_all(request, Offers(self.placer, query, holders), hashes, started)

    async def _offer_all(
        self, request: GenerateRequest, offers: Offers, hashes: list[BlockHash], started: float
    ) -> SubmitReply:
        """Runs the offers' effects until one ends them."""
        offering = 0.0  # the offers' round trips are not placement
        prefetched: set[Prefetch] = set()
        effect = offers.next(time.monotonic())
        while isinstance(effect, Offer):
            placement = effect.placement
            if log.isEnabledFor(logging.DEBUG):  # explaining walks the whole view
                now = time.monotonic()
                log.debug(
                    "%s", explain(self.view, request.request_id, placement, offers.holders, now)
                )
            await self.prefetcher.prefetch(placement, hashes, prefetched)
            offered = time.monotonic()
            outcome = offers.answer(await self._offer(effect, request))
            if isinstance(outcome, Accepted):
                placed_s = offered - started - offering
                return self._accepted(outcome, offers, hashes, placed_s, offered)
            if isinstance(outcome, Refused):
                return self._refused(request, outcome)
            await self._withdraw(outcome, request)
            offering += time.monotonic() - offered
            effect = offers.next(time.monotonic())
        return self._refused(request, effect)

    async def _offer(self, offer: Offer, request: GenerateRequest) -> TaskAck | Silence:
        """Hands the task to the prefill node and brings back its answer."""
        placement, node = offer.placement, offer.placement.prefill_node
        task = prefill_task(request, placement, offer.expected_ttft_s)
        subject = subjects.local_tasks(node) if placement.local else subjects.prefill_tasks(node)
        try:
            return await self.bus.request(subject, task, TaskAck, self.options.ack_timeout_s)
        except NoResponders:
            log.warning("prefill node %s is gone; placing %s elsewhere", node, request.request_id)
            return Silence(gone=True)
        except BusRequestError as exc:
            log.warning("prefill node %s did not answer (%s); placing elsewhere", node, exc)
            return Silence(gone=False)

    async def _withdraw(self, withdraw: Withdraw, request: GenerateRequest) -> None:
        """Counts the node passed over, and tells it alone to stop where it may hold the task."""
        self.metrics.replaced("offer_refused")
        if withdraw.abort:
            abort = AbortRequest(request_id=request.request_id, only_node=withdraw.node_id)
            await self.bus.publish(subjects.ABORTS, seal_abort(abort, request.stream_key))

    def _accepted(
        self, accepted: Accepted, offers: Offers, hashes: list[BlockHash], placed_s: float,
        offered: float,
    ) -> SubmitReply:  # fmt: skip
        placement = accepted.placement
        tracing.record("placement", tracing.current(), placed_s, ago_s=time.monotonic() - offered)
        self.metrics.placed(placement, offers.query.ask)
        matched = max((h.num_blocks for h in offers.holders), default=0)
        self.lookup.touch(hashes[:matched])
        self.recent.record(
            hashes, placement.prefill_node, time.monotonic(), placement.predicted_ttft_s
        )
        return acceptance(accepted, placed_s)

    async def _send_prefetch(self, prefetch: Prefetch) -> None:
        subject = subjects.prefetches(prefetch.tierd_id)
        for message in prefetch_requests(prefetch):
            await self.bus.publish(subject, message)

    def _block_hashes(self, request: GenerateRequest) -> list[BlockHash]:
        hashes = self.hasher.blocks(request, time.monotonic())
        if hashes is None and self.lookup.index is not None:
            self.metrics.fell_back("no_hash_scope")
        return hashes or []

    def _refused(self, request: GenerateRequest, refused: Refused) -> SubmitReply:
        if refused.by_policy:
            return self._refuse(request, refused.rejection)
        return refusal(refused.rejection)  # a node's answer or no node left: no rejection

    def _refuse(self, request: GenerateRequest, rejection: Rejection) -> SubmitReply:
        self.metrics.rejected(rejection)
        log.info("refused %s: %s", request.request_id, rejection.cause)
        return refusal(rejection)
