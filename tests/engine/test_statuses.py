"""The statuses a sequence lives in on a node, HELD and IMPORTING above all: which blocks each
keeps, which moves each allows, and what the engine's one table counts of them."""

from __future__ import annotations

import pytest

from shared.engine.engine import LLMEngine
from shared.engine.sequence import FinishReason
from shared.errors import InvalidRequestError
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.engine.test_handoff import FIRST_ONLY, FULL, decode_to_end, prefill


def all_free(engine: LLMEngine) -> bool:
    return engine.pool.num_free_blocks == engine.config.num_kv_blocks


def test_held_blocks_stay_referenced_until_release_then_stay_cached(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    prompt = prompts(1, 18, 18, seed=40)[0]
    prefill(engine, "r", prompt)
    held = engine.held_block_ids("r")
    assert held is not None and len(held) == 5  # 18 tokens in blocks of 4
    assert engine.pool.num_free_blocks == engine.config.num_kv_blocks - 5
    assert all(engine.pool.blocks[b].ref_cnt == 1 for b in held)
    assert engine.num_unfinished_requests == 0 and not engine.has_unfinished_requests()
    assert not engine.abort_request("r")  # finished: an abort leaves its blocks held
    assert engine.held_block_ids("r") == held
    assert engine.release_held("r") and all_free(engine)
    assert engine.held_block_ids("r") is None and not engine.release_held("r")
    again = engine.generate([prompt], FIRST_ONLY)[0]
    # All but the last token, whose logits it needs: four full blocks and the partial fifth.
    assert again.num_cached_tokens == 17


def test_a_held_request_id_is_refused_until_released(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 9, 9, seed=41)[0]
    first = prefill(engine, "r", prompt)
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.add_request("r", prompt, FULL)
    with pytest.raises(InvalidRequestError, match="already in flight"):
        engine.begin_import("r", prompt, first, FULL)
    assert engine.release_held("r")
    engine.add_request("r", prompt, FIRST_ONLY)
    assert decode_to_end(engine, "r") == [first]


def test_the_load_counts_held_requests(make_engine: EngineFactory) -> None:
    engine = make_engine()
    for i, prompt in enumerate(prompts(3, 5, 9, seed=42)):
        prefill(engine, f"held-{i}", prompt)
    engine.add_request("running", prompts(1, 6, 6, seed=43)[0], FULL)
    engine.step()
    assert engine.load().held_requests == 3 and engine.num_unfinished_requests == 1
    assert engine.release_held("held-1")
    assert engine.load().held_requests == 2 and engine.num_unfinished_requests == 1


def test_an_aborted_import_frees_its_blocks_and_cannot_finish(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    prompt = prompts(1, 14, 14, seed=44)[0]
    slot = engine.begin_import("r", prompt, 7, FULL)
    assert slot is not None and len(slot.block_ids) == 4
    assert engine.pool.num_free_blocks == engine.config.num_kv_blocks - 4
    assert engine.num_unfinished_requests == 1 and engine.load().held_requests == 0
    assert engine.abort_request("r") and all_free(engine)
    assert not engine.abort_request("r") and engine.num_unfinished_requests == 0
    with pytest.raises(KeyError, match="not importing"):
        engine.finish_import("r", ok=True)
    assert all_free(engine)


def test_only_an_importing_request_finishes_importing(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 10, 10, seed=45)[0]
    prefill(engine, "held", prompt)
    engine.add_request("running", prompt, FULL)
    engine.step()
    assert engine.begin_import("imported", prompt, 7, FULL) is not None
    engine.finish_import("imported", ok=True)
    free = engine.pool.num_free_blocks
    for request_id, status in (("held", "held"), ("running", "running"), ("imported", "running")):
        with pytest.raises(KeyError, match=f"is {status}, not importing"):
            engine.finish_import(request_id, ok=False)
    assert engine.pool.num_free_blocks == free  # the refused moves freed nothing
    assert engine.held_block_ids("held") is not None


def test_a_failed_import_looks_the_cache_up_again_and_decodes_the_same(
    make_engine: EngineFactory,
) -> None:
    shared_prefix = prompts(1, 12, 12, seed=46)[0]
    prompt = shared_prefix + prompts(1, 7, 7, seed=47)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    first = prefill(prefill_node, "r", prompt)
    slot = decode_node.begin_import("r", prompt, first, FULL)
    assert slot is not None and slot.first_block == 0  # nothing cached here yet
    decode_node.generate([[*shared_prefix, 9, 9]], FULL)  # caches three blocks meanwhile
    decode_node.finish_import("r", ok=False)
    outs = []
    while decode_node.has_unfinished_requests():
        outs += [o for o in decode_node.step() if o.request_id == "r"]
    assert outs[-1].output_token_ids == expected and outs[-1].num_cached_tokens == 12
    assert decode_node.stats.prompt_tokens_imported == 0
    assert all_free(decode_node)


def test_fail_all_ends_importing_requests_and_keeps_held_ones(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    held_prompt, queued, imported = prompts(3, 8, 12, seed=48)
    prefill(engine, "held", held_prompt)
    held_blocks = engine.held_block_ids("held")
    assert held_blocks is not None
    engine.add_request("queued", queued, FULL)
    assert engine.begin_import("imported", imported, 7, FULL) is not None
    outs = engine.fail_all("gone")
    assert sorted(o.request_id for o in outs) == ["imported", "queued"]
    assert all(o.finish_reason is FinishReason.ERROR and o.error == "gone" for o in outs)
    assert engine.num_unfinished_requests == 0 and engine.load().held_requests == 1
    assert engine.pool.num_free_blocks == engine.config.num_kv_blocks - len(held_blocks)
    assert engine.release_held("held") and all_free(engine)
