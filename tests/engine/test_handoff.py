"""Prefill on one engine, decode on another: the KV handoff the services build on."""

from __future__ import annotations

from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts

FULL = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
FIRST_ONLY = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def prefill(engine: LLMEngine, request_id: str, prompt: list[int]) -> int:
    engine.add_request(request_id, prompt, FIRST_ONLY, hold_blocks=True)
    outs = [o for _ in range(50) if engine.has_unfinished_requests() for o in engine.step()]
    assert len(outs) == 1 and outs[0].finished
    return outs[0].new_token_ids[0]


def copy_blocks(src: LLMEngine, src_ids: list[int], dst: LLMEngine, dst_ids: list[int]) -> None:
    for s, d in zip(src_ids, dst_ids, strict=True):
        dst.runner.cache.write_block_bytes(d, src.runner.cache.read_block_bytes(s))


def decode_to_end(engine: LLMEngine, request_id: str) -> list[int]:
    out: list[int] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == request_id and o.finished:
                out = o.output_token_ids
    return out


def test_imported_kv_decodes_like_a_single_engine(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 22, 22, seed=20)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    first = prefill(prefill_node, "r", prompt)
    held = prefill_node.held_block_ids("r")
    assert held is not None and len(held) == 6  # 22 tokens in blocks of 4
    slot = decode_node.begin_import("r", prompt, first, FULL)
    assert slot is not None and slot.first_block == 0 and len(slot.block_ids) == 6
    copy_blocks(prefill_node, held, decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == expected
    assert decode_node.stats.prompt_tokens_computed == 0
    assert decode_node.stats.prompt_tokens_imported == 22
    assert prefill_node.release_held("r") and not prefill_node.release_held("r")
    assert prefill_node.pool.num_free_blocks == prefill_node.config.num_kv_blocks


def test_a_failed_import_is_recomputed_with_the_same_tokens(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 17, 17, seed=21)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    first = prefill(prefill_node, "r", prompt)
    assert decode_node.begin_import("r", prompt, first, FULL) is not None
    decode_node.finish_import("r", ok=False)
    assert decode_to_end(decode_node, "r") == expected
    assert decode_node.stats.prompt_tokens_computed == 17
    assert decode_node.pool.num_free_blocks == decode_node.config.num_kv_blocks


def test_blocks_the_decode_node_caches_are_not_pulled(make_engine: EngineFactory) -> None:
    shared_prefix = prompts(1, 16, 16, seed=22)[0]
    prompt = shared_prefix + prompts(1, 9, 9, seed=23)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    decode_node.generate([[*shared_prefix, 5, 5, 5]], FULL)
    first = prefill(prefill_node, "r", prompt)
    held = prefill_node.held_block_ids("r")
    assert held is not None
    slot = decode_node.begin_import("r", prompt, first, FULL)
    assert slot is not None and slot.first_block == 4  # 16 shared tokens = 4 cached blocks
    copy_blocks(prefill_node, held[slot.first_block :], decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == expected


def test_no_room_means_no_reservation(make_engine: EngineFactory) -> None:
    decode_node = make_engine(num_kv_blocks=12)
    decode_node.add_request("busy", prompts(1, 24, 24, seed=24)[0], FULL)
    decode_node.step()
    free_before = decode_node.pool.num_free_blocks
    assert decode_node.pool.num_free_blocks == 6
    assert decode_node.begin_import("r", prompts(1, 28, 28)[0], 7, FULL) is None
    assert decode_node.pool.num_free_blocks == free_before
    assert decode_node.abort_request("busy")


def test_aborting_an_import_in_flight_frees_its_blocks(make_engine: EngineFactory) -> None:
    decode_node = make_engine()
    assert decode_node.begin_import("r", prompts(1, 20, 20)[0], 7, FULL) is not None
    assert decode_node.abort_request("r")
    assert decode_node.pool.num_free_blocks == decode_node.config.num_kv_blocks
