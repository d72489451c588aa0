"""Engine behaviour on a tiny random model: chunking, batching, reuse and preemption are exact."""

from __future__ import annotations

import random
import time

import pytest

from shared.engine.engine import LLMEngine
from shared.engine.sequence import FinishReason
from shared.errors import InvalidRequestError, PromptTooLongError
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def run_alone(
    make_engine: EngineFactory, prompt: list[int], params: SamplingParams = GREEDY
) -> list[int]:
    return make_engine().generate([prompt], params)[0].output_token_ids


def test_chunked_prefill_gives_the_same_tokens(make_engine: EngineFactory) -> None:
    batch = prompts(3, 20, 40)
    whole = make_engine().generate(batch, GREEDY)
    chunked_engine = make_engine(max_num_batched_tokens=7)
    chunked = chunked_engine.generate(batch, GREEDY)
    assert [o.output_token_ids for o in chunked] == [o.output_token_ids for o in whole]
    assert chunked_engine.stats.prompt_tokens_computed == sum(map(len, batch))
    # 7-token steps need at least total/7 steps before the first decode can even begin.
    assert chunked_engine.stats.steps >= sum(map(len, batch)) // 7


def test_batch_of_eight_equals_each_alone(make_engine: EngineFactory) -> None:
    batch = prompts(8, 3, 60, seed=1)
    together = make_engine().generate(batch, GREEDY)
    assert [o.output_token_ids for o in together] == [run_alone(make_engine, p) for p in batch]


def test_prefix_reuse_computes_only_the_suffix(make_engine: EngineFactory) -> None:
    engine = make_engine()
    shared_prefix, suffix = prompts(1, 30, 30, seed=2)[0], prompts(1, 9, 9, seed=3)[0]
    engine.generate([shared_prefix], GREEDY)
    before = engine.stats.prompt_tokens_computed
    out = engine.generate([shared_prefix + suffix], GREEDY)[0]
    # 7 full blocks of 4, and the first 2 tokens of the block the first request went on
    # generating into (copied: it is cached as the first request's).
    assert out.num_cached_tokens == len(shared_prefix) == 30
    assert engine.stats.prompt_tokens_computed - before == len(suffix)
    assert out.output_token_ids == run_alone(make_engine, shared_prefix + suffix)


def test_a_prompt_asked_again_computes_only_its_last_token(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 32, 32, seed=4)[0]
    first = engine.generate([prompt], GREEDY)[0]
    before = engine.stats.prompt_tokens_computed
    second = engine.generate([prompt], GREEDY)[0]
    # 7 full blocks, and 3 tokens of the 8th copied: its last token's logits are needed.
    assert second.num_cached_tokens == 31
    assert engine.stats.prompt_tokens_computed - before == 1
    assert second.output_token_ids == first.output_token_ids
    # Without the copy the whole 8th block is computed again.
    plain = make_engine()
    plain.kv.copy_block = None
    plain.generate([prompt], GREEDY)
    assert plain.generate([prompt], GREEDY)[0].num_cached_tokens == 28


def test_generated_tokens_are_cached_for_the_next_turn(make_engine: EngineFactory) -> None:
    engine = make_engine()
    prompt = prompts(1, 10, 10, seed=5)[0]
    out = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[
        0
    ]
    next_turn = prompt + out.output_token_ids + [7, 8, 9]
    again = engine.generate([next_turn], GREEDY)[0]
    # prompt + 19 computed outputs = 29 tokens in cache: 7 full blocks of 4, and the first
    # token of the partial block the first request ended in (taken back, not copied).
    assert again.num_cached_tokens == 29
    assert again.output_token_ids == run_alone(make_engine, next_turn)


def test_preemption_recomputes_and_changes_nothing(make_engine: EngineFactory) -> None:
    batch = prompts(6, 10, 14, seed=6)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    small = make_engine(num_kv_blocks=24)
    outs = small.generate(batch, params)
    assert small.stats.preemptions > 0
    roomy = make_engine().generate(batch, params)
    assert [o.output_token_ids for o in outs] == [o.output_token_ids for o in roomy]
    assert small.pool.num_free_blocks == 24


