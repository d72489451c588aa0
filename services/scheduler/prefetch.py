"""Moving a placed request's blocks from S3 to NVMe while it waits in its prefill node's queue.

A placement that pulls from a tierd's ``s3`` tier pays for S3's latency and bandwidth when its
prefill node gets to the request. If that node's queue holds the request at least as long as
the tierd takes to read those blocks from S3 (and write them to NVMe), the tierd can do it
meanwhile: the node's pin, when it comes, finds them on NVMe. ``Prefetcher`` sends each
``Prefetch`` of a placement before the task is handed over, through the adapter (which
publishes it as a ``PrefetchRequest`` to the tierd). The plan itself is left as priced (S3): a
prefetch only makes it faster. No framework here, and no I/O but the adapter's ``send``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.costs import Pull
from services.scheduler.policy import Placement
from shared.kv.tiers import NVME, S3

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Blocks (a chain segment, first block first) that tierd ``tierd_id`` should bring up to
    ``to_tier`` before a pull of them comes."""

    tierd_id: str
    block_hashes: tuple[bytes, ...]
    to_tier: str = NVME


def plan_prefetches(
    placement: Placement, view: ClusterView, block_hashes: Sequence[bytes]
) -> list[Prefetch]:
    """One ``Prefetch`` per pull of ``placement`` from a tierd's S3 that the prefill node's
    predicted queue wait can hide (see ``move_seconds``) and that the tierd has NVMe room for.
    ``block_hashes`` are the prompt's block hashes, the ones the placement was priced on."""
    prefill = view.nodes.get(placement.prefill_node)
    if prefill is None:
        return []
    out = []
    for pull in placement.pulls:
        if pull.tier != S3 or pull.first_block + pull.num_blocks > len(block_hashes):
            continue
        num_bytes = pull.num_blocks * view.block_bytes(prefill)
        tierd = view.nodes.get(pull.node_id)
        if not _has_room(tierd, num_bytes):
            continue
        if placement.predicted_wait_s < move_seconds(view, tierd, num_bytes):
            continue
        out.append(Prefetch(pull.node_id, _segment(block_hashes, pull)))
    return out


def move_seconds(view: ClusterView, tierd: NodeLoad | None, num_bytes: int) -> float:
    """Seconds ``tierd`` takes to read ``num_bytes`` from S3: the tier's latency plus the bytes
    at its measured S3 read bandwidth (else the default). Writing NVMe is faster than reading
    S3, so the read bounds the move."""
    measured = tierd.read_bandwidth.get(S3, 0.0) if tierd is not None else 0.0
    bandwidth = measured if measured > 0 else view.costs.tier_read_bandwidth(S3)
    return view.costs.tier_latency_s(S3) + num_bytes / bandwidth


def _has_room(tierd: NodeLoad | None, num_bytes: int) -> bool:
    """Whether ``tierd`` can take ``num_bytes`` more on NVMe: it says so in its ``tiers``, or it
    reports no tiers at all (nothing is known against it)."""
    if tierd is None or not tierd.tiers:
        return True
    capacity, used = tierd.tiers.get(NVME, (0, 0))
    return capacity - used >= num_bytes


def _segment(block_hashes: Sequence[bytes], pull: Pull) -> tuple[bytes, ...]:
    return tuple(block_hashes[pull.first_block : pull.first_block + pull.num_blocks])


class Prefetcher:
    """Owns the scheduler's prefetch switch and its way to the tierds (``send``, the adapter's;
    ``on_sent`` counts the blocks asked for).

    Invariant: a prefetch is a hint: it is sent at most once per request (the caller's
    ``done`` set), and a failure to plan or send it is logged, never raised.
    """

    def __init__(
        self,
        view: ClusterView,
        send: Callable[[Prefetch], Awaitable[None]],
        on_sent: Callable[[int], None],
        *,
        enabled: bool = True,
    ) -> None:
        self.view = view
        self.send = send
        self.on_sent = on_sent
        self.enabled = enabled

    async def prefetch(
        self, placement: Placement, block_hashes: Sequence[bytes], done: set[Prefetch]
    ) -> None:
        """Asks each tierd ``placement`` pulls S3 blocks from to move them to NVMe while the
        request waits in its prefill node's queue (``plan_prefetches`` decides which); ``done``
        holds what this request already asked for, and grows."""
        if not self.enabled:
            return
        try:
            planned = plan_prefetches(placement, self.view, block_hashes)
        except Exception:
            log.exception("planning the prefetches of a placement failed")
            return
        for prefetch in [p for p in planned if p not in done]:
            done.add(prefetch)
            try:
                await self.send(prefetch)
            except Exception as exc:
                log.warning("could not ask tierd %s for a prefetch: %s", prefetch.tierd_id, exc)
                continue
            self.on_sent(len(prefetch.block_hashes))
