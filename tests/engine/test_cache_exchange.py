"""Cached blocks crossing engines: catalogue events, pins for peers, prefix imports."""

from __future__ import annotations

from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts

FULL = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SALT = b"tenant-a"


def run(engine: LLMEngine, request_id: str, prompt: list[int], salt: bytes = SALT) -> list[int]:
    engine.add_request(request_id, prompt, FULL, salt)
    out: list[int] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                out = o.output_token_ids
    return out


def copy(src: LLMEngine, src_ids: list[int], dst: LLMEngine, dst_ids: list[int]) -> list[int]:
    for s, d in zip(src_ids, dst_ids, strict=True):
        dst.runner.cache.write_block_bytes(d, src.runner.cache.read_block_bytes(s))
    return [dst.checksum(dst.runner.cache.block_buffer(d).data) for d in dst_ids]


def test_events_carry_the_chain_tokens_and_a_true_checksum(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 18, 18, seed=30)[0]
    run(engine, "a", prompt)
    stored, evicted = engine.exchange.drain_events()
    hashes = engine.exchange.prompt_hashes(prompt, SALT)
    assert [b.block_hash for b in stored[: len(hashes)]] == hashes
    assert stored[1].parent_hash == stored[0].block_hash
    assert list(stored[0].token_ids) == prompt[:4]
    for b in stored:
        assert b.checksum == engine.checksum(engine.runner.cache.block_buffer(b.block_id).data)
    assert evicted == []
    assert engine.exchange.drain_events() == ([], [])
    assert {b.block_hash for b in engine.exchange.snapshot()} == {b.block_hash for b in stored}


def test_a_prefix_pulled_from_a_peer_is_reused_and_decodes_the_same(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 26, 26, seed=31)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    holder, puller = make_engine(), make_engine()
    run(holder, "warm", prompt)
    hashes = puller.exchange.prompt_hashes(prompt, SALT)
    assert len(hashes) == 6  # (26 - 1) // 4 blocks may come from a cache

    free_before = holder.pool.num_free_blocks
    pinned = holder.exchange.pin(hashes)
    assert len(pinned) == 6 and holder.pool.num_free_blocks == free_before - 6
    imp = puller.exchange.begin_import(prompt, SALT, hashes, 0, len(pinned))
    assert imp is not None
    sums = copy(holder, [b for b, _ in pinned], puller, imp.block_ids)
    assert sums == [c for _, c in pinned]
    assert puller.exchange.finish_import(imp, sums) == 6
    holder.exchange.unpin([b for b, _ in pinned])
    assert holder.pool.num_free_blocks == free_before  # unpinned, still cached

    assert run(puller, "r", prompt) == expected
    assert puller.stats.prompt_tokens_computed == 26 - 24
    assert puller.pool.num_free_blocks == puller.config.num_kv_blocks


def test_only_the_verified_leading_blocks_are_cached(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 26, 26, seed=32)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    holder, puller = make_engine(), make_engine()
    run(holder, "warm", prompt)
    hashes = puller.exchange.prompt_hashes(prompt, SALT)
    pinned = holder.exchange.pin(hashes)
    imp = puller.exchange.begin_import(prompt, SALT, hashes, 0, len(pinned))
    assert imp is not None
    sums = copy(holder, [b for b, _ in pinned], puller, imp.block_ids)
    assert puller.exchange.finish_import(imp, sums[:2]) == 2  # block 2 failed verification
    assert run(puller, "r", prompt) == expected
    assert puller.stats.prompt_tokens_computed == 26 - 8


def test_a_pull_continues_a_prefix_the_puller_holds(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 30, 30, seed=33)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    holder, puller = make_engine(), make_engine()
    run(holder, "warm", prompt)
    run(puller, "short", prompt[:9])  # the puller caches blocks 0 and 1 itself
    hashes = puller.exchange.prompt_hashes(prompt, SALT)
    first = puller.exchange.num_leading_cached(hashes)
    assert first == 2
    pinned = holder.exchange.pin(hashes[first:])
    imp = puller.exchange.begin_import(prompt, SALT, hashes, first, len(pinned))
    assert imp is not None and len(imp.block_ids) == 5
    sums = copy(holder, [b for b, _ in pinned], puller, imp.block_ids)
    puller.exchange.finish_import(imp, sums)
    holder.exchange.unpin([b for b, _ in pinned])
    computed_before = puller.stats.prompt_tokens_computed
    assert run(puller, "r", prompt) == expected
    assert puller.stats.prompt_tokens_computed - computed_before == 30 - 28


def test_another_scope_pins_nothing(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 20, 20, seed=34)[0]
    holder = make_engine()
    run(holder, "warm", prompt, salt=b"tenant-a")
    other = holder.exchange.prompt_hashes(prompt, b"tenant-b")
    free_before = holder.pool.num_free_blocks
    assert holder.exchange.pin(other) == []
    assert holder.pool.num_free_blocks == free_before


def test_no_room_reserves_nothing_and_keeps_the_pool_whole(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 20, 20, seed=35)[0]
    blocks = engine.config.num_kv_blocks
    taken = engine.pool.allocate(blocks - 1)
    assert taken is not None
    hashes = engine.exchange.prompt_hashes(prompt, SALT)
    assert engine.exchange.begin_import(prompt, SALT, hashes, 0, 4) is None
    engine.pool.free(taken)
    assert engine.pool.num_free_blocks == blocks


def test_sink_offers_the_coldest_unsunk_blocks_and_never_a_busy_one(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    ex, pool = engine.exchange, engine.pool
    first, second = prompts(2, 20, 20, seed=36)
    run(engine, "a", first)
    cold = {b.block_hash for b in ex.snapshot()}  # prompt and reply blocks alike
    run(engine, "b", second)
    offered = ex.offer_sink(3, lambda _h: False)
    # The first prompt freed its blocks first and deepest first: they are evicted first.
    assert {b.block_hash for b in offered} <= cold and len(offered) == 3
    assert all(b.quota_key == SALT[:16] for b in offered)
    assert all(pool.get_cached_block(b.block_hash).ref_cnt == 1 for b in offered)  # type: ignore[union-attr]
    taken = {b.block_hash for b in offered}
    again = ex.offer_sink(64, lambda h: h in taken)
    assert not taken & {b.block_hash for b in again}
    # A quarter of the free blocks at most, so a sink cannot starve admissions.
    assert 0 < len(again) <= (pool.num_free_blocks + len(again)) // 4
    ex.unpin([b.block_id for b in offered])
    ex.unpin([b.block_id for b in again])
    assert all(pool.get_cached_block(x).ref_cnt == 0 for x in taken)  # type: ignore[union-attr]
    pool.mark_sunk([b.block_hash for b in ex.snapshot()])
    assert pool.num_unsunk == 0
    assert ex.offer_sink(64, lambda _h: False) == []


def test_blocks_read_up_from_a_lower_tier_are_not_offered_again(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 26, 26, seed=37)[0]
    holder, reader = make_engine(), make_engine()
    run(holder, "warm", prompt)
    hashes = reader.exchange.prompt_hashes(prompt, SALT)
    pinned = holder.exchange.pin(hashes)
    imp = reader.exchange.begin_import(prompt, SALT, hashes, 0, len(pinned))
    assert imp is not None and imp.quota_key == SALT[:16]
    imp.sunk = True
    checksums = copy(holder, [b for b, _ in pinned], reader, imp.block_ids)
    assert reader.exchange.finish_import(imp, checksums) == len(pinned)
    assert reader.pool.num_unsunk == 0
    assert reader.exchange.offer_sink(64, lambda _h: False) == []