def test_blocks_return_to_the_pool_after_finish_and_abort(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add_request("a", prompts(1, 20, 20)[0], GREEDY)
    engine.add_request("b", prompts(1, 20, 20, seed=9)[0], GREEDY)
    engine.step()
    assert engine.pool.num_free_blocks < engine.config.num_kv_blocks
    assert engine.abort_request("a")
    assert not engine.abort_request("a")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.pool.num_free_blocks == engine.config.num_kv_blocks
    assert engine.num_unfinished_requests == 0


def test_finish_reasons(make_engine: EngineFactory) -> None:
    engine = make_engine(max_model_len=40)
    prompt = prompts(1, 10, 10, seed=10)[0]
    free_run = engine.generate(
        [prompt], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )[0]
    assert free_run.finish_reason is FinishReason.LENGTH and len(free_run.output_token_ids) == 5
    stop_on = free_run.output_token_ids[2]
    stopped = engine.generate(
        [prompt], SamplingParams(max_tokens=5, temperature=0, stop_token_ids=(stop_on,))
    )[0]
    first_hit = free_run.output_token_ids.index(stop_on) + 1
    assert stopped.finish_reason is FinishReason.STOP
    assert stopped.output_token_ids == free_run.output_token_ids[:first_hit]


def test_generation_stops_at_the_context_limit(make_engine: EngineFactory) -> None:
    engine: LLMEngine = make_engine(max_model_len=40)
    with pytest.raises(PromptTooLongError) as err:
        engine.add_request("x", list(range(3, 40)), SamplingParams(max_tokens=5))
    assert "40" in str(err.value) and "37" in str(err.value)


@pytest.mark.parametrize(
    ("prompt", "params", "field"),
    [
        ([], SamplingParams(), "prompt"),
        ([3, 600], SamplingParams(), "prompt"),
        ([3] * 100, SamplingParams(max_tokens=200), "max_tokens"),
    ],
)
def test_requests_that_can_never_run_are_refused(
    make_engine: EngineFactory, prompt: list[int], params: SamplingParams, field: str
) -> None:
    engine = make_engine(num_kv_blocks=64)
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request("r", prompt, params)
    assert err.value.param == field
    assert not engine.has_unfinished_requests()


def test_duplicate_request_ids_are_refused(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.add_request("same", [5, 6, 7], GREEDY)
    with pytest.raises(InvalidRequestError):
        engine.add_request("same", [5, 6, 7], GREEDY)


def test_seeded_sampling_is_reproducible_and_batch_independent(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 12, 12, seed=11)[0]
    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, ignore_eos=True)
    alone = make_engine().generate([prompt], seeded)[0].output_token_ids
    engine = make_engine()
    engine.add_request("other", prompts(1, 30, 30, seed=12)[0], GREEDY)
    engine.add_request("seeded", prompt, seeded)
    got: list[int] = []
    while engine.has_unfinished_requests():
        got += [t for o in engine.step() if o.request_id == "seeded" for t in o.new_token_ids]
    assert got == alone
    other_seed = SamplingParams(max_tokens=16, temperature=1.0, seed=99, ignore_eos=True)
    assert make_engine().generate([prompt], other_seed)[0].output_token_ids != alone


def test_logprobs_describe_the_chosen_token(make_engine: EngineFactory) -> None:
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=3, ignore_eos=True)
    engine = make_engine()
    engine.add_request("lp", prompts(1, 8, 8)[0], params)
    entries = []
    while engine.has_unfinished_requests():
        entries += [lp for o in engine.step() for lp in o.new_logprobs]
    assert len(entries) == 4
    for e in entries:
        assert len(e.top) == 3
        assert e.top[0][0] == e.token_id and e.top[0][1] == pytest.approx(e.logprob)
        assert [v for _, v in e.top] == sorted((v for _, v in e.top), reverse=True)
        assert e.logprob <= 0.0


def test_outputs_carry_the_time_of_their_first_step(make_engine: EngineFactory) -> None:
    engine = make_engine(max_num_batched_tokens=7)  # a prefill over several steps
    before = time.monotonic()
    engine.add_request("r", prompts(1, 20, 20, seed=9)[0], GREEDY)
    seen: list[float] = []
    while engine.has_unfinished_requests():
        seen += [o.admitted_at for o in engine.step()]
    assert seen and before < seen[0] <= time.monotonic()
    assert set(seen) == {seen[0]}  # the first step's, on every output after it


def test_a_long_prompt_prefilling_in_chunks_never_holds_a_stream_back(
    make_engine: EngineFactory,
) -> None:
    """A stream that joins the batch behind a long prompt still prefilling in chunks as large
    as the budget (as a stream handed over from another node does: it is resumed at the end
    of the running list) gets a token every step all the same, and its tokens are its own."""
    engine = make_engine(max_num_batched_tokens=8)
    short, long = prompts(1, 6, 6, seed=10)[0], prompts(1, 60, 60, seed=11)[0]
    engine.add_request("stream", short, GREEDY)
    engine.step()  # the stream's prompt and first token
    engine.add_request("long", long, GREEDY)
    engine.step()  # a token of the stream, and the long prompt's first chunk
    running = engine.scheduler.running
    running.append(running.pop(0))  # the stream behind the prompt, as a resumed one is
    for _ in range(5):  # the long prompt has 53 tokens left: it prefills through these steps
        outputs = {o.request_id: o for o in engine.step()}
        assert "stream" in outputs and "long" not in outputs
    streamed: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == "stream" and out.finished:
                streamed = out.output_token_ids
    assert streamed == run_alone(make_engine, short)
