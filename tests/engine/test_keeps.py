"""A request's keep on a tiny engine: its prompt blocks stay through a burst that evicts an
unkept prompt, end on their time or a drop; and the tokens a request newly cached are counted
as the read and write switches say."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from shared.engine.engine import LLMEngine
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory

PLAIN = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def prompt(seed: int, length: int = 24) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(length)]


def cached_blocks(engine: LLMEngine, tokens: list[int]) -> int:
    """How many of the prompt's leading full blocks the pool still caches."""
    hashes = engine.exchange.prompt_hashes(tokens, b"")
    return engine.exchange.num_leading_cached(hashes)


def burst(engine: LLMEngine) -> None:
    """Enough other prompts to cycle the whole pool."""
    engine.generate([prompt(1000 + i) for i in range(8)], PLAIN)


@pytest.mark.parametrize("keep", ["ttl", "pin"])
def test_a_kept_prompt_survives_a_burst_that_evicts_an_unkept_one(
    make_engine: EngineFactory, keep: str
) -> None:
    engine = make_engine(num_kv_blocks=24)
    kept, plain = prompt(1), prompt(2)
    params = dataclasses.replace(PLAIN, keep=keep, keep_ttl_s=600.0 if keep == "ttl" else 0.0)
    engine.generate([kept], params)
    engine.generate([plain], PLAIN)
    burst(engine)
    assert cached_blocks(engine, kept) == 5  # every block before the last token's
    assert cached_blocks(engine, plain) == 0
    again = engine.generate([kept], PLAIN)[0]
    assert again.num_cached_tokens >= 20


def test_a_keep_ends_on_its_time(make_engine: EngineFactory) -> None:
    engine = make_engine(num_kv_blocks=24)
    kept = prompt(1)
    engine.generate([kept], dataclasses.replace(PLAIN, keep="ttl", keep_ttl_s=0.2))
    assert len(engine.keeps) == 6  # all 24 tokens: six full blocks
    time.sleep(0.3)
    burst(engine)
    assert len(engine.keeps) == 0
    assert cached_blocks(engine, kept) == 0


def test_a_drop_releases_the_prompts_keeps(make_engine: EngineFactory) -> None:
    engine = make_engine(num_kv_blocks=24)
    kept = prompt(1)
    engine.generate([kept], dataclasses.replace(PLAIN, keep="pin"))
    engine.generate([kept], dataclasses.replace(PLAIN, keep="drop"))
    assert len(engine.keeps) == 0
    burst(engine)
    assert cached_blocks(engine, kept) == 0


def test_written_tokens_follow_the_read_and_write_switches(make_engine: EngineFactory) -> None:
    engine = make_engine()
    tokens = prompt(3, length=26)  # 6 full blocks of the prompt, 2 tokens into the 7th
    long_answer = dataclasses.replace(PLAIN, max_tokens=8)
    first = engine.generate([tokens], long_answer)[0]
    # 33 of the 34 tokens are computed (the last output's KV never is): 8 full blocks, the
    # 7th holding 2 prompt tokens and 2 outputs, the 8th 4 outputs.
    assert (first.num_prompt_tokens_written, first.num_output_tokens_written) == (26, 6)
    again = engine.generate([tokens], PLAIN)[0]
    assert (again.num_prompt_tokens_written, again.num_output_tokens_written) == (0, 0)
    unread = engine.generate([tokens], dataclasses.replace(PLAIN, cache_read=False))[0]
    assert unread.num_cached_tokens == 0
    assert unread.num_prompt_tokens_written == 0  # computed again, but cached already
    fresh = prompt(4, length=26)
    unwritten = engine.generate([fresh], dataclasses.replace(long_answer, cache_write=False))[0]
    assert (unwritten.num_prompt_tokens_written, unwritten.num_output_tokens_written) == (0, 0)
    assert cached_blocks(engine, fresh) == 0
