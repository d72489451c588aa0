"""The scheduler and the cache controls: a request that reads no cache is priced as a full
recompute, and a keep is recorded in the catalogue's ledger (within the tenant's quota) before
the request is placed, refused over quota, and undone when the request finds no node."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from services.scheduler.config import SchedulerSettings
from services.scheduler.lookup import prompt_full_block_hashes
from shared.kv.hashing import quota_key, scope_salt
from shared.messages import QUOTA, GenerateRequest, SamplingSpec
from shared.rpc.client import CacheMetaUnavailable
from shared.rpc.types import KeepGrant, PrefixHolder
from tests.scheduler.fake_cachemeta import FakeCacheMeta
from tests.scheduler.harness import PROMPT, SCOPE, SECRET, beat, generate, scheduler

# A holds the whole prompt and is nearly idle; B is idle but cannot pull from A: with the
# cache in view A wins, priced without it B (the least loaded) does.
CACHED_ON_A = (
    beat("A", "prefill", queued_tokens=100),
    beat("B", "prefill", fetch_bandwidth={"A": 1e6}),
    beat("D", "decode"),
)
FULL_BLOCKS = prompt_full_block_hashes(PROMPT, SCOPE, SECRET, "tenant-a")  # 62 of 32 tokens
TENANT_KEY = quota_key(scope_salt(SECRET.encode(), "tenant-a"))


def asking(request_id: str, **sampling: object) -> GenerateRequest:
    return msgspec.structs.replace(
        generate(request_id), sampling=SamplingSpec(max_tokens=8, **sampling)
    )


def test_a_request_that_reads_no_cache_is_priced_as_a_full_recompute() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62)])
        async with scheduler(index) as h:
            await h.nodes(*CACHED_ON_A)
            await h.send(generate("r-read"))
            node, task = await h.next_task()
            assert (node, task.pulls) == ("A", [])
            await h.send(asking("r-unread", cache_read=False))
            node, task = await h.next_task()
            # The catalogue is not asked, nothing is pulled, and the idle node takes it.
            assert len(index.matches) == 1
            assert (node, task.pulls) == ("B", [])
            assert h.sample("crescent_placed_cached_tokens_total") == 62 * 32  # the first only

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("sampling", "ttl_s", "pin"),
    [({"keep": "ttl", "keep_ttl_s": 600.0}, 600.0, False), ({"keep": "pin"}, 0.0, True)],
)
def test_a_keep_is_recorded_with_the_tenants_quota_before_the_request_is_placed(
    sampling: dict[str, object], ttl_s: float, pin: bool
) -> None:
    async def scenario() -> None:
        index = FakeCacheMeta()
        async with scheduler(index, keep_quota_blocks=100, keep_quotas="tenant-b=5") as h:
            await h.nodes(*CACHED_ON_A)
            reply = await h.send(asking("r-keep", **sampling))
            assert reply.accepted
            assert index.keeps == [(TENANT_KEY, FULL_BLOCKS, ttl_s, pin, 100)]
            _, task = await h.next_task()
            assert task.request.sampling.keep == sampling["keep"]

    asyncio.run(scenario())


def test_a_keep_over_the_quota_is_refused_with_429_and_nothing_is_placed() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta()
        index.keep_grant = KeepGrant(False, 250)
        async with scheduler(index, keep_quota_blocks=256) as h:
            await h.nodes(*CACHED_ON_A)
            reply = await h.send(asking("r-over", keep="pin"))
            assert (reply.accepted, reply.error_code, reply.error_kind) == (False, 429, QUOTA)
            assert "quota of 256 kept blocks" in reply.error and "62 blocks" in reply.error
            assert h.tasks.empty() and index.matches == []

    asyncio.run(scenario())


def test_a_keep_whose_request_finds_no_node_is_undone() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta()
        index.keep_grant = KeepGrant(True, 62, FULL_BLOCKS[10:])  # 10 were kept already
        async with scheduler(index) as h:
            await h.nodes(beat("A", "prefill"), beat("D", "decode"))
            h.refusing.add("A")
            reply = await h.send(asking("r-undone", keep="ttl", keep_ttl_s=60.0))
            assert not reply.accepted
            assert index.keeps[-1] == (TENANT_KEY, FULL_BLOCKS[10:], 0.0, False, 0)

    asyncio.run(scenario())


def test_a_keep_the_catalogue_cannot_record_is_a_503() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta()
        index.keep_error = CacheMetaUnavailable("database down")
        async with scheduler(index) as h:
            await h.nodes(*CACHED_ON_A)
            reply = await h.send(asking("r-down", keep="pin"))
            assert (reply.accepted, reply.error_code) == (False, 503)
            assert h.tasks.empty()

    asyncio.run(scenario())


def test_a_drop_and_a_resumed_request_record_no_new_keep() -> None:
    async def scenario() -> None:
        index = FakeCacheMeta()
        async with scheduler(index) as h:
            await h.nodes(*CACHED_ON_A)
            assert (await h.send(asking("r-drop", keep="drop"))).accepted
            assert index.keeps == [(TENANT_KEY, FULL_BLOCKS, 0.0, False, 256)]
            await h.next_task()
            resumed = msgspec.structs.replace(asking("r-again", keep="pin"), resume=True)
            assert (await h.send(resumed)).accepted
            _, task = await h.next_task()
            assert task.request.sampling.keep == "" and len(index.keeps) == 1

    asyncio.run(scenario())


def test_keep_quotas_are_read_and_checked() -> None:
    settings = SchedulerSettings(cache_secret=SECRET, keep_quotas="bob=4, carol=0")
    quotas = settings.keep_quota()
    assert (quotas.blocks_for("bob"), quotas.blocks_for("carol")) == (4, 0)
    assert quotas.blocks_for("alice") == 256
    with pytest.raises(ValueError, match="CRESCENT_KEEP_QUOTAS"):
        SchedulerSettings(cache_secret=SECRET, keep_quotas="bob=lots")
