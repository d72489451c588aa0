"""A step that raises fails only the sequences that cause it, once, and gives their blocks back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from shared.engine.engine import LLMEngine
from shared.engine.scheduler import SchedulerOutput
from shared.engine.sequence import FinishReason, Sequence
from shared.engine.types import RequestOutput
from shared.model.sampler import SampledToken
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
POISON = 500  # a token id the poisoned model refuses to compute
Execute = Callable[[SchedulerOutput], list[tuple[Sequence, SampledToken]]]


class Faulty:
    """Wraps a runner's ``execute``: raises whenever ``fails`` says so, counting calls."""

    def __init__(self, execute: Execute, fails: Callable[[SchedulerOutput], bool]) -> None:
        self.execute = execute
        self.fails = fails
        self.calls = 0

    def __call__(self, plan: SchedulerOutput) -> list[tuple[Sequence, SampledToken]]:
        self.calls += 1
        if self.fails(plan):
            raise RuntimeError("injected fault")
        return self.execute(plan)


class PoisonedModel:
    """The tiny model, except that computing the token ``POISON`` raises, and that it can be
    told to give no token a finite logit."""

    def __init__(self, model: Any, nan_logits: bool = False) -> None:
        self.model = model
        self.config = model.config
        self.nan_logits = nan_logits

    def __call__(self, input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        if bool((input_ids == POISON).any()):
            raise RuntimeError("cannot compute the poison token")
        return self.model(input_ids, *args)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(hidden)
        return torch.full_like(logits, float("nan")) if self.nan_logits else logits


def run(engine: LLMEngine, max_steps: int = 200) -> dict[str, list[RequestOutput]]:
    """Steps to the end (``step`` must never raise); every output, by request."""
    by_id: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return by_id
        for out in engine.step():
            by_id.setdefault(out.request_id, []).append(out)
    raise AssertionError("the engine did not finish")


def assert_failed_once(outs: list[RequestOutput], error: str, num_tokens: int = 0) -> None:
    assert len([o for o in outs if o.finished]) == 1 and outs[-1].finished
    last = outs[-1]
    assert last.finish_reason is FinishReason.ERROR and last.finish_reason == "error"
    assert last.error == error and last.new_token_ids == []
    assert len(last.output_token_ids) == num_tokens


def assert_all_blocks_free(engine: LLMEngine) -> None:
    assert engine.pool.num_free_blocks == engine.config.num_kv_blocks
    assert engine.num_unfinished_requests == 0 and engine.load().held_requests == 0


def expected_tokens(make_engine: EngineFactory, batch: list[list[int]]) -> list[list[int]]:
    return [o.output_token_ids for o in make_engine().generate(batch, GREEDY)]


def test_a_poisoned_sequence_fails_alone_and_the_batch_goes_on(
    make_engine: EngineFactory,
) -> None:
    batch = prompts(3, 6, 20, seed=60)
    expected = expected_tokens(make_engine, batch)
    engine = make_engine()
    engine.runner.model = PoisonedModel(engine.runner.model)  # type: ignore[assignment]
    for i, prompt in enumerate(batch):
        engine.add_request(f"ok-{i}", prompt, GREEDY)
    engine.add_request("bad", [7, 8, POISON, 9], GREEDY, hold_blocks=True)
    outs = run(engine)
    error = "the engine failed on this request: RuntimeError: cannot compute the poison token"
    assert_failed_once(outs["bad"], error)
    assert [outs[f"ok-{i}"][-1].output_token_ids for i in range(3)] == expected
    assert all(outs[f"ok-{i}"][-1].finish_reason is FinishReason.LENGTH for i in range(3))
    assert engine.held_block_ids("bad") is None and not engine.release_held("bad")
    assert engine.stats.failed_requests == 1 and engine.stats.failed_steps == 1
    assert_all_blocks_free(engine)


def test_a_sequence_failing_mid_decode_keeps_its_tokens(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = prompts(3, 6, 12, seed=61)
    expected = expected_tokens(make_engine, batch)
    engine = make_engine()

    def poisoned(plan: SchedulerOutput) -> bool:
        return any(
            c.seq.request_id == "gen-1" and c.seq.num_output_tokens == 3 for c in plan.chunks
        )

    faulty = Faulty(engine.runner.execute, poisoned)
    monkeypatch.setattr(engine.runner, "execute", faulty)
    for i, prompt in enumerate(batch):
        engine.add_request(f"gen-{i}", prompt, GREEDY, hold_blocks=i == 0)
    outs = run(engine)
    error = "the engine failed on this request: RuntimeError: injected fault"
    assert_failed_once(outs["gen-1"], error, num_tokens=3)
    assert outs["gen-1"][-1].output_token_ids == expected[1][:3]
    assert [outs[f"gen-{i}"][-1].output_token_ids for i in (0, 2)] == [expected[0], expected[2]]
    # A healthy held request is held as usual, and its release frees the pool.
    assert engine.held_block_ids("gen-0") is not None and engine.release_held("gen-0")
    assert_all_blocks_free(engine)


def test_a_runner_failing_every_batch_fails_each_sequence_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    faulty = Faulty(engine.runner.execute, lambda plan: True)
    monkeypatch.setattr(engine.runner, "execute", faulty)
    for i, prompt in enumerate(prompts(3, 5, 9, seed=62)):
        engine.add_request(f"r{i}", prompt, GREEDY, hold_blocks=i == 1)
    outs = engine.step()
    assert sorted(o.request_id for o in outs) == ["r0", "r1", "r2"]
    for o in outs:
        assert_failed_once([o], "the engine failed on this request: RuntimeError: injected fault")
    assert faulty.calls == 4  # the batch, then each of its three chunks alone
    assert not engine.has_unfinished_requests() and engine.step() == []
    assert engine.stats.failed_requests == 3 and engine.stats.failed_steps == 1
    assert_all_blocks_free(engine)


def test_a_lone_failing_sequence_is_not_retried(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine()
    faulty = Faulty(engine.runner.execute, lambda plan: True)
    monkeypatch.setattr(engine.runner, "execute", faulty)
    engine.add_request("only", [5, 6, 7], GREEDY)
    (out,) = engine.step()
    assert_failed_once([out], "the engine failed on this request: RuntimeError: injected fault")
    assert faulty.calls == 1
    assert_all_blocks_free(engine)


def test_an_unexplained_failure_fails_that_batch_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = prompts(3, 5, 9, seed=63)
    expected = expected_tokens(make_engine, batch)
    engine = make_engine(max_num_seqs=2)
    # Only a batch of two fails: every chunk alone computes fine, so nobody is the culprit.
    faulty = Faulty(engine.runner.execute, lambda plan: len(plan.chunks) == 2)
    monkeypatch.setattr(engine.runner, "execute", faulty)
    for i, prompt in enumerate(batch):
        engine.add_request(f"gen-{i}", prompt, GREEDY)
    outs = run(engine)
    for i in (0, 1):
        assert_failed_once(
            outs[f"gen-{i}"], "the engine failed on this request: RuntimeError: injected fault"
        )
    assert outs["gen-2"][-1].output_token_ids == expected[2]
    assert engine.stats.failed_requests == 2 and engine.stats.failed_steps == 1
    assert_all_blocks_free(engine)


def test_logits_without_a_finite_value_fail_the_sampled_sequences(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine(max_num_batched_tokens=8)
    engine.runner.model = PoisonedModel(engine.runner.model, nan_logits=True)  # type: ignore[assignment]
    engine.add_request("short", [5, 6, 7], GREEDY, hold_blocks=True)
    engine.add_request("long", list(range(10, 30)), GREEDY)
    outs = run(engine)
    for request_id in ("short", "long"):
        assert_failed_once(outs[request_id], "the model gave no token a finite logit")
    assert engine.stats.failed_steps == 0 and engine.stats.failed_requests == 2
    assert_all_blocks_free(engine)


def test_a_temperature_below_the_floor_still_samples(make_engine: EngineFactory) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=1, ignore_eos=True)
    # As a caller that skipped validation would send it.
    object.__setattr__(params, "temperature", 1e-300)
    engine = make_engine()
    engine.add_request("cold", prompts(1, 10, 10, seed=64)[0], params)
    outs = run(engine)["cold"]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].error is None
    assert len(outs[-1].output_token_ids) == 8
    assert all(0 <= t < 512 for t in outs[-1].output_token_ids)
