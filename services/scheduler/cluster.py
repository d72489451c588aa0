"""The cluster as the scheduler last saw it: node loads, their step-time models, cost constants.

Pure: no I/O and no framework, so the simulator can build and drive one directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.timing import StepTimes


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
    model_id: str = ""
    kv_dtype: str = ""
    block_bytes: int = 0  # bytes of one KV block; 0 when the node did not say
    max_num_batched_tokens: int = 0  # tokens per engine step; 0 when the node did not say
    fetch_bandwidth: dict[str, float] = field(default_factory=dict)  # bytes/s by source node
    placed_tokens: int = 0  # tokens a prefill node must compute for requests placed since
    placed_seqs: int = 0  # sequences sent to a decode node since its heartbeat
    placed_blocks: int = 0  # blocks those sequences will need there


@dataclass(frozen=True, slots=True)
class CostParams:
    """Constants of the cost model where nodes report nothing better.

    ``max_num_batched_tokens``: tokens per step of a node that does not report its own.
    ``default_fetch_bandwidth``: bytes/s of a pull when no node has measured any.
    ``default_block_bytes``: bytes of a block when its node does not report it (SmolLM2-135M,
    fp32, 32 tokens). ``pull_overhead_s``: fixed cost of a pull (pin round trip, setup).
    """

    max_num_batched_tokens: int = 2048
    default_fetch_bandwidth: float = 1e9
    default_block_bytes: int = 32 * 46_080
    pull_overhead_s: float = 0.002


@dataclass(slots=True)
class ClusterView:
    """Owns the freshest view of every node and their step-time models. Invariant: a heartbeat
    resets what was placed on that node, because the node's own counts now include it."""

    heartbeat_timeout_s: float = 3.0
    nodes: dict[str, NodeLoad] = field(default_factory=dict)
    timing: StepTimes = field(default_factory=StepTimes)
    costs: CostParams = field(default_factory=CostParams)
    _bandwidth_sum: tuple[float, int] = (0.0, 0)

    def update(self, node: NodeLoad) -> None:
        old = self.nodes.get(node.node_id)
        self.nodes[node.node_id] = node
        self._count_bandwidth(old, -1)
        self._count_bandwidth(node, +1)

    def _count_bandwidth(self, node: NodeLoad | None, sign: int) -> None:
        """Keeps the sum and count of every measured bandwidth, so the cluster-wide mean
        costs O(1) per placement instead of a scan of every node."""
        if node is None:
            return
        known = [bw for bw in node.fetch_bandwidth.values() if bw > 0]
        total, count = self._bandwidth_sum
        self._bandwidth_sum = (total + sign * sum(known), count + sign * len(known))

    def live(self, role: str, now: float) -> list[NodeLoad]:
        return [
            n
            for n in self.nodes.values()
            if n.role == role and not n.draining and now - n.last_seen <= self.heartbeat_timeout_s
        ]

    def forget_dead(self, now: float) -> list[str]:
        """Drops nodes silent for ten timeouts, and their samples; returns their ids."""
        dead = [
            k for k, n in self.nodes.items() if now - n.last_seen > 10 * self.heartbeat_timeout_s
        ]
        for node_id in dead:
            self._count_bandwidth(self.nodes.pop(node_id), -1)
            self.timing.forget(node_id)
        return dead

    def block_bytes(self, node: NodeLoad) -> int:
        return node.block_bytes if node.block_bytes > 0 else self.costs.default_block_bytes

    def fetch_bandwidth(self, node: NodeLoad, source: str) -> float:
        """Bytes/s of ``node`` pulling from ``source``: as measured; else the mean of what
        ``node`` measured from anyone; else the mean over all nodes; else the default."""
        measured = node.fetch_bandwidth.get(source, 0.0)
        return measured if measured > 0 else self.fallback_bandwidth(node)

    def fallback_bandwidth(self, node: NodeLoad) -> float:
        """Bytes/s assumed for a source ``node`` has not measured."""
        own = [bw for bw in node.fetch_bandwidth.values() if bw > 0]
        if own:
            return sum(own) / len(own)
        total, count = self._bandwidth_sum
        return total / count if count else self.costs.default_fetch_bandwidth
