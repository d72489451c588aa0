"""Seeded draws follow the completion position: a request resumed elsewhere, handed from a
prefill to a decode engine or preempted and recomputed draws exactly the uninterrupted tokens."""

from __future__ import annotations

import dataclasses

import pytest

from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.engine.test_handoff import copy_blocks, decode_to_end

SEEDED = SamplingParams(max_tokens=16, temperature=1.0, seed=4321, ignore_eos=True)


def resumed(params: SamplingParams, k: int) -> SamplingParams:
    """What a request resumed after ``k`` delivered tokens is re-sent with."""
    return dataclasses.replace(params, max_tokens=params.max_tokens - k, output_offset=k)


@pytest.mark.parametrize("k", [1, 5, 11, 15])
def test_a_resumed_seeded_request_draws_the_uninterrupted_tokens(
    make_engine: EngineFactory, k: int
) -> None:
    prompt = prompts(1, 14, 14, seed=50)[0]
    full = make_engine().generate([prompt], SEEDED)[0].output_token_ids
    assert len(full) == 16 and len(set(full)) > 4  # really sampled, not one repeated token
    rest = make_engine().generate([prompt + full[:k]], resumed(SEEDED, k))[0].output_token_ids
    assert full[:k] + rest == full


def test_without_the_offset_a_resumed_request_draws_other_tokens(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 14, 14, seed=50)[0]
    full = make_engine().generate([prompt], SEEDED)[0].output_token_ids
    wrong = dataclasses.replace(SEEDED, max_tokens=11)
    rest = make_engine().generate([prompt + full[:5]], wrong)[0].output_token_ids
    assert rest != full[5:]


def test_a_resumed_request_draws_the_same_in_a_batch(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 9, 9, seed=51)[0]
    full = make_engine().generate([prompt], SEEDED)[0].output_token_ids
    engine = make_engine()
    for i, other in enumerate(prompts(3, 5, 30, seed=52)):
        engine.add_request(f"other-{i}", other, SamplingParams(max_tokens=20, temperature=1.0))
    engine.add_request("resumed", prompt + full[:6], resumed(SEEDED, 6))
    got: list[int] = []
    while engine.has_unfinished_requests():
        got += [t for o in engine.step() if o.request_id == "resumed" for t in o.new_token_ids]
    assert full[:6] + got == full


def test_a_seeded_handoff_decodes_like_a_single_engine(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 22, 22, seed=53)[0]
    full = make_engine().generate([prompt], SEEDED)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    first_only = dataclasses.replace(SEEDED, max_tokens=1)
    prefill_node.add_request("r", prompt, first_only, hold_blocks=True)
    (out,) = prefill_node.step()
    assert out.finished and out.new_token_ids == full[:1]
    first = full[0]
    held = prefill_node.held_block_ids("r")
    slot = decode_node.begin_import("r", prompt, first, SEEDED)
    assert held is not None and slot is not None
    copy_blocks(prefill_node, held, decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == full


def test_preempted_seeded_sequences_draw_what_they_would_have(
    make_engine: EngineFactory,
) -> None:
    batch = prompts(6, 10, 14, seed=54)
    params = dataclasses.replace(SEEDED, max_tokens=24)
    small = make_engine(num_kv_blocks=24)
    squeezed = small.generate(batch, params)
    assert small.stats.preemptions > 0
    alone = [make_engine().generate([p], params)[0].output_token_ids for p in batch]
    assert [o.output_token_ids for o in squeezed] == alone
