"""The fused decode step (one kernel call per step) against the op-by-op forward pass."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from shared.engine.runner import ModelRunner
from shared.engine.scheduler import SchedulerOutput
from shared.model.decoder import DecoderForCausalLM
from shared.model.fused_decode import FusedDecoder
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def fused(model: DecoderForCausalLM) -> FusedDecoder:
    decoder = FusedDecoder.build(model)
    if decoder is None:
        pytest.skip("the CPU kernels cannot be built on this machine")
    return decoder


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def random_prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in lengths]


def prefilled(
    make_real_engine: RealEngineFactory, prompts: list[list[int]]
) -> tuple[ModelRunner, SchedulerOutput]:
    """The runner of an engine whose sequences have their prompts computed and a first token
    sampled, and the decode step that comes next (not run)."""
    engine = make_real_engine(num_kv_blocks=200, fused_decode=False)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    while any(s.num_output_tokens == 0 for s in engine._sequences.values()):
        engine.step()
    step = engine.scheduler.schedule()
    assert len(step.chunks) == len(prompts) and all(c.num_new == 1 for c in step.chunks)
    return engine.runner, step


def both_ways(
    runner: ModelRunner, step: SchedulerOutput, fused: FusedDecoder
) -> tuple[torch.Tensor, ...]:
    """The step's logits and the KV it writes, computed op by op and fused, from the same
    cache contents."""
    before = runner.cache.tensor.clone()
    runner.fused = None
    input_ids, positions, meta, rows = runner._prepare(step)
    with torch.inference_mode():
        reference = runner.model.compute_logits(
            runner.model(input_ids, positions, runner.cache, meta)[rows]
        )
    reference_kv = runner.cache.tensor.clone()
    runner.cache.tensor.copy_(before)
    runner.fused = fused
    with torch.inference_mode():
        logits = runner._fused_logits(step)
    return reference, logits, reference_kv, runner.cache.tensor.clone()


def test_fused_logits_and_kv_match_the_op_by_op_step(
    make_real_engine: RealEngineFactory, fused: FusedDecoder, two_threads: None
) -> None:
    # Contexts shorter than a block, across block and attention-span (128) boundaries, and
    # long enough to span several.
    prompts = random_prompts((1, 31, 32, 127, 128, 300, 700), seed=1)
    runner, step = prefilled(make_real_engine, prompts)
    reference, logits, reference_kv, kv = both_ways(runner, step, fused)
    assert logits.shape == reference.shape
    torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    torch.testing.assert_close(kv, reference_kv, atol=1e-5, rtol=1e-5)


def test_a_rows_logits_do_not_depend_on_its_batch_or_the_thread_count(
    make_real_engine: RealEngineFactory, fused: FusedDecoder
) -> None:
    prompts = random_prompts((5, 200, 450), seed=2)
    runner, step = prefilled(make_real_engine, prompts)
    runner.fused = fused
    before = runner.cache.tensor.clone()
    results = []
    for threads, chunks in ((2, step.chunks), (1, step.chunks), (2, step.chunks[1:2])):
        runner.cache.tensor.copy_(before)
        torch.set_num_threads(threads)
        with torch.inference_mode():
            results.append(runner._fused_logits(SchedulerOutput(list(chunks))))
    torch.set_num_threads(2)
    assert torch.equal(results[0], results[1])
    assert torch.equal(results[0][1:2], results[2])


def test_logits_stay_the_same_when_another_process_takes_a_core(
    make_real_engine: RealEngineFactory, fused: FusedDecoder, two_threads: None
) -> None:
    """Chunks a descheduled thread holds are computed again by the other one (or the step
    runs on one thread): the numbers must not change either way."""
    runner, step = prefilled(make_real_engine, random_prompts((20, 333), seed=6))
    runner.fused = fused
    before = runner.cache.tensor.clone()
    with torch.inference_mode():
        quiet = runner._fused_logits(step)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        disturbed = []
        for _ in range(20):
            runner.cache.tensor.copy_(before)
            with torch.inference_mode():
                disturbed.append(runner._fused_logits(step))
    finally:
        burner.kill()
        burner.wait()
    assert all(torch.equal(quiet, logits) for logits in disturbed)


def test_engine_steps_of_one_token_rows_run_fused_and_give_the_same_tokens(
    make_real_engine: RealEngineFactory, fused: FusedDecoder
) -> None:
    prompts = random_prompts((3, 64, 400), seed=3)
    engine = make_real_engine(num_kv_blocks=200)
    runner_fused = engine.runner.fused
    assert runner_fused is not None
    steps_before = runner_fused.stats().steps
    outputs = engine.generate(prompts, GREEDY)
    # The prompts' step runs op by op, every later one fused.
    assert runner_fused.stats().steps - steps_before == GREEDY.max_tokens - 1
    reference = make_real_engine(num_kv_blocks=200, fused_decode=False).generate(prompts, GREEDY)
    assert [o.output_token_ids for o in outputs] == [o.output_token_ids for o in reference]


def test_a_mixed_step_runs_op_by_op(
    make_real_engine: RealEngineFactory, fused: FusedDecoder
) -> None:
    engine = make_real_engine(num_kv_blocks=200)
    runner = engine.runner
    engine.add_request("a", random_prompts((40,), seed=4)[0], GREEDY)
    engine.step()
    engine.add_request("b", random_prompts((40,), seed=5)[0], GREEDY)
    step = engine.scheduler.schedule()
    assert sorted(c.num_new for c in step.chunks) == [1, 40]
    assert not runner._fits_fused(step)
    assert runner._fits_fused(SchedulerOutput([c for c in step.chunks if c.num_new == 1]))


def test_bad_inputs_get_clear_errors_and_write_nothing(
    fused: FusedDecoder, make_real_engine: RealEngineFactory
) -> None:
    kv = make_real_engine(num_kv_blocks=8).runner.cache.tensor
    ids = torch.tensor([5])
    table = torch.tensor([[1, 2]], dtype=torch.int32)
    lens = torch.tensor([40], dtype=torch.int32)
    cases = [
        (torch.tensor([10**9]), table, lens, "token id"),
        (ids, torch.tensor([[1, 99]], dtype=torch.int32), lens, "block id"),
        (ids, table, torch.tensor([100], dtype=torch.int32), "block table too short"),
        (ids, table, torch.tensor([0], dtype=torch.int32), "context length"),
        (ids, table.long(), lens, "int32"),
        (ids.int(), table, lens, "int64"),
    ]
    before = kv.clone()
    for token_ids, tables, context_lens, message in cases:
        with pytest.raises(RuntimeError, match=message):
            fused(token_ids, tables, context_lens, kv)
    with pytest.raises(RuntimeError, match="paged cache"):
        fused(ids, table, lens, kv.double())
    assert torch.equal(kv, before)


def test_steps_are_counted(fused: FusedDecoder) -> None:
    stats = fused.stats()
    assert stats.steps >= stats.steps_alone >= 0
    assert stats.shared_thread_s >= stats.shared_wait_s >= 0
