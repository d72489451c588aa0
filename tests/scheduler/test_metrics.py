"""The scheduler's queue depth and re-placements in its metrics (in-memory bus, fake nodes)."""

from __future__ import annotations

import asyncio

import msgspec

from tests.scheduler.fake_cachemeta import FakeCacheMeta
from tests.scheduler.harness import beat, generate, scheduler


def test_refused_offers_and_resumed_requests_count_as_replacements() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(), ack_timeout_ms=200) as h:
            await h.nodes(beat("A", "prefill"), beat("B", "prefill"), beat("D", "decode"))
            h.refusing.add("A")
            reply = await h.send(generate("r-first"))
            assert reply.accepted and reply.prefill_node == "B"
            refused = {"cause": "offer_refused"}
            assert h.sample("crescent_replacements_total", refused) == 1
            resumed = msgspec.structs.replace(generate("r-moved"), resume=True)
            assert (await h.send(resumed)).accepted
            assert h.sample("crescent_replacements_total", {"cause": "resume"}) == 1
            assert h.sample("crescent_placements_total") == 2

    asyncio.run(scenario())


def test_the_pending_gauge_reads_the_admission_gate() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            assert h.sample("crescent_scheduler_pending_requests") == 0
            assert h.service.handlers is not None
            h.service.handlers.gate.pending = 3
            assert h.sample("crescent_scheduler_pending_requests") == 3

    asyncio.run(scenario())
