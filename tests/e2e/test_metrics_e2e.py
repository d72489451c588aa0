"""Every service's /metrics during an e2e run (the session's `crescent up`): each serves the
families operations rely on, and they move as requests go through: cached tokens rise on a
repeated prompt, transfer bytes on a disaggregated request."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import ALICE_KEY
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
}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def endpoints(stack: Stack) -> dict[str, str]:
    where = json.loads((stack.data_dir / "stack.json").read_text())
    metrics: dict[str, str] = where["metrics"]
    return metrics


def scrape(url: str) -> tuple[set[str], Samples]:
    reply = httpx.get(url, timeout=10)
    reply.raise_for_status()
    names, samples = set(), defaultdict(list)
    for family in text_string_to_metric_families(reply.text):
        names.add(family.name)
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return names, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for ls, v in samples.get(name, []) if labels.items() <= ls.items())


def kind_of(name: str) -> str:
    return "node" if name.split("-")[0] in ("prefill", "decode") else name.split("-")[0]


def test_every_service_serves_its_metrics(stack: Stack) -> None:
    found = endpoints(stack)
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

    ask()
    time.sleep(1.0)  # a heartbeat refreshes the nodes' gauges
    before = {name: scrape(url)[1] for name, url in urls.items()}
    cached = ask()
    assert cached >= 32
    time.sleep(1.0)
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


def test_a_disaggregated_request_moves_transfer_bytes(stack: Stack, model_name: str) -> None:
    urls = endpoints(stack)
    time.sleep(1.5)  # the decode node's heartbeats count the earlier tests' requests done
    before = scrape(urls["decode-0"])[1]
    report = " ".join(f"Line {i} of a metrics report at {os.getpid()}." for i in range(90))
    asyncio.run(long_prompt_beside_a_stream(stack, model_name, report))
    time.sleep(1.0)
    after = scrape(urls["decode-0"])[1]
    metric = "crescent_kv_transfer_bytes_total"
    moved = total(after, metric, source="handoff") - total(before, metric, source="handoff")
    assert moved > 0
    pulls = "crescent_kv_transfer_duration_seconds_count"
    assert total(after, pulls, source="handoff") > total(before, pulls, source="handoff")
    sent = scrape(urls["prefill-0"])[1]
    assert total(sent, "crescent_kv_bytes_sent_total") >= moved
    finished = "crescent_node_requests_finished_total"
    assert total(sent, finished, outcome="handed_over") >= 1


async def long_prompt_beside_a_stream(stack: Stack, model_name: str, prompt: str) -> str:
    """Sends ``prompt`` while a stream decodes (``min_tokens`` keeps it going): a prompt that
    long would pause the stream longer than a hand-off takes, so a prefill node computes it
    and hands its KV to the decode node. Returns the long request's response id."""
    aclient = AsyncOpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=300)
    started = asyncio.Event()

    async def stream() -> None:
        chunks = await aclient.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Count to 200."}],
            max_tokens=200, temperature=0, stream=True, extra_body={"min_tokens": 200},
        )  # fmt: skip
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                started.set()

    streaming = asyncio.create_task(stream())
    await asyncio.wait_for(started.wait(), 120)
    await asyncio.sleep(1.5)  # the decode node's next heartbeats count the stream
    assert not streaming.done()
    long = await aclient.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": prompt}], max_tokens=2,
        temperature=0,
    )  # fmt: skip
    await streaming
    return long.id
