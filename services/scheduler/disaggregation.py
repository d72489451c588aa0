"""Conditional disaggregation: whether a request is prefilled on the decode node that will
decode it, with no KV hand-off, or on a prefill node that hands its KV over.

Prefilling on decode node ``d`` saves the hand-off and costs the sequences ``d`` decodes a
pause: the steps that compute the prompt run longer than their decode steps would by the
prompt's tokens and attention (the step's fixed cost they share). In seconds, from the
measured step times (``timing.py``), hand-off times (``handoff.py``) and pull bandwidths:

    local  = wait on d + fetch of what d lacks + compute on d
             + stall weight x (sequences decoding on d by then) x pause
    remote = TTFT on the best prefill node + hand-off of the prompt blocks d lacks

Either way the request's second token comes one decode step after it can join ``d``'s batch
(its first token out there, or its KV arrived), so the sums compare the request's own wait for
that plus the wait it imposes on the others. Local wins when its sum is smaller and the pause
keeps ``d``'s steps within the time-between-tokens objective. No length threshold is set: the
break-even length (``break_even_tokens``) follows from the fits, so it moves with the
hardware, the load on ``d``, what ``d`` already caches and the link. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.forecast import DecodeForecast, forecast
from services.scheduler.handoff import HandoffCoefficients, handoff_prior
from services.scheduler.pricing import PlacementRequest, PrefillCost, Pricing
from services.scheduler.sources import CommonPrefix
from services.scheduler.timing import StepCoefficients, prefill_seconds
from shared.rpc.types import PrefixHolder


@dataclass(frozen=True, slots=True)
class LocalPrefill:
    """A request prefilled on decode node ``cost.node_id``: ``cost`` prices its wait, pulls
    and compute there; ``pause_s`` is what its compute adds to the steps of the ``decoding``
    other sequences there; ``step_s`` is one decode step of that node. Each second a stream is
    paused counts ``stall_weight`` seconds of waiting (``CostParams``)."""

    cost: PrefillCost
    pause_s: float
    decoding: int
    step_s: float
    stall_weight: float = 1.0

    @property
    def ttft_s(self) -> float:
        return self.cost.ttft_s

    @property
    def total_s(self) -> float:
        return self.cost.ttft_s + self.stall_weight * self.decoding * self.pause_s


@dataclass(frozen=True, slots=True)
class Disaggregated:
    """The same request prefilled on a prefill node (``ttft_s``) whose KV then reaches its
    decode node in ``handoff_s``."""

    ttft_s: float
    handoff_s: float

    @property
    def total_s(self) -> float:
        return self.ttft_s + self.handoff_s


def prefer_local(
    local: LocalPrefill,
    remote: Disaggregated,
    tbt_slo_s: float | None,
    max_pause_s: float | None = None,
    max_idle_compute_s: float | None = None,
) -> bool:
    """Whether prefilling on the decode node beats handing off (module docstring): the pause
    of the streams decoding there, each weighed ``local.stall_weight`` times a second of
    waiting (a stall in a stream its reader is watching costs more than time), against the
    wait the request would see elsewhere, both predicted. Never when it would pause them
    longer than ``max_pause_s``, where an operator set an absolute bound. Nor, on a node with
    nothing decoding, when its compute takes longer than ``max_idle_compute_s``: streams
    handed to the node meanwhile, which no forecast can count, wait for its long steps (a
    step between two changes to the node's batch) to join it, while handing a long prompt
    off costs little beside its compute."""
    if tbt_slo_s is not None and local.step_s + local.pause_s > tbt_slo_s:
        return False
    if max_pause_s is not None and local.decoding > 0 and local.pause_s > max_pause_s:
        return False
    if (
        max_idle_compute_s is not None
        and local.decoding == 0
        and local.cost.compute_s > max_idle_compute_s
    ):
        return False
    return local.total_s < remote.total_s


def handoff_coefficients(view: ClusterView, decode: NodeLoad) -> HandoffCoefficients:
    """The fitted hand-off model, its prior priced on ``decode``'s block size and bandwidth."""
    prior = handoff_prior(
        view.costs.pull_overhead_s, view.block_bytes(decode), view.fallback_bandwidth(decode)
    )
    return view.handoffs.coefficients(prior)


def choose_local(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    remote: PrefillCost,
    ranked: Sequence[DecodeForecast],
    tbt_slo_s: float | None,
    avoid: Collection[str] = (),
    common: CommonPrefix | None = None,
) -> tuple[LocalPrefill, DecodeForecast] | None:
    """The cheapest local prefill, among the ranked decode nodes that take prefill tasks and
    have room, if it beats prefilling as ``remote`` prices it and handing off to
    ``ranked[0]``; None when disaggregating is better or no node may. A decode node's prompt
    is priced with the step times of the prefill node it competes with: the nodes run one
    model, and a decode node's own steps, nearly all decodes, say little of a prefill's."""
    if not ranked:
        return None
    coef = view.timing.coefficients(remote.node_id, "prefill")
    pause_coef = _pause_coefficients(view, remote.node_id, coef)
    pricing: Pricing | None = None
    best: tuple[LocalPrefill, DecodeForecast] | None = None
    for f in ranked:
        node = view.nodes.get(f.node_id)
        if node is None or not node.local_prefill or not f.fits or node.block_size <= 0:
            continue
        if pricing is None:
            pricing = Pricing(request, view, holders, now, node.block_size, avoid, common)
        step = node.max_num_batched_tokens or view.costs.max_num_batched_tokens
        cost = pricing.cost_on(node, pricing.model_of(coef, step, node.block_size))
        pause = pause_seconds(pause_coef, request.num_prompt_tokens, cost.cached_tokens, step)
        running = decoding(view, node, request, now, now + cost.ttft_s)
        local = LocalPrefill(cost, pause, running, f.tbt_s, view.costs.local_prefill_stall_weight)
        if best is None or local.total_s < best[0].total_s:
            best = (local, f)
    target = view.nodes.get(ranked[0].node_id)
    if best is None or pricing is None or target is None:
        return None
    blocks = -(-request.num_prompt_tokens // target.block_size)
    lacking = blocks - pricing.local(target, pricing.limit(target))
    handoff_s = handoff_coefficients(view, target).seconds(lacking)
    disaggregated = Disaggregated(remote.ttft_s, handoff_s)
    costs = view.costs
    chosen = prefer_local(
        best[0],
        disaggregated,
        tbt_slo_s,
        costs.local_prefill_max_pause_s,
        costs.local_prefill_max_idle_compute_s,
    )
    return best if chosen else None


def _pause_coefficients(
    view: ClusterView, prefill_node: str, coef: StepCoefficients
) -> StepCoefficients:
    """What prices a local prefill's pause of the streams on a decode node. A pause is an
    extrapolation: the prompts a decode node would take are longer than most a prefill node
    has run while decode nodes took the short ones, and a few short, noisy steps leave a fit's
    slope to chance (down to zero, which prices any prompt's pause as free). Until the fit is
    settled, the pause is the larger of the fit's and the prior's."""
    if view.timing.settled(prefill_node, "prefill"):
        return coef
    prior = view.timing.prior_for("prefill")
    return StepCoefficients(
        0.0,
        max(coef.per_token_s, prior.per_token_s),
        max(coef.per_attention_s, prior.per_attention_s),
    )


def decoding(
    view: ClusterView, node: NodeLoad, request: PlacementRequest, now: float, until: float
) -> int:
    """The other sequences decode node ``node`` runs while a prompt computed there from now
    until ``until`` pauses them: those it runs now (its last heartbeat's, less those predicted
    done since, plus those placed on it and due by now: ``forecast``), and those due by
    ``until``. None is taken as finishing during the pause."""
    now_running = forecast(node, view, request, now).seqs - 1
    later = view.arriving_by(node.node_id, until)[0] - view.arriving_by(node.node_id, now)[0]
    return max(now_running, 0) + later


def pause_seconds(
    coef: StepCoefficients, prompt_tokens: int, cached_tokens: int, max_batched_tokens: int
) -> float:
    """What computing the uncached part of a prompt adds to the steps it shares with decodes:
    its prefill time without the per-step base, which those steps pay anyway."""
    marginal = StepCoefficients(0.0, coef.per_token_s, coef.per_attention_s)
    return prefill_seconds(
        marginal, prompt_tokens - cached_tokens, cached_tokens, max_batched_tokens
    )


def break_even_tokens(
    coef: StepCoefficients,
    max_batched_tokens: int,
    step_s: float,
    decoding: int,
    handoff: HandoffCoefficients,
    block_size: int,
    tbt_slo_s: float | None = None,
    limit: int = 1 << 20,
    max_pause_s: float | None = None,
    max_idle_compute_s: float | None = None,
    stall_weight: float = 1.0,
) -> int:
    """The longest fresh prompt (nothing cached, idle queues) that ``prefer_local`` prefills
    on a decode node stepping in ``step_s`` with ``decoding`` other sequences, when a prefill
    node with the same step times would take it otherwise; 0 when none, ``limit`` when every
    length would be (an idle node with no objective: nobody waits for it). For the operator
    and the tests: the threshold the fits imply, not an input."""

    def local_wins(tokens: int) -> bool:
        compute = prefill_seconds(coef, tokens, 0, max_batched_tokens)
        pause = pause_seconds(coef, tokens, 0, max_batched_tokens)
        cost = PrefillCost("", 0.0, 0.0, compute, 0, 0, (), 0)
        remote = Disaggregated(compute, handoff.seconds(-(-tokens // block_size)))
        local = LocalPrefill(cost, pause, decoding, step_s, stall_weight)
        return prefer_local(local, remote, tbt_slo_s, max_pause_s, max_idle_compute_s)

    if not local_wins(1):
        return 0
    low, high = 1, limit  # local_wins(low); the decision flips at most once as tokens grow
    if local_wins(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        if local_wins(mid):
            low = mid
        else:
            high = mid
    return low
