"""The cluster as the scheduler last saw it: node loads, their step-time models, cost constants.

Pure: no I/O and no framework, so the simulator can build and drive one directly.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from services.scheduler.arrival_rate import ArrivalRates
from services.scheduler.calibration import TtftCalibration
from services.scheduler.decode_index import DecodeIndex
from services.scheduler.handoff import HandoffTimes
from services.scheduler.index import PrefillClass, PrefillIndex
from services.scheduler.inflight import Arrivals, InFlight
from services.scheduler.timing import StepTimes
from shared.kv.tiers import LOWER_TIER_SUFFIXES, NVME, S3, bandwidth_key

#: The roles that hold KV blocks in their pools.
_SERVING = ("prefill", "decode")
#: The role that holds KV blocks below DRAM (NVMe files, S3): a source, never a target.
TIERD = "tierd"
#: Heartbeat timeouts a tierd stays a source without a heartbeat (``ClusterView.source_alive``).
TIERD_GRACE = 3


@dataclass(slots=True)
class NodeLoad:
    """A node as its last heartbeat described it, plus the prompt tokens placed on it since.

    ``host_id`` names the machine it runs on. ``tiers`` (a tierd) maps a tier to its
    ``(capacity, used)`` bytes and ``read_bandwidth`` to the bytes/s it measured reading it.
    ``finishing`` (decode nodes) holds ``(tokens it may still generate, tokens in its KV)`` of
    the running sequences nearest their end, fewest remaining first (``ClusterView.update``
    sorts it). ``healthy`` False (a stuck engine) or ``draining``: no new work, though the node
    may still serve pulls while its heartbeats come.
    """

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
    # Bytes/s of pulls by source: a peer's id, or ``bandwidth_key(tierd, tier)``.
    fetch_bandwidth: dict[str, float] = field(default_factory=dict)
    epoch: str = ""  # changes when the node's process restarts
    healthy: bool = True
    finishing: tuple[tuple[int, int], ...] = ()
    placed_tokens: int = 0  # tokens a prefill node must compute for requests placed since
    host_id: str = ""  # "" when the node did not say
    tiers: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Its NATS connection closed after its last heartbeat (the server's advisory said so).
    disconnected: bool = False
    read_bandwidth: dict[str, float] = field(default_factory=dict)
    local_prefill: bool = False  # a decode node that takes prefill tasks of its own


@dataclass(frozen=True, slots=True)
class CostParams:
    """Constants of the cost model where nodes report nothing better.

    ``max_num_batched_tokens``: tokens per step of a node that does not report its own.
    ``default_fetch_bandwidth``: bytes/s of a pull when no node has measured any.
    ``default_block_bytes``: bytes of a block when its node does not report it (SmolLM2-135M,
    fp32, 32 tokens). ``pull_overhead_s``: fixed cost of a pull (pin round trip, setup).
    ``nvme_read_bandwidth`` / ``s3_read_bandwidth``: bytes/s a tierd reads a tier at when it
    has not measured it; ``nvme_latency_s`` / ``s3_latency_s``: what a read of that tier adds
    to a pull before its first byte. ``local_prefill_stall_weight``: how many seconds of a
    request's wait one second of a stream's pause by a local prefill counts as.
    ``local_prefill_max_pause_s``: the longest a prompt computed on a decode node may pause
    the sequences decoding there (None: no absolute bound; the weighed sums decide).
    ``local_prefill_max_idle_compute_s``: the longest a prompt's compute on a decode node
    with nothing decoding may take (None: no bound).
    """

    max_num_batched_tokens: int = 2048
    default_fetch_bandwidth: float = 1e9
    default_block_bytes: int = 32 * 46_080
    pull_overhead_s: float = 0.002
    nvme_read_bandwidth: float = 1.5e9
    s3_read_bandwidth: float = 2.5e8
    nvme_latency_s: float = 0.001
    s3_latency_s: float = 0.02
    local_prefill_stall_weight: float = 2.0
    local_prefill_max_pause_s: float | None = None
    local_prefill_max_idle_compute_s: float | None = 2.0

    def tier_latency_s(self, tier: str) -> float:
        """Seconds a read of ``tier`` adds to a pull (none for a pool in DRAM)."""
        return {NVME: self.nvme_latency_s, S3: self.s3_latency_s}.get(tier, 0.0)

    def tier_read_bandwidth(self, tier: str) -> float:
        """Bytes/s a tierd is assumed to read ``tier`` at before it measured any."""
        return {NVME: self.nvme_read_bandwidth, S3: self.s3_read_bandwidth}.get(
            tier, self.default_fetch_bandwidth
        )


@dataclass(slots=True)
class ClusterView:
    """Owns the freshest view of every node, their step-time and hand-off models, the
    requests placed but not yet arrived at their decode nodes, and the recent rate of
    placements on each decode node.

    Invariants: a heartbeat resets the prompt tokens placed on its node (its queue now counts
    them) and forgets the arrivals due by then and those it names as arrived (its own counts
    include them); a heartbeat with a new epoch (a restart) also forgets every arrival due
    there and every request its prefill node was computing. Every indexed request id is in
    exactly one ``Arrivals``. ``prefill_index`` holds every prefill node as last updated;
    ``decode_index`` every decode node unless it is out of date with ``timing``
    (``decode_search`` brings it up to date).
    """

    heartbeat_timeout_s: float = 3.0
    nodes: dict[str, NodeLoad] = field(default_factory=dict)
    timing: StepTimes = field(default_factory=StepTimes)
    costs: CostParams = field(default_factory=CostParams)
    calibration: TtftCalibration = field(default_factory=TtftCalibration)
    handoffs: HandoffTimes = field(default_factory=HandoffTimes)
    arrival_rates: ArrivalRates = field(default_factory=ArrivalRates)
    _bandwidth_sum: tuple[float, int] = (0.0, 0)
    _arrivals: dict[str, Arrivals] = field(default_factory=dict)
    _by_request: dict[str, InFlight] = field(default_factory=dict)
    prefill_index: PrefillIndex = field(default_factory=PrefillIndex)
    decode_index: DecodeIndex = field(default_factory=DecodeIndex)

    def update(self, node: NodeLoad, arrived: Collection[str] = ()) -> None:
        """Takes a node's heartbeat (a new ``NodeLoad``, or the same one with new values) and
        the ids of the requests it says reached it since its last one."""
        node_id = node.node_id
        old = self.nodes.get(node_id)
        if node.finishing or type(node.finishing) is not tuple:
            node.finishing = tuple(sorted(node.finishing))
        self.nodes[node_id] = node
        if old is not None and old.fetch_bandwidth:
            self._count_bandwidth(old, -1)
        if node.fetch_bandwidth:
            self._count_bandwidth(node, +1)
        if old is not None and old.epoch != node.epoch:
            self._forget_placed(node_id)
        else:
            arrivals = self._arrivals.get(node_id)
            if arrivals is not None and arrivals.entries:
                self._unindex(arrivals.drop_until(node.last_seen))
        # Taken there, the node counts them itself, however late their predicted arrival (a
        # busy host's predictions run long), and wherever they were placed (a prefill node may
        # hand over to another ranked decode node); their prefill is done or counted there.
        for request_id in arrived:
            self.withdraw(request_id)
        self._reindex(node)

    def _reindex(self, node: NodeLoad) -> None:
        role = node.role
        if role == "prefill":
            self.prefill_index.put(node, self.pricing_class(node))
        elif node.node_id in self.prefill_index.where:  # a node whose role changed
            self.prefill_index.remove(node.node_id)
        if role == "decode":
            if self.decode_index.version == self.timing.version:
                self.decode_index.put(node)
        else:
            self.decode_index.remove(node.node_id)

    def pricing_class(self, node: NodeLoad) -> PrefillClass:
        """What a prefill node's costs share with others beside its queue: tokens per step,
        block size and block bytes."""
        step = node.max_num_batched_tokens or self.costs.max_num_batched_tokens
        return (step, node.block_size, self.block_bytes(node))

    def decode_search(self) -> DecodeIndex:
        """The decode index, rebuilt first if the role's shared step-time model changed."""
        index = self.decode_index
        if index.version != self.timing.version:
            index = DecodeIndex(self.timing.version, self.timing.shared("decode"))
            index.watermark = self.decode_index.watermark
            for node in self.nodes.values():
                if node.role == "decode":
                    index.put(node)
            self.decode_index = index
        return index

    def _count_bandwidth(self, node: NodeLoad | None, sign: int) -> None:
        """Keeps the sum and count of every bandwidth measured from a peer's pool, so the
        cluster-wide mean costs O(1) per placement instead of a scan of every node."""
        if node is None or not node.fetch_bandwidth:
            return
        known = _pool_bandwidths(node)
        total, count = self._bandwidth_sum
        self._bandwidth_sum = (total + sign * sum(known), count + sign * len(known))

    def alive(self, node: NodeLoad, now: float) -> bool:
        return now - node.last_seen <= self.heartbeat_timeout_s

    def source_alive(self, node: NodeLoad, now: float) -> bool:
        """Whether ``node``'s blocks may still be pulled. A tierd busy moving blocks may send
        its heartbeat late, and its files stay where they are meanwhile: it remains a source
        for ``TIERD_GRACE`` timeouts unless NATS said its connection closed. A pull from one
        that is gone costs a pin's timeout, then the prefix is computed."""
        if node.role != TIERD:
            return self.alive(node, now)
        grace = TIERD_GRACE * self.heartbeat_timeout_s
        return not node.disconnected and now - node.last_seen <= grace

    def live(self, role: str, now: float) -> list[NodeLoad]:
        """Nodes of ``role`` with a recent heartbeat, whether or not they take work."""
        return [n for n in self.nodes.values() if n.role == role and self.alive(n, now)]

    def targets(self, role: str, now: float) -> list[NodeLoad]:
        """Nodes of ``role`` that may be given new work: alive, healthy, not draining."""
        return [n for n in self.live(role, now) if n.healthy and not n.draining]

    def takes_work(self, node: NodeLoad, role: str, now: float, avoid: Collection[str]) -> bool:
        """Whether ``node`` is one of ``targets(role, now)`` and not in ``avoid``."""
        return (
            node.role == role
            and self.alive(node, now)
            and node.healthy
            and not node.draining
            and node.node_id not in avoid
        )

    def sources(self, now: float) -> list[NodeLoad]:
        """Nodes whose blocks may be pulled: every alive prefill or decode node (its pool),
        draining or unhealthy ones too (pins are served beside the engine's steps, not by
        them), and every alive tierd (its NVMe and S3 tiers)."""
        return [
            n
            for n in self.nodes.values()
            if (n.role in _SERVING or n.role == TIERD) and self.source_alive(n, now)
        ]

    def forget_dead(self, now: float) -> list[str]:
        """Drops nodes silent for ten timeouts, their samples and what was placed on them;
        returns their ids."""
        dead = [
            k for k, n in self.nodes.items() if now - n.last_seen > 10 * self.heartbeat_timeout_s
        ]
        for node_id in dead:
            self._count_bandwidth(self.nodes.pop(node_id), -1)
            self.prefill_index.remove(node_id)
            self.decode_index.remove(node_id)
            self.timing.forget(node_id)
            self.calibration.forget(node_id)
            self.arrival_rates.forget(node_id)
            self._forget_placed(node_id)
        return dead

    def arrivals(self, node_id: str) -> Arrivals:
        """The requests on their way to decode node ``node_id`` (read only: an empty one is
        not kept)."""
        found = self._arrivals.get(node_id)
        return found if found is not None else Arrivals()

    def arriving(self, node_id: str) -> Arrivals | None:
        """``arrivals(node_id)``, None when nothing is on its way there (read only)."""
        return self._arrivals.get(node_id)

    def arriving_by(self, node_id: str, t: float) -> tuple[int, int]:
        """``arrivals(node_id).by(t)``."""
        found = self._arrivals.get(node_id)
        return (0, 0) if found is None else found.by(t)

    def record(self, entry: InFlight) -> None:
        """Counts a placed request on its prefill node (until that node's next heartbeat) and
        on its decode node (until it is due there). A request id placed again replaces its
        earlier placement."""
        if entry.request_id:
            self.withdraw(entry.request_id)
            self._by_request[entry.request_id] = entry
        prefill = self.nodes.get(entry.prefill_node)
        if prefill is not None:
            prefill.placed_tokens += entry.prefill_tokens
            self._reindex(prefill)
        arrivals = self._arrivals.get(entry.decode_node)
        if arrivals is None:
            arrivals = self._arrivals[entry.decode_node] = Arrivals()
        arrivals.add(entry)

    def withdraw(self, request_id: str) -> bool:
        """Uncounts a placed request that will not arrive (its task was refused or never
        acknowledged, or it was aborted) or that a decode node says arrived; False when it is
        not counted anywhere."""
        entry = self._by_request.pop(request_id, None)
        if entry is None:
            return False
        self._arrivals[entry.decode_node].remove(entry)
        prefill = self.nodes.get(entry.prefill_node)
        # Tokens placed before the node's last heartbeat were reset by it.
        if prefill is not None and entry.placed_at > prefill.last_seen:
            prefill.placed_tokens = max(prefill.placed_tokens - entry.prefill_tokens, 0)
            self._reindex(prefill)
        return True

    def _forget_placed(self, node_id: str) -> None:
        """A node restarted or died: nothing due at it arrives, and nothing it was
        prefilling leaves it."""
        self._unindex(self._arrivals.pop(node_id, Arrivals()).entries)
        for arrivals in self._arrivals.values():
            lost = [e for e in arrivals.entries if e.prefill_node == node_id]
            for entry in lost:
                arrivals.remove(entry)
            self._unindex(lost)

    def _unindex(self, entries: list[InFlight]) -> None:
        for entry in entries:
            if self._by_request.get(entry.request_id) is entry:
                del self._by_request[entry.request_id]

    def block_bytes(self, node: NodeLoad) -> int:
        return node.block_bytes if node.block_bytes > 0 else self.costs.default_block_bytes

    def fetch_bandwidth(self, node: NodeLoad, source: str) -> float:
        """Bytes/s of ``node`` pulling from ``source``: as measured; else the mean of what
        ``node`` measured from anyone; else the mean over all nodes; else the default."""
        measured = node.fetch_bandwidth.get(source, 0.0)
        return measured if measured > 0 else self.fallback_bandwidth(node)

    def fallback_bandwidth(self, node: NodeLoad) -> float:
        """Bytes/s assumed for a peer's pool ``node`` has not measured, which is also what its
        transfer layer is taken to carry: the mean of its pulls from pools, else of the
        cluster's, else the default. Pulls from lower tiers are left out (a slow disk says
        nothing of the network)."""
        own = _pool_bandwidths(node) if node.fetch_bandwidth else None
        if own:
            return sum(own) / len(own)
        total, count = self._bandwidth_sum
        return total / count if count else self.costs.default_fetch_bandwidth

    def tier_bandwidth(self, node: NodeLoad, tierd_id: str, tier: str, transfer: float) -> float:
        """Bytes/s of ``node`` pulling from tierd ``tierd_id``'s ``tier`` (``nvme`` or ``s3``):
        as ``node`` measured it; else the tierd's measured read of the tier (else the tier's
        default) bounded by ``transfer``, ``node``'s transfer bandwidth, since the blocks cross
        both. NVMe on ``node``'s own host is read directly: no transfer bound."""
        measured = node.fetch_bandwidth.get(bandwidth_key(tierd_id, tier), 0.0)
        if measured > 0:
            return measured
        tierd = self.nodes.get(tierd_id)
        read = tierd.read_bandwidth.get(tier, 0.0) if tierd is not None else 0.0
        if read <= 0:
            read = self.costs.tier_read_bandwidth(tier)
        if tier == NVME and tierd is not None and node.host_id and node.host_id == tierd.host_id:
            return read
        return min(read, transfer)


def _pool_bandwidths(node: NodeLoad) -> list[float]:
    """What ``node`` measured pulling from peers' pools (keys of lower tiers left out)."""
    return [
        bw
        for key, bw in node.fetch_bandwidth.items()
        if bw > 0 and not key.endswith(LOWER_TIER_SUFFIXES)
    ]
