"""A node's start-up measurement of its speed: real step samples, no trace in the cache or in
the counters."""

from __future__ import annotations

from shared.engine.probe import probe_speed
from shared.engine.types import PROMPT_STEP_TOKENS
from tests.conftest import RealEngineFactory


def test_the_probe_leaves_step_samples_and_nothing_else(
    make_real_engine: RealEngineFactory,
) -> None:
    engine = make_real_engine()
    free = engine.pool.num_free_blocks
    # As if the probe had waited for cores (both nodes probe as they start together).
    engine.threads.governor.record(2, 1.0, 0.5)
    assert engine.threads.governor.alone_left > 0
    probe_speed(engine, PROMPT_STEP_TOKENS)
    samples = list(engine.step_timings)
    assert [s.num_tokens for s in samples] == [PROMPT_STEP_TOKENS, 1]  # a prompt, a decode
    assert all(s.seconds > 0 for s in samples)
    assert engine.stats.prompt_token_s > 0
    assert engine.stats.steps == 0 and engine.stats.prompt_tokens_computed == 0
    assert engine.stats.output_tokens == 0
    assert engine.pool.num_cached_blocks == 0 and engine.pool.num_free_blocks == free
    assert not engine.has_unfinished_requests()
    assert engine.threads.governor.alone_left == 0  # that contention is forgotten


def test_no_probe_when_it_is_off(make_real_engine: RealEngineFactory) -> None:
    engine = make_real_engine()
    probe_speed(engine, 0)
    assert not engine.step_timings and engine.stats.prompt_token_s == 0.0
