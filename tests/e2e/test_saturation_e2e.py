"""The saturation gauges on the session's `crescent up`: a burst of concurrent requests raises
the prefill node's (its queue) and the decode node's (its streams' time between tokens) on
the scheduler's /metrics, and both fall back once the cluster is idle again; the status page
carries the same figures."""

from __future__ import annotations

import asyncio
import os
import random

import httpx
import pytest
from openai import AsyncOpenAI

from tests.e2e.conftest import ALICE_KEY
from tests.e2e.disaggregated import endpoints, scrape
from tests.e2e.heartbeats import idle, nats_url, next_beat
from tests.e2e.stack import Stack
from tests.support.wait import ConditionTimeout, wait_for_condition, wait_until

pytestmark = pytest.mark.slow

#: Concurrent requests of the burst, each a prompt of its own of 120 words (no cache hit
#: shortens it): however many the decode node prefills itself, the prefill node gets a queue
#: several prompts deep.
BURST = 5
PROMPT_WORDS = 120
#: The prefill gauge must reach this multiple of its idle value under the burst: the queue
#: makes it several times larger; the margin leaves room for what moves besides the queue
#: (the typical prompt, the calibration).
RISE = 1.5
#: Bounds a hang only: the decode gauge counts steps of the last 10 s, and the burst takes
#: seconds of compute, minutes on a host whose cores other work holds.
TIMEOUT_S = 600.0
WORDS = ("amber", "basin", "cedar", "delta", "ember", "fjord", "grove", "heron", "inlet",
         "juniper", "kelp", "lagoon")  # fmt: skip


def gauges(url: str) -> dict[str, float]:
    """The scheduler's ``crescent_saturation`` of prefill-0 and decode-0 (-1: not exported)."""
    samples = scrape(url)[1].get("crescent_saturation", [])
    found = {(labels["role"], labels["node"]): value for labels, value in samples}
    return {
        "prefill": found.get(("prefill", "prefill-0"), -1.0),
        "decode": found.get(("decode", "decode-0"), -1.0),
    }


def burst_prompt(i: int) -> str:
    rng = random.Random(f"saturation-{os.getpid()}-{i}")
    return f"Burst {i} of run {os.getpid()}: " + " ".join(
        rng.choice(WORDS) for _ in range(PROMPT_WORDS)
    )


async def burst(stack: Stack, model_name: str) -> None:
    client = AsyncOpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=300)
    asks = [
        client.completions.create(
            model=model_name, prompt=burst_prompt(i), max_tokens=8, temperature=0
        )
        for i in range(BURST)
    ]
    answers = await asyncio.gather(*asks)
    assert all(a.usage is not None and a.usage.completion_tokens > 0 for a in answers)


async def peaks_during_burst(stack: Stack, model_name: str, url: str) -> dict[str, float]:
    """Sends the burst and reads the gauges until it is answered; the highest readings."""
    peaks = {"prefill": 0.0, "decode": 0.0}
    answered = asyncio.Event()

    async def send() -> None:
        try:
            await burst(stack, model_name)
        finally:
            answered.set()

    async def read() -> bool:
        for role, value in (await asyncio.to_thread(gauges, url)).items():
            peaks[role] = max(peaks[role], value)
        return answered.is_set()

    await asyncio.gather(send(), wait_for_condition(read, "the burst's answers", TIMEOUT_S))
    return peaks


def test_the_gauges_rise_under_a_burst_and_fall_back_once_idle(
    stack: Stack, model_name: str
) -> None:
    url, bus = endpoints(stack)["scheduler-0"], nats_url(stack)
    # Start idle: the nodes' beats say so, and no stream decoded within the gauge's window.
    asyncio.run(next_beat(bus, "prefill-0", idle, "prefill-0 idle"))
    asyncio.run(next_beat(bus, "decode-0", idle, "decode-0 idle"))
    wait_until(lambda: gauges(url)["decode"] == 0.0, "decode-0's gauge at 0", TIMEOUT_S)
    before = gauges(url)
    assert before["prefill"] > 0  # an idle prefill node is at its floor: a prompt's compute

    peaks = asyncio.run(peaks_during_burst(stack, model_name, url))
    assert peaks["prefill"] >= RISE * before["prefill"], (before, peaks)
    assert peaks["decode"] > 0, (before, peaks)

    # Idle again: no stream decoded within the window, and no queue on the prefill node, whose
    # gauge is back at its floor. The floor is no fixed number: the steps the burst measured
    # refit the node's step times (a busy host makes them slower), so the test asks for less
    # than the peak, which had the queue on top.
    last: dict[str, float] = {}

    def fallen() -> bool:
        last.update(gauges(url))
        return last["decode"] == 0.0 and 0 < last["prefill"] < peaks["prefill"]

    try:
        wait_until(fallen, f"the gauges back down from {peaks}", TIMEOUT_S)
    except ConditionTimeout as exc:
        raise AssertionError(f"{exc}; they read {last} last") from exc
    samples = scrape(url)[1]
    roles = {labels["role"]: value for labels, value in samples["crescent_role_saturation"]}
    assert roles["decode"] == 0.0 and roles["prefill"] > 0

    # The status page shows what the scheduler's heartbeat carries: the same figures.
    status_url = stack.base_url.removesuffix("/v1") + "/status"

    def shown() -> bool:
        doc = httpx.get(status_url, timeout=10).json()
        ratios = {n["id"]: n["saturation"] for n in doc["nodes"]}
        return (
            ratios.get("decode-0") == 0.0
            and (ratios.get("prefill-0") or 0) > 0
            and (doc["saturation"]["prefill"] or 0) > 0
        )

    wait_until(shown, "the saturation on the status page", TIMEOUT_S)
