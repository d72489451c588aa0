"""Where a request runs: a pure function of the request and the cluster as last seen.

No I/O and no framework here, so the simulator and the unit tests run exactly this code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class NodeLoad:
    """A node as its last heartbeat described it, plus what was placed on it since."""

    node_id: str
    role: str
    queued_tokens: int
    running_seqs: int
    free_blocks: int
    total_blocks: int
    block_size: int
    last_seen: float
    draining: bool = False
    placed_tokens: int = 0  # prompt tokens sent to a prefill node since its heartbeat
    placed_seqs: int = 0  # sequences sent to a decode node since its heartbeat
    placed_blocks: int = 0  # blocks those sequences will need there


@dataclass(slots=True)
class ClusterView:
    """Owns the freshest view of every node. Invariant: a heartbeat resets what was placed on
    that node, because the node's own counts now include it."""

    heartbeat_timeout_s: float = 3.0
    nodes: dict[str, NodeLoad] = field(default_factory=dict)

    def update(self, node: NodeLoad) -> None:
        self.nodes[node.node_id] = node

    def live(self, role: str, now: float) -> list[NodeLoad]:
        return [
            n
            for n in self.nodes.values()
            if n.role == role and not n.draining and now - n.last_seen <= self.heartbeat_timeout_s
        ]

    def forget_dead(self, now: float) -> list[str]:
        """Drops nodes silent for ten timeouts; returns their ids."""
        dead = [
            k for k, n in self.nodes.items() if now - n.last_seen > 10 * self.heartbeat_timeout_s
        ]
        for node_id in dead:
            del self.nodes[node_id]
        return dead


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    num_prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Placement:
    prefill_node: str
    decode_node: str


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request cannot be placed; ``status`` is the HTTP status the client should see."""

    reason: str
    status: int = 503
    retry_after_s: float | None = None


def place(request: PlacementRequest, view: ClusterView, now: float) -> Placement | Rejection:
    """Least-loaded placement: the prefill node with the fewest tokens waiting, and the decode
    node with the fewest sequences among those with room for this one (any live one if none
    has room: it queues there rather than failing)."""
    prefills = view.live("prefill", now)
    decodes = view.live("decode", now)
    if not prefills:
        return Rejection("no prefill node is available")
    if not decodes:
        return Rejection("no decode node is available")
    prefill = min(prefills, key=lambda n: (n.queued_tokens + n.placed_tokens, n.node_id))
    with_room = [n for n in decodes if _has_room(n, request)]
    decode = min(with_room or decodes, key=lambda n: (n.running_seqs + n.placed_seqs, n.node_id))
    return Placement(prefill.node_id, decode.node_id)


def record_placement(view: ClusterView, placement: Placement, request: PlacementRequest) -> None:
    """Counts the request against its nodes until their next heartbeats."""
    prefill = view.nodes[placement.prefill_node]
    prefill.placed_tokens += request.num_prompt_tokens
    decode = view.nodes[placement.decode_node]
    decode.placed_seqs += 1
    decode.placed_blocks += blocks_needed(decode, request)


def blocks_needed(node: NodeLoad, request: PlacementRequest) -> int:
    return -(-(request.num_prompt_tokens + request.max_tokens) // node.block_size)


def _has_room(node: NodeLoad, request: PlacementRequest) -> bool:
    return node.free_blocks - node.placed_blocks >= blocks_needed(node, request)
