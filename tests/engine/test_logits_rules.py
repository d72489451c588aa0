"""The engine applies each sequence's own logits rules: bias, penalties, min_tokens and stop
tokens, in a batch with other sequences, and the same after a resume or a KV hand-off."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from shared.errors import InvalidRequestError
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.engine.test_handoff import copy_blocks, decode_to_end

EOS = 2
PENALIZED = SamplingParams(
    max_tokens=24,
    temperature=1.0,
    seed=99,
    ignore_eos=True,
    frequency_penalty=1.2,
    presence_penalty=0.4,
    repetition_penalty=1.3,
)


def test_a_positive_bias_forces_a_token_and_a_negative_one_forbids_it(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 10, 10, seed=60)[0]
    forced = SamplingParams(max_tokens=6, temperature=1.0, logit_bias=((77, 100.0),))
    assert make_engine().generate([prompt], forced)[0].output_token_ids == [77] * 6
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    greedy = make_engine().generate([prompt], plain)[0].output_token_ids
    banned = dataclasses.replace(plain, logit_bias=((greedy[0], -100.0),))
    assert greedy[0] not in make_engine().generate([prompt], banned)[0].output_token_ids


def test_min_tokens_holds_back_the_end_until_reached(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 10, 10, seed=61)[0]
    eager = SamplingParams(max_tokens=20, temperature=1.0, logit_bias=((EOS, 100.0),))
    assert make_engine().generate([prompt], eager)[0].output_token_ids == [EOS]
    held = dataclasses.replace(eager, min_tokens=5)
    out = make_engine().generate([prompt], held)[0]
    assert len(out.output_token_ids) == 6 and out.output_token_ids[-1] == EOS
    assert EOS not in out.output_token_ids[:5]
    assert out.finish_reason is not None and out.finish_reason.value == "stop"


def test_stop_token_ids_end_the_sequence(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 10, 10, seed=62)[0]
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    greedy = make_engine().generate([prompt], plain)[0].output_token_ids
    stop_at = greedy[3]
    first = greedy.index(stop_at)
    stopped = dataclasses.replace(plain, stop_token_ids=(stop_at,))
    out = make_engine().generate([prompt], stopped)[0]
    assert out.output_token_ids == greedy[: first + 1]
    assert out.finish_reason is not None and out.finish_reason.value == "stop"


def test_penalties_cut_repetition(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 10, 10, seed=63)[0]
    plain = dataclasses.replace(
        PENALIZED, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0
    )
    free = make_engine().generate([prompt], plain)[0].output_token_ids
    penalized = make_engine().generate([prompt], PENALIZED)[0].output_token_ids
    assert max(Counter(penalized).values()) < max(Counter(free).values())
    assert len(set(penalized)) > len(set(free))


def test_rules_are_per_sequence_in_a_batch(make_engine: EngineFactory) -> None:
    batch = prompts(3, 8, 20, seed=64)
    alone = [make_engine().generate([p], PENALIZED)[0].output_token_ids for p in batch]
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain_alone = make_engine().generate([batch[1]], plain)[0].output_token_ids
    engine = make_engine()
    engine.add_request("a", batch[0], PENALIZED)
    engine.add_request("b", batch[1], plain)
    engine.add_request("c", batch[2], PENALIZED)
    outs = {}
    while engine.has_unfinished_requests():
        outs |= {o.request_id: o.output_token_ids for o in engine.step() if o.finished}
    assert [outs["a"], outs["c"]] == [alone[0], alone[2]]
    assert outs["b"] == plain_alone


def test_a_resumed_penalized_request_draws_the_uninterrupted_tokens(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 14, 14, seed=65)[0]
    full = make_engine().generate([prompt], PENALIZED)[0].output_token_ids
    for k in (1, 9, 20):
        resumed = dataclasses.replace(
            PENALIZED, max_tokens=PENALIZED.max_tokens - k, output_offset=k
        )
        rest = make_engine().generate([prompt + full[:k]], resumed)[0].output_token_ids
        assert full[:k] + rest == full


def test_a_penalized_handoff_decodes_like_a_single_engine(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 22, 22, seed=66)[0]
    full = make_engine().generate([prompt], PENALIZED)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    prefill_node.add_request(
        "r", prompt, dataclasses.replace(PENALIZED, max_tokens=1), hold_blocks=True
    )
    (out,) = prefill_node.step()
    assert out.new_token_ids == full[:1]
    held = prefill_node.held_block_ids("r")
    slot = decode_node.begin_import("r", prompt, full[0], PENALIZED)
    assert held is not None and slot is not None
    copy_blocks(prefill_node, held, decode_node, slot.block_ids)
    decode_node.finish_import("r", ok=True)
    assert decode_to_end(decode_node, "r") == full


def test_a_bias_outside_the_vocabulary_is_refused(make_engine: EngineFactory) -> None:
    bad = SamplingParams(max_tokens=4, logit_bias=((512, 1.0),))
    with pytest.raises(InvalidRequestError, match="logit_bias"):
        make_engine().add_request("r", [5, 6, 7], bad)


def test_a_request_can_skip_reading_or_writing_the_cache(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 30, 30, seed=67)[0]
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    no_write = dataclasses.replace(plain, cache_write=False)
    first = engine.generate([prompt], no_write)[0]
    again = engine.generate([prompt], plain)[0]
    assert again.num_cached_tokens == 0  # the first request cached nothing
    no_read = dataclasses.replace(plain, cache_read=False)
    third = engine.generate([prompt], no_read)[0]
    assert third.num_cached_tokens == 0  # the second cached its blocks; the third reads none
    assert engine.generate([prompt], plain)[0].num_cached_tokens >= 28
    assert first.output_token_ids == again.output_token_ids == third.output_token_ids
