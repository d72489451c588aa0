"""The scheduler service on the in-memory bus, with a fake cachemeta client: placement,
acknowledged hand-offs to prefill nodes, refusals, and heartbeats it must not trust."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import msgspec
import pytest

from services.scheduler.config import SchedulerSettings
from services.scheduler.lookup import prompt_block_hashes
from shared import subjects
from shared.cluster_messages import PullPlan
from shared.memory_bus import MemoryBus
from shared.messages import AbortRequest, GenerateRequest
from shared.nats_events import DISCONNECT_TYPE
from shared.rpc.client import CacheMetaUnavailable
from shared.rpc.types import PrefixHolder
from shared.secrets import secret_fingerprint
from tests.scheduler.fake_cachemeta import FakeCacheMeta
from tests.scheduler.harness import (
    PROMPT,
    SCOPE,
    SECRET,
    Harness,
    beat,
    generate,
    other_prompt,
    scheduler,
)

# A holds the whole prompt but has a long queue; B is idle: B should pull the blocks from A.
LOAD_FORCED = (
    beat("A", "prefill", queued_tokens=20_000),
    beat("B", "prefill"),
    beat("D", "decode"),
)
# A holds the prompt and is nearly idle, B is idle but cannot pull from A: with the cache in
# view A wins; placed without it, B (the least loaded) does.
CACHE_DECIDES = (
    beat("A", "prefill", queued_tokens=100),
    beat("B", "prefill", fetch_bandwidth={"A": 1e6}),
    beat("D", "decode"),
)


def test_a_prompt_cached_on_a_busy_node_is_pulled_from_it() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62), PrefixHolder("A", "nvme", 62)])
        async with scheduler(index) as h:
            await h.nodes(*LOAD_FORCED)
            reply = await h.send(generate("r-pull"))
            assert reply.accepted and (reply.prefill_node, reply.decode_node) == ("B", "D")
            node, task = await h.next_task()
            assert node == "B" and task.decode_nodes == ["D"]
            assert task.pulls == [PullPlan(node_id="A", first_block=0, num_blocks=62)]
            assert 0 < task.predicted_ttft_s < 1
            hashes = prompt_block_hashes(PROMPT, SCOPE, SECRET, "tenant-a")
            assert index.matches == [hashes] and index.timeouts == [0.1]
            await asyncio.sleep(0.2)  # touches go out in batches every 0.1 s
            assert index.touches == [hashes]
            assert h.sample("crescent_placements_total") == 1
            assert h.sample("crescent_placed_cached_tokens_total") == 62 * 32
            assert h.sample("crescent_planned_pull_blocks_total") == 62

    asyncio.run(scenario())


def test_with_the_cache_in_view_the_holder_wins() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta([PrefixHolder("A", "dram", 62)])) as h:
            await h.nodes(*CACHE_DECIDES)
            await h.send(generate("r-local"))
            node, task = await h.next_task()
            assert (node, task.pulls) == ("A", [])

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        (FakeCacheMeta(error=CacheMetaUnavailable("database down")), "CacheMetaUnavailable"),
        (FakeCacheMeta([PrefixHolder("A", "dram", 62)], delay_s=10), "timeout"),
        (None, "unconfigured"),
    ],
)
def test_without_cachemeta_requests_are_placed_cache_obliviously(
    index: FakeCacheMeta | None, reason: str
) -> None:
    async def scenario() -> None:
        async with scheduler(index) as h:
            await h.nodes(*CACHE_DECIDES)
            # The first lookup fails, the next ones back off; each request goes to the least
            # loaded node, counting what was placed before it (with the cache, all go to A).
            for i, want in enumerate("BAB"):
                await h.send(generate(f"r-oblivious-{reason}-{i}", other_prompt(i)))
                node, task = await h.next_task()
                assert (node, task.pulls) == (want, [])
            assert h.fallbacks(reason) >= 1
            # A prompt asked again goes where it was just placed, which will hold its blocks
            # before any catalogue lists them.
            await h.send(generate(f"r-again-{reason}", other_prompt(2)))
            assert (await h.next_task())[0] == "B"

    asyncio.run(scenario())


def test_a_prompt_asked_again_before_the_catalogue_lists_it_goes_where_it_was_placed() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:  # the catalogue lists nothing yet
            await h.nodes(beat("A", "prefill"), beat("B", "prefill"), beat("D", "decode"))
            await h.send(generate("r-first"))
            first, _ = await h.next_task()
            await h.send(generate("r-again"))
            node, task = await h.next_task()
            # Blind, it would be computed again on the other node (the first one counts the
            # work placed on it); now it goes to the first one, or pulls every block from it.
            pulled = [(p.node_id, p.first_block, p.num_blocks) for p in task.pulls]
            assert (node, pulled) == (first, []) or pulled == [(first, 0, 62)], (node, pulled)

    asyncio.run(scenario())


def test_concurrent_requests_each_see_the_ones_placed_before() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(delay_s=0.05)) as h:
            await h.nodes(beat("A", "prefill"), beat("B", "prefill"), beat("D", "decode"))
            await asyncio.gather(*(h.send(generate(f"r-concurrent-{i}")) for i in range(2)))
            placed = {(await h.next_task())[0] for _ in range(2)}
            assert placed == {"A", "B"}

    asyncio.run(scenario())


def test_the_round_robin_baseline_ignores_caches() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62)])
        async with scheduler(index, placement="round_robin") as h:
            await h.nodes(*CACHE_DECIDES)
            nodes = []
            for i in range(4):
                await h.send(generate(f"r-rr-{i}"))
                node, task = await h.next_task()
                assert task.pulls == []
                nodes.append(node)
            assert sorted(nodes) == ["A", "A", "B", "B"] and nodes[0] != nodes[1]
            assert index.matches == [] and h.fallbacks("unconfigured") == 0

    asyncio.run(scenario())


def test_a_request_over_the_slo_is_rejected_with_429_and_retry_after() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(), ttft_slo_ms=50) as h:
            await h.nodes(beat("A", "prefill", queued_tokens=8192), beat("D", "decode"))
            reply = await h.send(generate("r-slo"))
            assert not reply.accepted and reply.error_code == 429 and "objective" in reply.error
            assert reply.retry_after_s is not None and reply.retry_after_s >= 1
            assert h.tasks.empty()
            assert h.sample("crescent_rejections_total", {"cause": "ttft_slo"}) == 1

    asyncio.run(scenario())


def test_a_request_whose_own_deadline_is_out_of_reach_is_refused_at_placement() -> None:
    """No objective configured on the scheduler: the request's own (``ttft_slo_ms``, as the
    gateway turns it into a deadline) decides, and a looser one lets the same prompt in."""

    def due_in(request_id: str, seconds: float) -> GenerateRequest:
        request = generate(request_id)
        request.sampling.ttft_deadline = time.time() + seconds
        return request

    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            await h.nodes(beat("A", "prefill", queued_tokens=8192), beat("D", "decode"))
            tight = await h.send(due_in("r-tight", 0.05))
            assert not tight.accepted and tight.error_code == 429 and "objective" in tight.error
            assert h.tasks.empty()
            assert h.sample("crescent_rejections_total", {"cause": "ttft_slo"}) == 1
            assert (await h.send(due_in("r-loose", 3600))).accepted
            assert (await h.send(generate("r-none"))).accepted

    asyncio.run(scenario())


def test_a_requests_own_time_between_tokens_objective_is_held_at_placement() -> None:
    """No objective configured on the scheduler: a request's own ``tbt_slo_s`` (from its
    ``tbt_slo_ms`` or its tenant's) is checked against every decode node's forecast."""

    def asking(request_id: str, tbt_slo_s: float) -> GenerateRequest:
        request = generate(request_id)
        request.sampling.tbt_slo_s = tbt_slo_s
        return request

    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            await h.nodes(beat("A", "prefill"), beat("D", "decode", running_seqs=32))
            tight = await h.send(asking("r-tight", 1e-4))  # no step is that fast
            assert not tight.accepted and tight.error_code == 429
            assert "time between tokens" in tight.error and tight.retry_after_s is not None
            assert h.tasks.empty()
            assert h.sample("crescent_rejections_total", {"cause": "tbt_slo"}) == 1
            assert (await h.send(asking("r-loose", 60.0))).accepted
            assert (await h.send(generate("r-none"))).accepted

    asyncio.run(scenario())


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_TTFT_SLO_MS", "250")
    monkeypatch.setenv("CRESCENT_CACHEMETA_URL", "127.0.0.1:50051")
    monkeypatch.setenv("CRESCENT_MAX_NUM_BATCHED_TOKENS", "512")
    monkeypatch.delenv("CRESCENT_CACHE_SECRET", raising=False)
    settings = SchedulerSettings()
    assert settings.ttft_slo_s == 0.25 and settings.cachemeta_url == "127.0.0.1:50051"
    assert settings.cost_params().max_num_batched_tokens == 512
    assert settings.cache_secret == "crescent-dev-cache-secret"  # the nodes' default


def test_a_refusing_or_silent_prefill_node_is_passed_over() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(), ack_timeout_ms=200) as h:
            await h.nodes(beat("A", "prefill"), beat("B", "prefill"), beat("C", "prefill"),
                          beat("D", "decode"))  # fmt: skip
            h.refusing.add("A")
            h.silent.add("B")
            reply = await h.send(generate("r-pass"))
            assert reply.accepted and reply.prefill_node == "C" and reply.prefill_epoch == "e"
            # The 200 ms B kept it waiting were an offer's, not placement.
            assert 0 < reply.placement_s < 0.2
            tried = [(await h.next_task())[0] for _ in range(2)]
            assert sorted(tried) == ["A", "C"]  # B never answered
            aborts = [(a.request_id, a.only_node) for s, a in _published(h) if s == subjects.ABORTS]
            assert aborts == [("r-pass", "B")]  # in case B took it and lost only its answer
            handlers = h.service.handlers
            assert handlers is not None
            # Only C counts the request; what was placed on A and B was withdrawn.
            assert handlers.view.nodes["A"].placed_tokens == 0
            assert handlers.view.nodes["C"].placed_tokens > 0

    asyncio.run(scenario())


def _published(h: Harness) -> list[tuple[str, AbortRequest]]:
    bus = h.service.bus
    assert isinstance(bus, MemoryBus)
    return [(s, m) for s, m in bus.published if isinstance(m, AbortRequest)]


def test_no_prefill_node_is_a_503_and_a_full_queue_a_429() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(), scheduler_max_pending=1) as h:
            await h.nodes(beat("D", "decode"))
            reply = await h.send(generate("r-none"))
            assert not reply.accepted and reply.error_code == 503
            handlers = h.service.handlers
            assert handlers is not None
            handlers.gate.pending = 1  # one placement in progress: the queue is full
            reply = await h.send(generate("r-full"))
            assert reply.error_code == 429 and reply.retry_after_s is not None
            resumed = msgspec.structs.replace(generate("r-resumed"), resume=True)
            assert (await h.send(resumed)).error_code == 503  # let in, but nobody can take it

    asyncio.run(scenario())


def test_forged_and_absurd_heartbeats_are_dropped() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            await h.nodes(beat("A", "prefill"), beat("D", "decode"))
            handlers = h.service.handlers
            assert handlers is not None
            # Another node's subject: dropped.
            await h.beat(beat("A", "prefill", draining=True), subjects.heartbeats("prefill", "X"))
            assert not handlers.view.nodes["A"].draining
            # A block size of 0 would break every placement: the message does not decode.
            raw = msgspec.json.encode(beat("A", "prefill")).replace(
                b'"block_size":32', b'"block_size":0'
            )
            await h.bus.publish_raw(subjects.heartbeats("prefill", "A"), raw)
            await h.bus.settle()
            assert handlers.view.nodes["A"].block_size == 32
            reply = await h.send(generate("r-after-forgery"))
            assert reply.accepted and reply.prefill_node == "A"

    asyncio.run(scenario())


def test_a_disconnected_node_gets_no_work_until_it_beats_again() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            await h.nodes(beat("A", "prefill"), beat("B", "prefill", queued_tokens=5000),
                          beat("D", "decode"))  # fmt: skip
            # The server names the authenticated user; a chosen name alone is no word.
            event = {"type": DISCONNECT_TYPE, "client": {"name": "crescent-B", "user": "A"}}
            await h.bus.publish_raw(subjects.DISCONNECTS, json.dumps(event).encode())
            await h.bus.settle()
            reply = await h.send(generate("r-after-disconnect"))
            assert reply.prefill_node == "B"
            await h.beat(beat("A", "prefill"))
            reply = await h.send(generate("r-after-return"))
            assert reply.prefill_node == "A"

    asyncio.run(scenario())


def test_a_resumed_request_is_never_refused_by_the_slo() -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta(), ttft_slo_ms=50) as h:
            await h.nodes(beat("A", "prefill", queued_tokens=8192), beat("D", "decode"))
            assert (await h.send(generate("r-new"))).error_code == 429
            resumed = msgspec.structs.replace(generate("r-old-r1"), resume=True)
            assert (await h.send(resumed)).accepted

    asyncio.run(scenario())


def test_a_node_with_another_cache_secret_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with scheduler(FakeCacheMeta()) as h:
            mine = secret_fingerprint(SECRET)
            await h.nodes(beat("A", "prefill", secret_fingerprint=mine), beat("D", "decode"))
            other = beat("B", "prefill", secret_fingerprint=secret_fingerprint("another-secret"))
            await h.nodes(other)
            await h.beat(other)

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if "cache secret" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("node B uses another cache secret")


def test_an_overload_is_refused_without_asking_the_catalogue() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62)])
        async with scheduler(index, ttft_slo_ms=50) as h:
            await h.nodes(beat("A", "prefill", queued_tokens=8192), beat("D", "decode"))
            reply = await h.send(generate("r-hopeless"))
            assert reply.error_code == 429 and index.matches == []

    asyncio.run(scenario())


def test_the_heartbeat_reports_the_ttft_floor_and_overload_lookups_are_bounded() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62)], delay_s=0.5)
        async with scheduler(index, ttft_slo_ms=300) as h:
            # A short queue: an idle node would let in any request (its floor is 0).
            await h.nodes(beat("A", "prefill", queued_tokens=32), beat("D", "decode"))
            handlers = h.service.handlers
            assert handlers is not None
            floor = handlers.ttft_floor()
            assert 0 < floor < 0.3  # one token behind the short queue
            status = await h.service._status()
            assert status.ttft_slo_s == 0.3 and status.ttft_floor_s == floor
            # 2,000 fresh tokens miss 300 ms, all but the last cached do not: only the cache
            # could let this prompt in, and a slow catalogue is not waited for.
            started = time.monotonic()
            reply = await h.send(generate("r-bounded"))
            assert reply.error_code == 429 and time.monotonic() - started < 0.25
            assert h.fallbacks("budget") == 1

    asyncio.run(scenario())
