"""The engine on the real model: prefix reuse and batching change no token."""

from __future__ import annotations

import pytest

from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory
from tests.model.prompts import RAW_PROMPTS, long_document

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def test_reused_prefix_gives_the_cold_tokens_and_computes_only_the_suffix(
    tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    document = tokenizer.encode(long_document(7, 600, tokenizer))
    question = tokenizer.encode("\nQuestion: which good was traded most? Answer:")
    prompt = document + question
    cold = make_real_engine().generate([prompt], GREEDY)[0]
    assert cold.num_cached_tokens == 0

    engine = make_real_engine()
    earlier = document + tokenizer.encode("\nSummary:")
    engine.generate([earlier], GREEDY)
    computed_before = engine.stats.prompt_tokens_computed
    warm = engine.generate([prompt], GREEDY)[0]

    # Every token the two prompts share is reused: whole blocks, then the shared part of the
    # block where they part (copied from the earlier request's).
    reused = next(i for i, (a, b) in enumerate(zip(earlier, prompt, strict=False)) if a != b)
    assert reused >= len(document) and reused % 32 != 0
    assert warm.num_cached_tokens == reused > 500
    assert engine.stats.prompt_tokens_computed - computed_before == len(prompt) - reused
    assert warm.output_token_ids == cold.output_token_ids


def test_eight_sequences_in_one_batch_equal_each_alone(
    tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    by_length = {len(tokenizer.encode(t)): t for t in RAW_PROMPTS}
    texts = [*list(by_length.values())[:6], long_document(8, 200, tokenizer)]
    texts.append(long_document(9, 900, tokenizer))
    prompts = [tokenizer.encode(t) for t in texts]
    assert len({len(p) for p in prompts}) == 8
    engine = make_real_engine()
    batched = engine.generate(prompts, GREEDY)
    # All eight decode together from the first decode step to the last.
    assert engine.stats.steps <= GREEDY.max_tokens + 1
    alone = [make_real_engine().generate([p], GREEDY)[0] for p in prompts]
    assert [o.output_token_ids for o in batched] == [o.output_token_ids for o in alone]
