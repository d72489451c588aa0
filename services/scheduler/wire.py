"""Translations between the wire messages and the scheduler's own types: a heartbeat into a
``NodeLoad``, a placement into the ``PrefillTask`` a prefill node gets, a ``Prefetch`` into the
``PrefetchRequest`` its tierd gets, an acceptance or a ``Rejection`` into the ``SubmitReply``
that answers a request. Pure: no I/O."""

from __future__ import annotations

import msgspec

from services.scheduler.cluster import NodeLoad
from services.scheduler.placing import Accepted
from services.scheduler.policy import Placement, Rejection
from services.scheduler.prefetch import Prefetch
from shared.cluster_messages import NodeStatus, PrefetchRequest, PrefillTask, PullPlan
from shared.messages import PREDICTED_TTFT_MARGIN, GenerateRequest, SubmitReply

#: Block hashes one ``PrefetchRequest`` may carry (the message's bound).
MAX_PREFETCH_HASHES = 8192


def node_load(status: NodeStatus, now: float) -> NodeLoad:
    return NodeLoad(
        node_id=status.node_id,
        role=status.role,
        queued_tokens=status.queued_tokens,
        running_seqs=status.running_seqs,
        free_blocks=status.free_blocks,
        total_blocks=status.total_blocks,
        block_size=status.block_size,
        last_seen=now,
        draining=status.draining,
        model_id=status.model_id,
        kv_dtype=status.kv_dtype,
        block_bytes=status.block_bytes,
        max_num_batched_tokens=status.max_num_batched_tokens,
        fetch_bandwidth=dict(status.fetch_bandwidth),
        epoch=status.epoch,
        healthy=status.healthy,
        finishing=tuple((left, kv) for left, kv in status.finishing_seqs),
        host_id=status.host_id,
        tiers={tier: (capacity, used) for tier, (capacity, used) in status.tiers.items()},
        read_bandwidth=dict(status.read_bandwidth),
        local_prefill=status.local_prefill and status.role == "decode",
    )


def prefill_task(
    request: GenerateRequest, placement: Placement, expected_ttft_s: float
) -> PrefillTask:
    """The task for ``placement``'s prefill node. The request's deadline (0: none) is moved
    on by the margin of its calibrated predicted TTFT, as its gateway's timeouts are."""
    if request.deadline_ts > 0:
        deadline = request.deadline_ts + PREDICTED_TTFT_MARGIN * expected_ttft_s
        request = msgspec.structs.replace(request, deadline_ts=deadline)
    return PrefillTask(
        request=request,
        decode_nodes=list(placement.decode_nodes),
        pulls=[
            PullPlan(
                node_id=p.node_id, first_block=p.first_block, num_blocks=p.num_blocks, tier=p.tier
            )
            for p in placement.pulls
        ],
        predicted_ttft_s=placement.predicted_ttft_s,
    )


def prefetch_requests(prefetch: Prefetch) -> list[PrefetchRequest]:
    """The requests that ask for ``prefetch``: its chain segment in order, cut where one
    message's bound would be passed (each piece is a chain segment of its own)."""
    hashes = prefetch.block_hashes
    return [
        PrefetchRequest(
            block_hashes=list(hashes[i : i + MAX_PREFETCH_HASHES]), to_tier=prefetch.to_tier
        )
        for i in range(0, len(hashes), MAX_PREFETCH_HASHES)
    ]


def refusal(rejection: Rejection) -> SubmitReply:
    """The answer that refuses a request: the status and reason the client sees, and when it
    may retry."""
    return SubmitReply(
        accepted=False,
        error=rejection.reason,
        error_code=rejection.status,
        retry_after_s=rejection.retry_after_s,
    )


def acceptance(accepted: Accepted, placement_s: float) -> SubmitReply:
    """The answer that a prefill node took the request (``placement_s``: what placing it took,
    the offers' round trips left out)."""
    placement = accepted.placement
    return SubmitReply(
        accepted=True,
        prefill_node=placement.prefill_node,
        prefill_epoch=accepted.epoch,
        decode_node=placement.decode_node,
        placement_s=placement_s,
        predicted_ttft_s=accepted.expected_ttft_s,
    )
