"""On the real model, a seeded request resumed after k tokens draws the uninterrupted tokens."""

from __future__ import annotations

import dataclasses

import pytest

from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory

pytestmark = pytest.mark.slow
SEEDED = SamplingParams(max_tokens=6, temperature=1.0, seed=2024, ignore_eos=True)


def test_a_resumed_seeded_request_continues_exactly(
    tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    prompt = tokenizer.encode("The three most common trees in the forest are")
    engine = make_real_engine()
    full = engine.generate([prompt], SEEDED)[0].output_token_ids
    assert len(full) == 6
    k = 3
    rest_params = dataclasses.replace(SEEDED, max_tokens=6 - k, output_offset=k)
    rest = make_real_engine().generate([prompt + full[:k]], rest_params)[0].output_token_ids
    assert full[:k] + rest == full
