"""Node loads and placement checks shared by the scheduler's placement tests."""

from __future__ import annotations

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.policy import Placement, Rejection
from services.scheduler.timing import StepCoefficients, StepTimes

#: The clock every node load was last seen at.
NOW = 100.0
#: 10 ms a step plus 1 ms a token, no attention cost.
COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=0.0)


def node(node_id: str, role: str, **load: object) -> NodeLoad:
    """An idle node with 100 free blocks of 32 tokens, seen at ``NOW``; ``load`` overrides."""
    values: dict[str, object] = {
        "queued_tokens": 0,
        "running_seqs": 0,
        "free_blocks": 100,
        "total_blocks": 100,
        "block_size": 32,
        "last_seen": NOW,
    } | load
    return NodeLoad(node_id=node_id, role=role, **values)  # type: ignore[arg-type]


def cluster(*nodes: NodeLoad) -> ClusterView:
    """A view of ``nodes`` (heartbeats time out after 3 s) whose step times follow ``COEF``."""
    view = ClusterView(3.0, timing=StepTimes(COEF))
    for n in nodes:
        view.update(n)
    return view


def placed(decision: Placement | Rejection) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision
