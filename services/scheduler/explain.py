"""Why a placement went where it did, as one debug log line: the holders it was priced on, the
bandwidths it assumed from the chosen node to each, and how recently each holder was heard
from (a holder placement could not use). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from services.scheduler.cluster import ClusterView
from services.scheduler.policy import Placement
from shared.kv.tiers import DRAM, bandwidth_key
from shared.rpc.types import PrefixHolder


def explain(
    view: ClusterView,
    request_id: str,
    placement: Placement,
    holders: Sequence[PrefixHolder],
    now: float,
) -> str:
    """The debug line for ``placement``, heartbeats aged at ``now`` (monotonic)."""
    local = " (local prefill)" if placement.local else ""
    return (
        f"placing {request_id} on {placement.prefill_node}{local}: holders {list(holders)}, "
        f"pulls {placement.pulls}, predicted TTFT {placement.predicted_ttft_s:.3f} s, "
        f"bandwidths {priced_bandwidths(view, placement, holders)}, "
        f"holders' last heartbeats {holders_seen(view, holders, now)}"
    )


def priced_bandwidths(
    view: ClusterView, placement: Placement, holders: Sequence[PrefixHolder]
) -> dict[str, float]:
    """Bytes/s placement assumed for each lower-tier holder, as seen from the chosen node
    (why a cached prefix was or was not pulled)."""
    node = view.nodes.get(placement.prefill_node)
    if node is None:
        return {}
    transfer = view.fallback_bandwidth(node)
    out = {"transfer": transfer}
    for h in holders:
        if h.tier != DRAM:
            out[bandwidth_key(h.node_id, h.tier)] = view.tier_bandwidth(
                node, h.node_id, h.tier, transfer
            )
    return out


def holders_seen(view: ClusterView, holders: Sequence[PrefixHolder], now: float) -> dict[str, str]:
    """How long ago each holder's last heartbeat came, and whether it may be pulled from."""
    out = {}
    for node_id in {h.node_id for h in holders}:
        node = view.nodes.get(node_id)
        if node is None:
            out[node_id] = "never seen"
            continue
        usable = "source" if view.source_alive(node, now) else "not a source"
        gone = ", disconnected" if node.disconnected else ""
        out[node_id] = f"{now - node.last_seen:.1f} s ago ({usable}{gone})"
    return out
