"""Offering a request to prefill nodes until one takes it: a small state machine that says what
to do next (``Offer`` the task to a node, ``Withdraw`` it from a node that did not take it,
end ``Accepted`` or ``Refused``) and is told how each offer was answered. The adapter runs
the effects on the bus and feeds the answers back; every decision is made here.

A refusal passes the node over and the next best is offered the task; so does silence, and a
node that timed out may have taken the task and lost only its answer, so it alone is told to
stop. A refusal that carries an error code (a request no node accepts) ends the placement at
once with that code. After ``MAX_TRIES`` offers, or when the policy finds no node left, the
request is refused. Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.scheduler.placer import PlacementQuery, Placer
from services.scheduler.policy import Placement, Rejection, record_placement
from shared.cluster_messages import TaskAck
from shared.rpc.types import PrefixHolder

#: Prefill nodes offered one request before it is refused.
MAX_TRIES = 3
NO_NODE_ACCEPTED = "no prefill node accepted the request"


@dataclass(frozen=True, slots=True)
class Offer:
    """Hand the task to ``placement.prefill_node`` and report its answer; ``expected_ttft_s``
    is the calibrated prediction the task carries."""

    placement: Placement
    expected_ttft_s: float


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The node offered last did not take the task and is never offered it again; ``abort``:
    it may hold the task all the same (its answer was lost), so it alone must be told to stop."""

    node_id: str
    abort: bool


@dataclass(frozen=True, slots=True)
class Accepted:
    """The node offered last took the task (``epoch``: the node's process that did)."""

    placement: Placement
    epoch: str
    expected_ttft_s: float


@dataclass(frozen=True, slots=True)
class Refused:
    """No node will run the request. ``by_policy``: the policy refused it (an objective, no
    node to take it), which counts as a rejection; else the offers ran out or a node's answer
    carried an error code."""

    rejection: Rejection
    by_policy: bool


@dataclass(frozen=True, slots=True)
class Silence:
    """An offer nobody answered: ``gone`` when nothing serves the node's subject (it cannot
    hold the task), else the wait for its answer timed out."""

    gone: bool


@dataclass(slots=True)
class Offers:
    """Owns one request's offers: the nodes passed over, the offers made, the one awaiting an
    answer.

    Invariants: at most one offer awaits an answer (``next`` makes one, ``answer`` takes
    its answer); a node passed over is never offered the request again; an offer's
    placement is counted in the view from the step that computes it (nothing is awaited in
    between) until an answer other than an acceptance uncounts it.
    """

    placer: Placer
    query: PlacementQuery
    holders: Sequence[PrefixHolder]
    avoid: set[str] = field(default_factory=set)
    tries: int = 0
    _pending: Offer | None = None

    def next(self, now: float) -> Offer | Refused:
        """The next offer, or the refusal when no node is left to offer the request to."""
        assert self._pending is None, "an offer awaits its answer"
        if self.tries >= MAX_TRIES:
            return Refused(Rejection(NO_NODE_ACCEPTED, 503), by_policy=False)
        decision = self.placer.decide(self.query, self.holders, self.avoid, now)
        if isinstance(decision, Rejection):
            return Refused(decision, by_policy=True)
        self.tries += 1
        record_placement(self.placer.view, decision, self.query.ask)
        self._pending = Offer(decision, self.placer.expected_ttft_s(decision))
        return self._pending

    def answer(self, answer: TaskAck | Silence) -> Accepted | Withdraw | Refused:
        """What the answer to the last offer means; after a ``Withdraw``, ``next``."""
        offer, self._pending = self._pending, None
        assert offer is not None, "no offer awaits an answer"
        if isinstance(answer, TaskAck) and answer.accepted:
            return Accepted(offer.placement, answer.epoch, offer.expected_ttft_s)
        self.placer.view.withdraw(self.query.ask.request_id)
        if isinstance(answer, TaskAck) and answer.error_code is not None:
            return Refused(Rejection(answer.reason, answer.error_code), by_policy=False)
        node = offer.placement.prefill_node
        self.avoid.add(node)
        return Withdraw(node, abort=isinstance(answer, Silence) and not answer.gone)
