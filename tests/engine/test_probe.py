"""A node's start-up measurement of its speed: real step samples, no trace in the cache or in
the counters."""

from __future__ import annotations

import dataclasses

from shared.engine.probe import AUTO_PROBE_TOKENS, PROBE_FROM_WEIGHTS, probe_speed, probe_tokens
from shared.engine.types import PROMPT_STEP_TOKENS
from shared.model.config import ModelConfig
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


def test_unset_the_probe_is_sized_by_the_model(make_real_engine: RealEngineFactory) -> None:
    """SmolLM2-135M stays unprobed (its nodes start together in the tests and the overload
    benchmark); a model past the threshold is timed; a setting always wins."""
    engine = make_real_engine()
    assert engine.runner.model.config.weights_per_token < PROBE_FROM_WEIGHTS
    assert probe_tokens(engine, None) == 0
    assert probe_tokens(engine, 32) == 32
    model = engine.runner.model
    small = model.config
    big = dataclasses.replace(small, num_layers=120)
    assert big.weights_per_token >= PROBE_FROM_WEIGHTS
    model.config = big  # the session's model, shared: put back below
    try:
        assert probe_tokens(engine, None) == AUTO_PROBE_TOKENS
        assert probe_tokens(engine, 0) == 0
    finally:
        model.config = small


def test_weights_per_token_of_a_llama_8b_shape() -> None:
    """Llama 3 8B multiplies about 7.5 G weights a token (its 8.0 G less the embedding)."""
    config = ModelConfig(
        model_id="llama-8b", vocab_size=128_256, hidden_size=4096, intermediate_size=14_336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
        max_position_embeddings=8192, rope_theta=5e5, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1,
    )  # fmt: skip
    assert 7.4e9 < config.weights_per_token < 7.6e9
