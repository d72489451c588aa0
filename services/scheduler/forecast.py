"""A decode node's load when a request's prefill ends: early rejection based on prediction.

Mooncake (Qin et al., FAST 2025, §7) shows that admitting on the decode load at the time
of the request makes admission swing: decode looks idle while a burst is still prefilling, the
burst lands, then everything is refused while it drains. The load that matters is the one at
the time the new request's prefill ends, ``at = now + predicted TTFT``:

    load(at) = heartbeat + placed requests due by ``at`` - sequences finished by ``at``

Sequences that finish are those the node reported with at most as many tokens left as it will
take steps by then. What a request is promised is the time between tokens over its decode, not
at its first step: requests not placed yet join the batch while it decodes. ``tbt_life_s``
is the step time halfway through its decode (``max_tokens`` steps, at most ``LIFE_HORIZON_S``),
with the node's recent placements under a looser objective than the request's own
(``arrival_rate``) adding sequences like it, and those the node reported finishing by then
gone. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.costs import PlacementRequest
from services.scheduler.timing import StepCoefficients, decode_step_seconds

#: Steps assumed when the step-time model says a step costs nothing.
_MAX_STEPS = 1 << 24
#: Delays (s) at which a refused request is tried again in the forecast, for its Retry-After.
RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: Retry-After when no delay in ``RETRY_DELAYS_S`` is predicted to help.
RETRY_CAP_S = 60.0
#: The longest decode a lifetime forecast looks across (s): further ahead, who arrives is
#: too uncertain to refuse a request for.
LIFE_HORIZON_S = 30.0


@dataclass(frozen=True, slots=True)
class DecodeForecast:
    """A decode node's predicted state at ``at`` with the request in its batch. Invariant:
    ``tbt_s`` is one decode step of ``seqs`` sequences over ``context_tokens``; ``free_blocks``
    is before the request's ``needed_blocks`` are taken; ``tbt_life_s``, the step time halfway
    through its decode (see the module docstring), is never below ``tbt_s``."""

    node_id: str
    at: float
    seqs: int
    context_tokens: int
    free_blocks: int
    needed_blocks: int
    tbt_s: float
    tbt_life_s: float = 0.0

    @property
    def fits(self) -> bool:
        return self.free_blocks >= self.needed_blocks


def blocks_needed(node: NodeLoad, request: PlacementRequest) -> int:
    """Blocks the request holds on ``node`` at most: its prompt and every token it may make."""
    return -(-(request.num_prompt_tokens + request.max_tokens) // node.block_size)


def forecast(
    node: NodeLoad,
    view: ClusterView,
    request: PlacementRequest,
    at: float,
    coef: StepCoefficients | None = None,
) -> DecodeForecast:
    """``node``'s load at ``at`` (see the module docstring). KV counts every placed request
    still on its way, due by ``at`` or not: their blocks are spoken for either way. ``coef``:
    the node's step-time model when the caller has it (``view.timing.coefficients``)."""
    if coef is None:
        coef = view.timing.coefficients(node.node_id, "decode")
    arrivals = view.arriving(node.node_id)
    if arrivals is None:
        come = come_tokens = spoken_for = 0
    else:
        come, come_tokens = arrivals.by(at)
        spoken_for = arrivals.blocks
    bs = node.block_size
    batch = node.running_seqs + come + 1
    context = max(node.total_blocks - node.free_blocks, 0) * bs + come_tokens
    context += request.num_prompt_tokens
    # No step before ``at`` is slower than one with nobody gone yet, so counting steps at that
    # pace never predicts a departure that comes later than predicted.
    steps = _steps(at - node.last_seen, decode_step_seconds(coef, batch, context))
    gone, gone_tokens, gone_blocks = _finished(node.finishing, steps, bs)
    staying = max(node.running_seqs - gone, 0)
    batch -= gone
    # Every sequence that stays adds a token per step, and on average a block per block_size.
    context = max(context - gone_tokens, 0) + staying * steps
    grown_blocks = -(-(staying * steps) // bs)
    free = node.free_blocks - spoken_for - grown_blocks + gone_blocks
    tbt_s = decode_step_seconds(coef, batch, context)
    rate = view.arrival_rates.rate(node.node_id, at, looser_than=request.tbt_slo_s)
    return DecodeForecast(
        node_id=node.node_id,
        at=at,
        seqs=batch,
        context_tokens=context,
        free_blocks=free,
        needed_blocks=blocks_needed(node, request),
        tbt_s=tbt_s,
        tbt_life_s=_over_its_life(node, request, coef, rate, (batch, context), steps, tbt_s),
    )


def _over_its_life(
    node: NodeLoad,
    request: PlacementRequest,
    coef: StepCoefficients,
    rate: float,
    start: tuple[int, int],
    steps_before: int,
    tbt_s: float,
) -> float:
    """The step time halfway through the request's decode, which starts with ``start``
    (sequences, context tokens) after ``steps_before`` steps of the node: ``rate`` placements
    a second join, each with a context like the request's, and the sequences the node
    reported finishing by then leave. Never below ``tbt_s``."""
    if rate <= 0 or tbt_s <= 0:
        return tbt_s
    half_s = min(request.max_tokens * tbt_s, LIFE_HORIZON_S) / 2
    half_steps = int(half_s / tbt_s)
    bs = node.block_size
    gone_before, tokens_before, _ = _finished(node.finishing, steps_before, bs)
    gone_by, tokens_by, _ = _finished(node.finishing, steps_before + half_steps, bs)
    joining = rate * half_s
    batch = start[0] - (gone_by - gone_before) + joining
    context = start[1] - (tokens_by - tokens_before) + joining * request.num_prompt_tokens
    context += batch * half_steps
    mid = decode_step_seconds(coef, max(round(batch), 1), max(int(context), 0))
    return max(tbt_s, mid)


def retry_after(
    nodes: Sequence[NodeLoad],
    view: ClusterView,
    request: PlacementRequest,
    at: float,
    acceptable: Callable[[DecodeForecast], bool],
) -> float:
    """The first of ``RETRY_DELAYS_S`` after which some node's forecast is ``acceptable`` for
    the same request (its prefill ending that much later), else ``RETRY_CAP_S``. Only what is
    known now counts, so a busy cluster may need more."""
    for delay in RETRY_DELAYS_S:
        if any(acceptable(forecast(n, view, request, at + delay)) for n in nodes):
            return delay
    return RETRY_CAP_S


def _steps(horizon_s: float, step_s: float) -> int:
    if horizon_s <= 0:
        return 0
    if step_s <= 0:
        return _MAX_STEPS
    return min(int(horizon_s / step_s), _MAX_STEPS)


def _finished(
    finishing: tuple[tuple[int, int], ...], steps: int, block_size: int
) -> tuple[int, int, int]:
    """Sequences of ``finishing`` done within ``steps``, their context tokens and blocks (each
    frees what it held when reported; what it grew since is freed with it)."""
    count = tokens = blocks = 0
    for remaining, context in finishing:
        if remaining > steps:
            break
        count += 1
        tokens += context
        blocks += -(-context // block_size)
    return count, tokens, blocks
