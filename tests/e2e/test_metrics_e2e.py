"""Every service's /metrics during an e2e run (the session's `crescent up`), kvindex's too:
each serves the families operations rely on, and they move as requests go through: cached
tokens rise on a repeated prompt, transfer bytes on a disaggregated request."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from openai import OpenAI

from tests.e2e.disaggregated import Disaggregated, endpoints, scrape, total
from tests.e2e.heartbeats import fresh_heartbeats, model_nodes, nats_url
from tests.e2e.stack import Stack

pytestmark = pytest.mark.slow

#: The families each kind of service must serve (counters without their ``_total``).
FAMILIES = {
    "gateway": {
        "crescent_gateway_time_to_first_token_seconds",
        "crescent_gateway_time_per_output_token_seconds",
        "crescent_gateway_e2e_request_latency_seconds",
        "crescent_gateway_requests_in_flight",
        "crescent_gateway_cached_prompt_tokens_by_tier",
        "crescent_gateway_request_phase_seconds",
        "crescent_gateway_request_migrations",
    },
    "scheduler": {
        "crescent_placements",
        "crescent_rejections",
        "crescent_replacements",
        "crescent_scheduler_pending_requests",
        "crescent_placed_cached_tokens",
        "crescent_live_nodes",
    },
    "cachemeta": {
        "crescent_cachemeta_call_duration_seconds",
        "crescent_cachemeta_blocks",
        "crescent_cachemeta_replicas",
        "crescent_cachemeta_database_errors",
        "crescent_cachemeta_database_up",
    },
    "node": {
        "crescent_running_sequences",
        "crescent_waiting_sequences",
        "crescent_queued_prompt_tokens",
        "crescent_kv_free_blocks",
        "crescent_kv_total_blocks",
        "crescent_kv_pool_evicted_blocks",
        "crescent_cached_prompt_tokens",
        "crescent_prompt_tokens_computed",
        "crescent_kv_transfer_bytes",
        "crescent_kv_transfer_duration_seconds",
        "crescent_kv_checksum_failures",
        "crescent_node_requests_finished",
    },
    "tierd": {
        "crescent_tierd_used_bytes",
        "crescent_tierd_capacity_bytes",
        "crescent_tierd_evicted_blocks",
        "crescent_tierd_corrupt_blocks",
    },
    "kvindex": {
        "crescent_kvindex_frames",
        "crescent_kvindex_resyncs_asked",
        "crescent_kvindex_publishers",
        "crescent_kvindex_blocks",
    },
}


def kind_of(name: str) -> str:
    return "node" if name.split("-")[0] in ("prefill", "decode") else name.split("-")[0]


def every_endpoint(stack: Stack) -> dict[str, str]:
    """The services' /metrics of stack.json's map, and kvindex's, which it lists apart."""
    where = json.loads((stack.data_dir / "stack.json").read_text())
    return endpoints(stack) | {"kvindex": where["kvindex_metrics"]}


def test_every_service_serves_its_metrics(stack: Stack) -> None:
    found = every_endpoint(stack)
    assert {kind_of(n) for n in found} == set(FAMILIES), found
    for name, url in found.items():
        names, _ = scrape(url)
        missing = FAMILIES[kind_of(name)] - names
        assert not missing, f"{name} ({url}) lacks {sorted(missing)}"


def test_a_repeated_prompt_raises_cached_tokens_everywhere(client: OpenAI, stack: Stack) -> None:
    urls = endpoints(stack)
    prompt = " ".join(f"Fact {i} about metrics run {os.getpid()}." for i in range(30))
    messages = [{"role": "user", "content": prompt}]

    def ask() -> int:
        answer = client.chat.completions.create(
            model=client.models.list().data[0].id, messages=messages,  # type: ignore[arg-type]
            max_tokens=2, temperature=0,
        )  # fmt: skip
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        return answer.usage.prompt_tokens_details.cached_tokens or 0

    def refreshed() -> None:
        """The nodes' next heartbeats refresh their metrics with what was done till now."""
        asyncio.run(fresh_heartbeats(nats_url(stack), model_nodes(stack)))

    ask()
    refreshed()
    before = {name: scrape(url)[1] for name, url in urls.items()}
    cached = ask()
    assert cached >= 32
    refreshed()
    after = {name: scrape(url)[1] for name, url in urls.items()}

    def rise(service: str, metric: str, **labels: str) -> float:
        return total(after[service], metric, **labels) - total(before[service], metric, **labels)

    assert rise("gateway", "crescent_gateway_cached_prompt_tokens_total") == cached
    by_tier = "crescent_gateway_cached_prompt_tokens_by_tier_total"
    assert rise("gateway", by_tier) == cached
    assert rise("gateway", "crescent_gateway_e2e_request_latency_seconds_count") == 1
    assert rise("gateway", "crescent_gateway_time_to_first_token_seconds_count") == 1
    assert rise("scheduler-0", "crescent_placed_cached_tokens_total") >= 32
    nodes = [n for n in urls if kind_of(n) == "node"]
    node_cached = sum(rise(n, "crescent_cached_prompt_tokens_total") for n in nodes)
    assert node_cached == cached
    assert rise("cachemeta", "crescent_cachemeta_call_duration_seconds_count") >= 0


def test_a_disaggregated_request_moves_transfer_bytes(disaggregated: Disaggregated) -> None:
    before, after = disaggregated.decode_before, disaggregated.decode_after
    metric = "crescent_kv_transfer_bytes_total"
    moved = total(after, metric, source="handoff") - total(before, metric, source="handoff")
    assert moved > 0
    pulls = "crescent_kv_transfer_duration_seconds_count"
    assert total(after, pulls, source="handoff") > total(before, pulls, source="handoff")
    sent = disaggregated.prefill_after
    assert total(sent, "crescent_kv_bytes_sent_total") >= moved
    finished = "crescent_node_requests_finished_total"
    assert total(sent, finished, outcome="handed_over") >= 1
