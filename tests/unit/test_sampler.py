"""Sampling rules on hand-made logits: filters, seeds by position, and bad logit values."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from shared.errors import InvalidRequestError
from shared.model import sampler as sampler_module
from shared.model.sampler import LOGPROB_FLOOR, NO_TOKEN, Sampler, position_seed
from shared.sampling_params import MIN_TEMPERATURE, SamplingParams

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
INF, NAN = float("inf"), float("nan")
GREEDY = SamplingParams(temperature=0)
RANDOM = SamplingParams(temperature=1.0)


def draw_many(params: SamplingParams, logits: torch.Tensor = LOGITS, n: int = 400) -> set[int]:
    sampler = Sampler()
    return {sampler.sample(logits, [params], [0])[0].token_id for _ in range(n)}


def seeded_run(sampler: Sampler, logits: torch.Tensor, seed: int, positions: range) -> list[int]:
    p = SamplingParams(temperature=1.0, seed=seed)
    return [sampler.sample(logits, [p], [i])[0].token_id for i in positions]


def forced(params: SamplingParams, **values: Any) -> SamplingParams:
    """Params carrying values validation refuses, as a caller that skipped it would send."""
    for name, value in values.items():
        object.__setattr__(params, name, value)
    return params


def test_greedy_takes_the_argmax() -> None:
    out = Sampler().sample(LOGITS, [GREEDY], [0])
    assert out[0].token_id == 0 and out[0].logprobs is None and out[0].error is None


def test_top_k_limits_the_support() -> None:
    assert draw_many(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draw_many(SamplingParams(temperature=1.0, top_k=1)) == {0}
    # A top_k beyond the vocabulary keeps every token.
    assert draw_many(SamplingParams(temperature=1.0, top_k=1 << 31)) == {0, 1, 2, 3}


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    # 0.5 alone is below 0.6, so the second token is needed; the third is not.
    assert draw_many(SamplingParams(temperature=1.0, top_p=0.6)) == {0, 1}
    assert draw_many(SamplingParams(temperature=1.0, top_p=0.5)) == {0}
    assert draw_many(RANDOM) == {0, 1, 2, 3}


def test_a_seeded_draw_depends_only_on_seed_and_position() -> None:
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(3))
    first = seeded_run(Sampler(), logits, 7, range(20))
    assert seeded_run(Sampler(), logits, 7, range(20)) == first
    # Resuming at position 12 on a fresh sampler continues exactly where the run was.
    assert seeded_run(Sampler(), logits, 7, range(12, 20)) == first[12:]
    assert seeded_run(Sampler(), logits, 8, range(20)) != first
    assert len(set(first)) > 10  # positions draw different numbers, not one repeated token


def test_a_seeded_row_draws_the_same_in_any_batch() -> None:
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(4))
    seeded = SamplingParams(temperature=1.0, seed=5)
    alone = Sampler().sample(logits[1:2], [seeded], [9])[0].token_id
    sampler = Sampler()
    for _ in range(5):
        out = sampler.sample(logits, [RANDOM, seeded, RANDOM], [0, 9, 3])
        assert out[1].token_id == alone


def test_position_seeds_are_64_bit_and_distinct() -> None:
    seeds = {position_seed(s, p) for s in (0, 1, 2**63 - 1) for p in range(50)}
    assert len(seeds) == 150 and all(0 <= s < 2**64 for s in seeds)


def test_unseeded_samplers_draw_differently() -> None:
    logits = torch.zeros(1, 1000)
    a = [Sampler().sample(logits, [RANDOM], [i])[0].token_id for i in range(20)]
    b = [Sampler().sample(logits, [RANDOM], [i])[0].token_id for i in range(20)]
    assert a != b


def test_rows_are_sampled_by_their_own_rules() -> None:
    logits = torch.cat([LOGITS, LOGITS.flip(-1)])
    out = Sampler().sample(logits, [GREEDY, GREEDY], [0, 0])
    assert [o.token_id for o in out] == [0, 3]


def test_logprobs_are_of_the_raw_distribution() -> None:
    params = SamplingParams(temperature=0.5, logprobs=2, seed=1)
    out = Sampler().sample(LOGITS, [params], [0])[0]
    assert out.logprobs is not None
    assert out.logprobs.top[0][0] == 0 and out.logprobs.top[0][1] == pytest.approx(math.log(0.5))
    assert out.logprobs.top[1][0] == 1 and out.logprobs.top[1][1] == pytest.approx(math.log(0.3))
    assert out.logprobs.logprob == pytest.approx(math.log([0.5, 0.3, 0.15, 0.05][out.token_id]))


def test_nan_logits_count_as_minus_infinity() -> None:
    logits = torch.tensor([[NAN, 1.0, NAN, 0.5]])
    assert Sampler().sample(logits, [GREEDY], [0])[0].token_id == 1
    assert draw_many(RANDOM, logits) == {1, 3}


def test_positive_infinities_win_and_share_the_choice() -> None:
    logits = torch.tensor([[0.0, INF, 50.0, INF, NAN]])
    assert Sampler().sample(logits, [GREEDY], [0])[0].token_id == 1
    assert draw_many(RANDOM, logits) == {1, 3}
    assert draw_many(SamplingParams(temperature=0.5, top_p=0.3, top_k=3), logits) <= {1, 3}
    out = Sampler().sample(logits, [SamplingParams(temperature=0, logprobs=2)], [0])[0]
    assert out.logprobs is not None and out.logprobs.logprob == pytest.approx(math.log(0.5))


def test_a_row_without_candidates_fails_alone() -> None:
    logits = torch.tensor([[-INF, -INF, -INF], [NAN, NAN, NAN], [0.0, 1.0, 0.0]])
    out = Sampler().sample(logits, [RANDOM, GREEDY, GREEDY], [0, 0, 0])
    assert [o.token_id for o in out] == [NO_TOKEN, NO_TOKEN, 1]
    assert out[0].error == out[1].error == "the model gave no token a finite logit"
    assert out[2].error is None


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-45, 1e-300, 5e-324])
def test_tiny_temperatures_and_huge_logits_still_sample(temperature: float) -> None:
    logits = torch.tensor([[3e38, -3e38, 2.9e38, 1.0], [1.0, 2.0, 0.0, -1.0]])
    params = forced(SamplingParams(temperature=1.0, seed=3), temperature=temperature)
    out = Sampler().sample(logits, [params, params], [0, 1])
    assert [o.error for o in out] == [None, None]
    # So cold a temperature leaves only the best token.
    assert [o.token_id for o in out] == [0, 1]


def test_logprobs_are_finite_whatever_the_logits() -> None:
    logits = torch.tensor([[0.0, -INF, NAN, -INF]])
    params = SamplingParams(temperature=1.0, logprobs=4, seed=0)
    out = Sampler().sample(logits, [params], [0])[0]
    assert out.token_id == 0 and out.logprobs is not None
    assert out.logprobs.logprob == 0.0
    assert out.logprobs.top[0] == (0, 0.0)
    # The impossible tokens tie, in no particular order, at the floor.
    assert sorted(out.logprobs.top[1:]) == [(i, LOGPROB_FLOOR) for i in (1, 2, 3)]


def test_garbage_logits_never_give_an_id_outside_the_vocabulary() -> None:
    gen = torch.Generator().manual_seed(11)
    specials = torch.tensor([INF, -INF, NAN, 3e38, -3e38, 0.0])
    params = [GREEDY, RANDOM, SamplingParams(temperature=0.01, top_k=2, top_p=0.5, seed=2)]
    for _ in range(200):
        logits = torch.randn(3, 6, generator=gen) * 1e3
        picks = torch.randint(0, 6, (3, 6), generator=gen)
        mask = torch.rand(3, 6, generator=gen) < 0.5
        logits = torch.where(mask, specials[picks], logits)
        for row, out in enumerate(Sampler().sample(logits, params, [0, 1, 2])):
            clean = logits[row].nan_to_num(nan=-INF)
            if (clean == -INF).all():
                assert out.token_id == NO_TOKEN and out.error is not None
                continue
            assert 0 <= out.token_id < 6 and out.error is None
            best = clean.max()
            assert clean[out.token_id] == best if best == INF else clean[out.token_id] > -INF


def test_an_exception_in_one_row_fails_only_that_row(monkeypatch: pytest.MonkeyPatch) -> None:
    real_draw = sampler_module._draw

    def draw(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
        if p.seed == 13:
            raise RuntimeError("bad row")
        return real_draw(logits, p, gen)

    monkeypatch.setattr(sampler_module, "_draw", draw)
    bad = SamplingParams(temperature=1.0, seed=13)
    out = Sampler().sample(torch.cat([LOGITS, LOGITS]), [bad, GREEDY], [0, 0])
    assert (
        out[0].token_id == NO_TOKEN and out[0].error == "sampling failed: RuntimeError('bad row')"
    )
    assert out[1].token_id == 0 and out[1].error is None


def test_a_failing_batch_step_falls_back_to_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    real_of = sampler_module._Cleaned.of

    def of(logits: torch.Tensor, want_logprobs: bool, raw: torch.Tensor | None = None) -> Any:
        if logits.shape[0] > 1:
            raise RuntimeError("out of memory")
        return real_of(logits, want_logprobs, raw)

    monkeypatch.setattr(sampler_module._Cleaned, "of", staticmethod(of))
    logits = torch.cat([LOGITS, LOGITS.flip(-1)])
    out = Sampler().sample(logits, [GREEDY, GREEDY], [0, 0])
    assert [(o.token_id, o.error) for o in out] == [(0, None), (3, None)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"temperature": 1e-300},
        {"temperature": 0.009},
        {"temperature": NAN},
        {"temperature": INF},
        {"temperature": True},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_p": NAN},
        {"top_k": -2},
        {"top_k": (1 << 31) + 1},
        {"top_k": True},
        {"max_tokens": 0},
        {"max_tokens": True},
        {"max_tokens": 2.0},
        {"seed": -1},
        {"seed": 2**63},
        {"seed": False},
        {"logprobs": 21},
        {"logprobs": True},
        {"output_offset": -1},
    ],
)
def test_out_of_range_parameters_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)
    name = next(iter(kwargs))
    assert err.value.param == name and str(err.value).startswith(name)


def test_the_temperature_floor_is_named() -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(temperature=1e-45)
    assert str(err.value) == "temperature must be 0 (greedy) or between 0.01 and 2, got 1e-45"
    for ok in (0.0, MIN_TEMPERATURE, 2.0, 1):
        assert SamplingParams(temperature=ok).temperature == ok
