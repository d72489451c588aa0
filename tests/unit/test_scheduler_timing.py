"""The scheduler's step-time model: the fit, the per-node windows and the derived times."""

from __future__ import annotations

import math
import random

import pytest

from services.scheduler.fit import Moments, fit
from services.scheduler.timing import (
    DEFAULT_PRIOR,
    StepCoefficients,
    StepTimes,
    attention_work,
    decode_step_seconds,
    fit_step_time,
    prefill_seconds,
    queue_seconds,
)
from shared.cluster_messages import StepSample

TRUE = StepCoefficients(base_s=0.01, per_token_s=4e-4, per_attention_s=2e-7)


def synthetic(
    coef: StepCoefficients, count: int, seed: int = 1, noise: float = 0.0
) -> list[StepSample]:
    """Steps of 1 to 2048 tokens (log-uniform, as decode and prefill steps mix) timed by
    ``coef``, each off by up to ``noise`` (relative)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        seqs, tokens, context = (
            rng.randint(1, 8),
            int(2 ** rng.uniform(0, 11)),
            rng.randint(0, 4096),
        )
        seconds = coef.step_seconds(seqs, tokens, context) * (1 + rng.uniform(-noise, noise))
        out.append(StepSample(seqs, tokens, context, seconds))
    return out


def close(a: StepCoefficients, b: StepCoefficients, rel: float) -> bool:
    return all(
        math.isclose(x, y, rel_tol=rel) for x, y in zip(a.as_tuple(), b.as_tuple(), strict=True)
    )


def test_attention_work_of_a_prefill_chunk_and_a_decode_batch() -> None:
    assert attention_work(1, 100, 50) == 100 * (50 + 50)
    # Eight sequences decoding one token each over 800 cached tokens in all.
    assert attention_work(8, 8, 800) == 800 + 4


def test_the_fit_recovers_known_coefficients() -> None:
    assert close(fit_step_time(synthetic(TRUE, 256), DEFAULT_PRIOR), TRUE, rel=0.01)


def test_the_fit_tolerates_noise() -> None:
    fitted = fit_step_time(synthetic(TRUE, 256, noise=0.1), DEFAULT_PRIOR)
    for tokens in (1, 32, 512, 2048):
        want = TRUE.step_seconds(1, tokens, 1000)
        assert math.isclose(fitted.step_seconds(1, tokens, 1000), want, rel_tol=0.1)


def test_without_samples_the_prior_stands() -> None:
    assert fit_step_time([], DEFAULT_PRIOR) == DEFAULT_PRIOR
    bad = [StepSample(1, 10, 0, float("nan")), StepSample(1, 10, 0, -1.0)]
    assert fit_step_time(bad, DEFAULT_PRIOR) == DEFAULT_PRIOR


def test_coefficients_are_never_negative() -> None:
    # Bigger steps measured faster: a plain least squares would give a negative slope.
    samples = [StepSample(1, n, 0, 2.0 - 0.0009 * n) for n in range(1, 2000, 50)]
    fitted = fit_step_time(samples, DEFAULT_PRIOR)
    assert min(fitted.as_tuple()) >= 0
    assert fitted.per_token_s == 0 and fitted.per_attention_s == 0
    mean = sum(s.seconds for s in samples) / len(samples)
    assert math.isclose(fitted.base_s, mean, rel_tol=0.01)


def test_samples_of_one_size_fit_that_size_and_keep_the_priors_shape() -> None:
    fitted = fit_step_time([StepSample(1, 512, 0, 1.3)] * 50, DEFAULT_PRIOR)
    assert math.isclose(fitted.step_seconds(1, 512, 0), 1.3, rel_tol=1e-3)
    # The undetermined split between base and per-token cost follows the prior: a smaller
    # step is cheaper, not the same (an intercept-only fit) nor free.
    assert 0.05 < fitted.step_seconds(1, 32, 0) < 0.5
    assert min(fitted.as_tuple()) > 0


def test_short_steps_of_a_node_faster_than_the_prior_keep_a_per_token_cost() -> None:
    # A prefill node that has only run one short prompt, ten times faster than the prior
    # says: the split between base and per-token cost is open, and pulled towards the prior
    # as it stands, non-negativity would put it all in the base and price a long prompt like
    # a short one (and prefilling it beside a decode's streams as free).
    short = StepSample(1, 15, 0, DEFAULT_PRIOR.step_seconds(1, 15, 0) / 10)
    fitted = fit_step_time([short] * 9, DEFAULT_PRIOR)
    assert fitted.per_token_s > 0
    long_s = fitted.step_seconds(1, 1260, 0)
    want = DEFAULT_PRIOR.step_seconds(1, 1260, 0) / 10
    assert want / 2 < long_s < want * 2


def test_moments_remove_what_they_added() -> None:
    m = Moments()
    m.add((1.0, 2.0, 3.0), 4.0)
    m.add((1.0, 5.0, 6.0), 7.0)
    m.add((1.0, 2.0, 3.0), 4.0, sign=-1)
    only = Moments()
    only.add((1.0, 5.0, 6.0), 7.0)
    assert m == only
    assert fit(Moments(), (1.0, 2.0, 3.0), 1e-3) == [1.0, 2.0, 3.0]


def test_a_node_with_enough_samples_uses_its_own_fit() -> None:
    times = StepTimes(min_samples=16)
    times.add("fast", "prefill", synthetic(TRUE, 64))
    slow = StepCoefficients(0.05, 4e-3, 2e-6)
    times.add("slow", "prefill", synthetic(slow, 64, seed=2))
    assert close(times.coefficients("fast", "prefill"), TRUE, rel=0.01)
    assert close(times.coefficients("slow", "prefill"), slow, rel=0.01)


def test_a_new_node_borrows_the_pooled_fit_of_its_role() -> None:
    times = StepTimes(min_samples=16)
    assert times.coefficients("new", "prefill") == DEFAULT_PRIOR
    times.add("old", "prefill", synthetic(TRUE, 64))
    times.add("new", "prefill", synthetic(TRUE, 3, seed=5))
    assert close(times.coefficients("new", "prefill"), TRUE, rel=0.01)
    # Pools are per role: a decode node learns nothing from prefill nodes.
    assert times.coefficients("d", "decode") == DEFAULT_PRIOR


def test_the_window_slides_and_fits_follow_new_samples() -> None:
    times = StepTimes(window=32, min_samples=8)
    times.add("n", "prefill", synthetic(TRUE, 100))
    assert times.num_samples("n") == 32
    assert close(times.coefficients("n", "prefill"), TRUE, rel=0.01)
    slower = StepCoefficients(0.02, 8e-4, 4e-7)
    times.add("n", "prefill", synthetic(slower, 32, seed=3))
    assert close(times.coefficients("n", "prefill"), slower, rel=0.01)
    times.forget("n")
    assert times.num_samples("n") == 0
    assert times.coefficients("n", "prefill") == DEFAULT_PRIOR


def test_evicted_samples_leave_the_running_sums() -> None:
    times = StepTimes(window=32, min_samples=4)
    old = synthetic(StepCoefficients(5.0, 1e-2, 1e-5), 32, seed=7)
    new = synthetic(TRUE, 16, seed=8)
    times.add("n", "prefill", old)
    times.add("n", "prefill", new)
    want = fit_step_time(old[16:] + new, DEFAULT_PRIOR)
    assert close(times.coefficients("n", "prefill"), want, rel=1e-6)
    for seed in range(50):  # many windows later, only the last 32 samples count
        times.add("n", "prefill", synthetic(StepCoefficients(5.0, 1e-2, 1e-5), 7, seed=seed))
    times.add("n", "prefill", synthetic(TRUE, 32, seed=9))
    assert close(times.coefficients("n", "prefill"), TRUE, rel=0.01)


def test_prefill_time_sums_the_chunks() -> None:
    coef = StepCoefficients(0.01, 1e-3, 1e-6)
    tokens, context, chunk = 5000, 300, 2048
    by_step, done = 0.0, 0
    while done < tokens:
        n = min(chunk, tokens - done)
        by_step += coef.step_seconds(1, n, context + done)
        done += n
    assert prefill_seconds(coef, tokens, context, chunk) == pytest.approx(by_step)
    assert prefill_seconds(coef, 0, 100, chunk) == 0.0


def test_queue_time_prices_full_steps() -> None:
    coef = StepCoefficients(0.01, 1e-3, 1e-6)
    assert queue_seconds(coef, 0, 512) == 0.0
    want = 2 * coef.step_seconds(1, 512, 0) + coef.step_seconds(1, 100, 0)
    assert queue_seconds(coef, 1124, 512) == pytest.approx(want)


def test_decode_steps_slow_with_batch_and_context() -> None:
    coef = StepCoefficients(0.05, 1e-2, 1e-6)
    assert decode_step_seconds(coef, 1, 100) < decode_step_seconds(coef, 8, 100)
    assert decode_step_seconds(coef, 8, 100) < decode_step_seconds(coef, 8, 100_000)
    assert decode_step_seconds(coef, 4, 1000) == pytest.approx(0.05 + 0.04 + 1e-6 * 1002)
