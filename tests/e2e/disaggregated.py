"""One disaggregated request on the session's stack, made once and looked at by several tests
(its metrics, its trace): a long prompt sent while a stream decodes, so a prefill node
computes it and hands its KV to the decode node. And how the tests read /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.heartbeats import busy, fresh_heartbeats, idle, nats_url, next_beat
from tests.e2e.stack import Stack

Samples = dict[str, list[tuple[dict[str, str], float]]]


@dataclass(frozen=True)
class Disaggregated:
    """The long request's response id, and the decode and prefill nodes' metrics around it."""

    response_id: str
    decode_before: Samples
    decode_after: Samples
    prefill_after: Samples


def endpoints(stack: Stack) -> dict[str, str]:
    """Each service's /metrics URL, as `crescent up` lists them in stack.json."""
    where = json.loads((stack.data_dir / "stack.json").read_text())
    metrics: dict[str, str] = where["metrics"]
    return metrics


def scrape(url: str) -> tuple[set[str], Samples]:
    reply = httpx.get(url, timeout=10)
    reply.raise_for_status()
    names: set[str] = set()
    samples: Samples = defaultdict(list)
    for family in text_string_to_metric_families(reply.text):
        names.add(family.name)
        for s in family.samples:
            samples[s.name].append((s.labels, s.value))
    return names, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for ls, v in samples.get(name, []) if labels.items() <= ls.items())


#: Tries at a hand-off. Placement weighs a local prefill against a hand-off from measured
#: step times, which move with whatever else the host runs; a prompt the decode node took
#: itself is not the one the tests look at, so another is sent.
TRIES = 3


def debug_view(stack: Stack, response_id: str, api_key: str) -> dict[str, Any]:
    """The gateway's debug view of one request: where it was placed, its phases."""
    url = stack.base_url.removesuffix("/v1") + f"/debug/requests/{response_id}"
    reply = httpx.get(url, headers={"authorization": f"Bearer {api_key}"}, timeout=10)
    reply.raise_for_status()
    view: dict[str, Any] = reply.json()
    return view


def run(stack: Stack, model_name: str, api_key: str) -> Disaggregated:
    urls, bus = endpoints(stack), nats_url(stack)
    # The scheduler places by heartbeats: wait until they count the earlier tests' requests done.
    asyncio.run(next_beat(bus, "decode-0", idle, "decode-0 idle"))
    before = scrape(urls["decode-0"])[1]
    kept_local: list[dict[str, Any]] = []
    for attempt in range(TRIES):
        report = " ".join(
            f"Line {i} of a disaggregated report {attempt} at {os.getpid()}." for i in range(90)
        )
        response_id, handed = asyncio.run(
            long_prompt_beside_a_stream(stack, model_name, api_key, report, urls["prefill-0"])
        )
        # The nodes refresh their metrics with each heartbeat's snapshot.
        asyncio.run(fresh_heartbeats(bus, ("prefill-0", "decode-0")))
        prefill_after = scrape(urls["prefill-0"])[1]
        if handed_over(prefill_after) > handed:
            break
        kept_local.append(debug_view(stack, response_id, api_key))
    else:
        raise AssertionError(f"no try was handed off; the placements: {kept_local}")
    after = scrape(urls["decode-0"])[1]
    return Disaggregated(response_id, before, after, prefill_after)


def handed_over(prefill: Samples) -> float:
    """Requests the prefill node computed and handed to a decode node so far."""
    return total(prefill, "crescent_node_requests_finished_total", outcome="handed_over")


async def long_prompt_beside_a_stream(
    stack: Stack, model_name: str, api_key: str, prompt: str, prefill_url: str
) -> tuple[str, float]:
    """Sends ``prompt`` while a stream decodes (``min_tokens`` keeps it going for 1000 tokens,
    seconds even at full speed, and it is hung up once ``prompt`` is answered): a prompt that
    long would pause the stream longer than a hand-off takes. Returns its response id and the
    prefill node's hand-offs just before it was sent (the stream's own is counted by then)."""
    aclient = AsyncOpenAI(base_url=stack.base_url, api_key=api_key, max_retries=0, timeout=300)
    started = asyncio.Event()

    async def stream() -> None:
        chunks = await aclient.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "Count to 200."}],
            max_tokens=1000, temperature=0, stream=True, extra_body={"min_tokens": 1000},
        )  # fmt: skip
        text = ""
        async for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                if len(text) > 8:  # decoding on the decode node by now, not a first token
                    started.set()

    streaming = asyncio.create_task(stream())
    await asyncio.wait_for(started.wait(), 120)
    await next_beat(nats_url(stack), "decode-0", busy, "decode-0's heartbeat counting the stream")
    assert not streaming.done()
    handed = handed_over((await asyncio.to_thread(scrape, prefill_url))[1])
    long = await aclient.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": prompt}], max_tokens=2,
        temperature=0,
    )  # fmt: skip
    streaming.cancel()  # its work is done: hanging up ends it on the nodes too
    with contextlib.suppress(asyncio.CancelledError):
        await streaming
    return long.id, handed
