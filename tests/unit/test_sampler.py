"""Sampling rules on hand-made logits."""

from __future__ import annotations

import math

import pytest
import torch

from shared.errors import InvalidRequestError
from shared.model.sampler import Sampler
from shared.sampling_params import SamplingParams

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def draw_many(params: SamplingParams, n: int = 400) -> set[int]:
    gen = torch.Generator().manual_seed(0)
    return {Sampler().sample(LOGITS, [params], [gen])[0].token_id for _ in range(n)}


def test_greedy_takes_the_argmax() -> None:
    out = Sampler().sample(LOGITS, [SamplingParams(temperature=0)], [None])
    assert out[0].token_id == 0 and out[0].logprobs is None


def test_top_k_limits_the_support() -> None:
    assert draw_many(SamplingParams(temperature=1.0, top_k=2)) == {0, 1}
    assert draw_many(SamplingParams(temperature=1.0, top_k=1)) == {0}


def test_top_p_keeps_the_smallest_set_reaching_the_mass() -> None:
    # 0.5 alone is below 0.6, so the second token is needed; the third is not.
    assert draw_many(SamplingParams(temperature=1.0, top_p=0.6)) == {0, 1}
    assert draw_many(SamplingParams(temperature=1.0, top_p=0.5)) == {0}
    assert draw_many(SamplingParams(temperature=1.0)) == {0, 1, 2, 3}


def test_the_same_seed_draws_the_same_tokens() -> None:
    p = SamplingParams(temperature=1.0)
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(3))

    def run(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [Sampler().sample(logits, [p], [gen])[0].token_id for _ in range(20)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_rows_are_sampled_by_their_own_rules() -> None:
    logits = torch.cat([LOGITS, LOGITS.flip(-1)])
    out = Sampler().sample(
        logits, [SamplingParams(temperature=0), SamplingParams(temperature=0)], [None, None]
    )
    assert [o.token_id for o in out] == [0, 3]


def test_logprobs_are_of_the_raw_distribution() -> None:
    params = SamplingParams(temperature=0.5, logprobs=2)
    out = Sampler().sample(LOGITS, [params], [torch.Generator().manual_seed(1)])[0]
    assert out.logprobs is not None
    assert out.logprobs.top[0][0] == 0 and out.logprobs.top[0][1] == pytest.approx(math.log(0.5))
    assert out.logprobs.top[1][0] == 1 and out.logprobs.top[1][1] == pytest.approx(math.log(0.3))
    assert out.logprobs.logprob == pytest.approx(math.log([0.5, 0.3, 0.15, 0.05][out.token_id]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": 2.5},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -2},
        {"max_tokens": 0},
        {"seed": -1},
        {"logprobs": 21},
    ],
)
def test_out_of_range_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert err.value.param == next(iter(kwargs))
