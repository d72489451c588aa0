"""The scheduler's translations of wire messages: a tierd's heartbeat into the view, a
placement's tiers into the task, a prefetch into requests the tierd accepts."""

from __future__ import annotations

import msgspec
import pytest

from services.scheduler.policy import Placement, Pull
from services.scheduler.prefetch import Prefetch
from services.scheduler.wire import (
    MAX_PREFETCH_HASHES,
    node_load,
    prefetch_requests,
    prefill_task,
)
from shared.cluster_messages import NodeStatus, PrefetchRequest, PrefillTask, PullPlan
from shared.messages import (
    PREDICTED_TTFT_MARGIN,
    GenerateRequest,
    SamplingSpec,
    decode,
    encode,
)


def test_a_tierds_heartbeat_keeps_its_host_tiers_and_read_rates() -> None:
    status = NodeStatus(
        node_id="tierd-h2",
        role="tierd",
        host_id="h2",
        tiers={"nvme": (1000, 250), "s3": (10_000, 0)},
        read_bandwidth={"nvme": 2e9, "s3": 3e8},
    )
    load = node_load(decode(encode(status), NodeStatus), now=7.0)
    assert (load.node_id, load.role, load.host_id, load.last_seen) == (
        "tierd-h2",
        "tierd",
        "h2",
        7.0,
    )
    assert load.tiers == {"nvme": (1000, 250), "s3": (10_000, 0)}
    assert load.read_bandwidth == {"nvme": 2e9, "s3": 3e8}


def test_each_pull_of_the_task_names_its_tier() -> None:
    request = GenerateRequest(
        request_id="r", tenant="t", prompt_token_ids=[1] * 100, sampling=SamplingSpec(max_tokens=4)
    )
    placement = Placement(
        "p",
        ["d"],
        (Pull("peer", 0, 1), Pull("tierd-h2", 1, 2, "s3")),
        predicted_ttft_s=0.5,
    )
    task = decode(encode(prefill_task(request, placement, 0.5)), PrefillTask)
    assert task.pulls == [
        PullPlan(node_id="peer", first_block=0, num_blocks=1, tier="dram"),
        PullPlan(node_id="tierd-h2", first_block=1, num_blocks=2, tier="s3"),
    ]
    assert (task.decode_nodes, task.predicted_ttft_s) == (["d"], 0.5)


def test_the_tasks_deadline_moves_on_by_the_margin_of_the_predicted_ttft() -> None:
    """A slow model's long prompt keeps its deadline past the prefill it was predicted to
    need (the gateway extends its own timeouts by the same)."""
    placement = Placement("p", ["d"], (), predicted_ttft_s=100.0)
    request = GenerateRequest(
        request_id="r",
        tenant="t",
        prompt_token_ids=[1] * 4096,
        sampling=SamplingSpec(max_tokens=4),
        deadline_ts=1000.0,
    )
    task = decode(encode(prefill_task(request, placement, 150.0)), PrefillTask)
    assert task.request.deadline_ts == 1000.0 + PREDICTED_TTFT_MARGIN * 150.0
    assert request.deadline_ts == 1000.0  # the caller's request is not changed
    unbounded = msgspec.structs.replace(request, deadline_ts=0.0)
    assert prefill_task(unbounded, placement, 150.0).request.deadline_ts == 0.0


def test_a_long_chain_is_asked_for_in_pieces_the_message_allows() -> None:
    hashes = tuple(i.to_bytes(16, "big") for i in range(2 * MAX_PREFETCH_HASHES + 5))
    messages = prefetch_requests(Prefetch("tierd-h2", hashes))
    assert [len(m.block_hashes) for m in messages] == [MAX_PREFETCH_HASHES, MAX_PREFETCH_HASHES, 5]
    received = [decode(encode(m), PrefetchRequest) for m in messages]
    assert tuple(h for m in received for h in m.block_hashes) == hashes
    assert {m.to_tier for m in received} == {"nvme"}
    assert prefetch_requests(Prefetch("tierd-h2", hashes[:3])) == [
        PrefetchRequest(block_hashes=list(hashes[:3]), to_tier="nvme")
    ]


def test_the_piece_size_is_the_messages_own_bound() -> None:
    hashes = [i.to_bytes(16, "big") for i in range(MAX_PREFETCH_HASHES + 1)]
    decode(encode(PrefetchRequest(block_hashes=hashes[:-1])), PrefetchRequest)
    with pytest.raises(msgspec.ValidationError):
        decode(encode(PrefetchRequest(block_hashes=hashes)), PrefetchRequest)
