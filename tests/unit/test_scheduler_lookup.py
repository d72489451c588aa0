"""The scheduler's view of a prompt's blocks: its hashes, and a lookup that never fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from services.scheduler.cluster import NodeLoad
from services.scheduler.lookup import HashScope, PrefixLookup, hash_scope, prompt_block_hashes
from shared.kv.hashing import hash_full_blocks, root_hash
from shared.messages import GenerateRequest, SamplingSpec
from shared.node.chunks import request_salt
from shared.rpc.client import CacheMetaError, CacheMetaUnavailable
from shared.rpc.types import PrefixHolder
from tests.scheduler.fake_cachemeta import FakeCacheMeta

SCOPE = HashScope("smollm2-135m", 32, "float32")
SECRET = "s3cret"
HOLDERS = [PrefixHolder("p1", "dram", 2)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def request(prompt: list[int], tenant: str = "t", cache_salt: str = "") -> GenerateRequest:
    return GenerateRequest(
        request_id="r",
        tenant=tenant,
        prompt_token_ids=prompt,
        sampling=SamplingSpec(max_tokens=4),
        cache_salt=cache_salt,
    )


def test_block_hashes_are_the_prefill_nodes_own() -> None:
    req = request(list(range(100)), tenant="acme", cache_salt="x")
    # What a prefill node computes: its root from the request's salt, its full blocks.
    root = root_hash(SCOPE.model_id, 32, "float32", request_salt(SECRET, req))
    node_hashes = hash_full_blocks(req.prompt_token_ids, 32, root)
    ours = prompt_block_hashes(req.prompt_token_ids, SCOPE, SECRET, "acme", "x")
    assert ours == node_hashes[:3]


@pytest.mark.parametrize(("length", "blocks"), [(1, 0), (32, 0), (33, 1), (64, 1), (65, 2)])
def test_the_last_token_is_never_in_a_hashed_block(length: int, blocks: int) -> None:
    assert len(prompt_block_hashes(list(range(length)), SCOPE, SECRET, "t")) == blocks


def test_tenants_and_cache_salts_scope_the_hashes() -> None:
    prompt = list(range(64))
    base = prompt_block_hashes(prompt, SCOPE, SECRET, "a")
    assert base != prompt_block_hashes(prompt, SCOPE, SECRET, "b")
    assert base != prompt_block_hashes(prompt, SCOPE, SECRET, "a", "mine")
    assert base != prompt_block_hashes(prompt, SCOPE, "other-secret", "a")


def test_the_hash_scope_comes_from_the_prefill_nodes() -> None:
    def n(node_id: str, **kw: object) -> NodeLoad:
        return NodeLoad(node_id, "prefill", 0, 0, 10, 10, 16, 0.0, **kw)  # type: ignore[arg-type]

    assert hash_scope([n("b", model_id="m", kv_dtype="f16"), n("a")]) == HashScope("m", 16, "f16")
    assert hash_scope([n("a"), n("b", model_id="m")]) is None
    assert hash_scope([]) is None


def lookup(
    index: FakeCacheMeta | None, clock: Clock, reasons: list[str], **kw: float
) -> PrefixLookup:
    return PrefixLookup(
        index,
        timeout_s=kw.get("timeout_s", 0.1),
        retry_s=kw.get("retry_s", 1.0),
        on_fallback=reasons.append,
        clock=clock,
    )


def test_holders_come_from_cachemeta_within_the_budget() -> None:
    index, reasons = FakeCacheMeta(HOLDERS), list[str]()
    found = asyncio.run(lookup(index, Clock(), reasons).match([b"h" * 16]))
    assert found == HOLDERS and reasons == []
    assert index.matches == [[b"h" * 16]] and index.timeouts == [0.1]


def test_holders_are_asked_for_in_every_tier_placement_pulls_from() -> None:
    asked: list[tuple[str, ...]] = []

    class Recording(FakeCacheMeta):
        async def match_prefix(
            self,
            block_hashes: Sequence[bytes],
            *,
            tiers: Sequence[str] = (),
            timeout_s: float | None = None,
        ) -> list[PrefixHolder]:
            asked.append(tuple(tiers))
            return await super().match_prefix(block_hashes, tiers=tiers, timeout_s=timeout_s)

    held = [PrefixHolder("p1", "dram", 2), PrefixHolder("t", "nvme", 3), PrefixHolder("t", "s3", 4)]
    found = asyncio.run(lookup(Recording(held), Clock(), []).match([b"h" * 16]))
    assert asked == [("dram", "nvme", "s3")] and found == held


def test_without_cachemeta_or_blocks_nobody_holds_anything() -> None:
    reasons: list[str] = []
    assert asyncio.run(lookup(None, Clock(), reasons).match([b"h" * 16])) == []
    assert reasons == ["unconfigured"]
    index = FakeCacheMeta(HOLDERS)
    assert asyncio.run(lookup(index, Clock(), reasons).match([])) == []
    assert index.matches == [] and reasons == ["unconfigured"]


def test_an_outage_backs_off_then_probes_again(caplog: pytest.LogCaptureFixture) -> None:
    index, clock = FakeCacheMeta(error=CacheMetaUnavailable("db down")), Clock()
    reasons: list[str] = []
    look = lookup(index, clock, reasons, retry_s=1.0)

    async def scenario() -> list[list[PrefixHolder]]:
        out = [await look.match([b"a" * 16])]
        clock.now = 0.5
        out.append(await look.match([b"b" * 16]))  # backing off: cachemeta is not asked
        clock.now = 1.1
        out.append(await look.match([b"c" * 16]))  # probes, fails again
        index.error = None
        index.holders = HOLDERS
        clock.now = 2.2
        out.append(await look.match([b"d" * 16]))  # probes, answered
        return out

    with caplog.at_level(logging.WARNING, "services.scheduler.lookup"):
        results = asyncio.run(scenario())
    assert results == [[], [], [], HOLDERS]
    assert [m[0][:1] for m in index.matches] == [b"a", b"c", b"d"]
    assert reasons == ["CacheMetaUnavailable", "backoff", "CacheMetaUnavailable"]
    assert not look.down
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages  # once when it went, once when it came back
    assert "db down" in messages[0] and "again" in messages[1]


def test_slow_refusing_or_broken_clients_are_fallbacks() -> None:
    async def ask(index: FakeCacheMeta) -> tuple[list[PrefixHolder], list[str], float]:
        reasons: list[str] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        found = await lookup(index, Clock(), reasons, timeout_s=0.05).match([b"h" * 16])
        return found, reasons, loop.time() - start

    found, reasons, took = asyncio.run(ask(FakeCacheMeta(HOLDERS, delay_s=5)))
    assert (found, reasons) == ([], ["timeout"]) and took < 1
    found, reasons, _ = asyncio.run(ask(FakeCacheMeta(error=CacheMetaError("bad"))))
    assert (found, reasons) == ([], ["CacheMetaError"])
    found, reasons, _ = asyncio.run(ask(FakeCacheMeta(error=ValueError("bug"))))
    assert (found, reasons) == ([], ["unexpected"])


def test_touches_run_in_the_background_and_never_raise() -> None:
    async def scenario() -> FakeCacheMeta:
        index = FakeCacheMeta(touch_error=CacheMetaUnavailable("gone"))
        look = lookup(index, Clock(), [])
        look.touch([b"a" * 16, b"b" * 16])
        look.touch([])  # nothing to touch: nothing added
        look.touch([b"a" * 16])  # a second access counts again
        await asyncio.sleep(look.touch_interval_s + 0.05)
        look.touch([b"c" * 16])  # after the batch went out: the next one, sent at close
        await look.close()
        return index

    assert asyncio.run(scenario()).touches == [
        [b"a" * 16, b"b" * 16, b"a" * 16],
        [b"c" * 16],
    ]


def test_no_touches_while_cachemeta_is_down() -> None:
    async def scenario() -> FakeCacheMeta:
        index = FakeCacheMeta(error=CacheMetaUnavailable("down"))
        look = lookup(index, Clock(), [])
        await look.match([b"a" * 16])
        look.touch([b"a" * 16])
        await asyncio.sleep(0.01)
        return index

    assert asyncio.run(scenario()).touches == []


def test_a_lookup_over_its_budget_is_not_waited_for_and_is_no_outage() -> None:
    async def scenario() -> None:
        reasons: list[str] = []
        index = FakeCacheMeta([PrefixHolder("A", "dram", 3)], delay_s=0.05)
        lookup = PrefixLookup(index, timeout_s=1.0, retry_s=5.0, on_fallback=reasons.append)
        assert await lookup.match([b"h" * 16], budget_s=0.01) == []
        assert reasons == ["budget"] and not lookup.down
        holders = await lookup.match([b"h" * 16])
        assert [h.node_id for h in holders] == ["A"]
        await lookup.close()

    asyncio.run(scenario())
