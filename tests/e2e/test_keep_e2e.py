"""Cache control end to end: `crescent up` with pools of 22 blocks, the real model and the openai
client's ``extra_body``. A pinned prompt stays in DRAM through a burst that evicts an unkept
one; a keep with a TTL and a dropped keep do not; the keep quota refuses a keep with OpenAI's
429 ``insufficient_quota`` until a keep is dropped; usage reports the tokens a request newly
cached.

The tests run in order on one stack. Prompts are token ids (4 full blocks of 32 and 5 tokens),
so every count is exact, and ask for one token, so they end on the prefill node whose pool the
tests press on.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from bench.tier_probe import TierProbe
from tests.e2e.conftest import ALICE_KEY
from tests.e2e.stack import Stack, collect_logs

pytestmark = pytest.mark.slow

BLOCK = 32
FULL_BLOCKS = 4
PROMPT_TOKENS = FULL_BLOCKS * BLOCK + 5
QUOTA_BLOCKS = 10  # two kept prompts fit, a third does not
TTL_S = 1.0
BURST = 6  # 24 blocks: more than the 22 - 4 a pool has for anything unkept


def tokens(name: str) -> list[int]:
    """A prompt of ``PROMPT_TOKENS`` ids of ordinary words, its own from the first block."""
    rng = random.Random(name)
    return [rng.randrange(1000, 40_000) for _ in range(PROMPT_TOKENS)]


class KeepStack:
    """The stack and its client; remembers when each keep with a TTL was asked for."""

    def __init__(self, stack: Stack, data_dir: Path) -> None:
        self.stack = stack
        self.data_dir = data_dir
        self.client = OpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=300)
        self.model = self.client.models.list().data[0].id
        self.ttl_asked_at = 0.0

    def ask(self, name: str, **cache_control: Any) -> Any:
        """Completes the prompt ``name`` with ``cache_control``; returns its usage."""
        extra = {"cache_control": cache_control} if cache_control else None
        answer = self.client.completions.create(
            model=self.model, prompt=tokens(name), max_tokens=1, temperature=0, extra_body=extra
        )
        assert answer.usage is not None
        return answer.usage


def from_dram(usage: Any) -> int:
    by_tier = usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]
    return int(by_tier["dram"])


def written(usage: Any) -> tuple[int, int]:
    prompt = usage.prompt_tokens_details.cache_write_tokens  # OpenAI's field
    completion = usage.completion_tokens_details.model_extra["cache_write_tokens"]
    return int(prompt), int(completion)


@pytest.fixture(scope="module")
def keeps(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[KeepStack]:
    data_dir = tmp_path_factory.mktemp("keeps")
    env = {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_KV_CACHE_MB": "32",  # 22 blocks a pool: kept blocks may hold 11 of them
        "CRESCENT_KEEP_QUOTA_BLOCKS": str(QUOTA_BLOCKS),
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        "CRESCENT_MATCH_TIMEOUT_MS": "2000",
        "CRESCENT_API_KEYS": f"{ALICE_KEY}:alice",
        # Every prompt is computed on the prefill node, whose pool the tests press on.
        "CRESCENT_LOCAL_PREFILL": "false",
        "UCX_NET_DEVICES": "lo",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }
    stack = Stack.start(data_dir, env)
    try:
        yield KeepStack(stack, data_dir)
    finally:
        status = stack.stop()
    assert status == 0, collect_logs(data_dir)


def test_usage_reports_the_tokens_a_request_newly_cached(keeps: KeepStack) -> None:
    first = keeps.ask("written")
    assert first.prompt_tokens == PROMPT_TOKENS
    # Every full block of the prompt; the last one (5 prompt tokens) never fills.
    assert written(first) == (FULL_BLOCKS * BLOCK, 0)
    assert written(keeps.ask("written")) == (0, 0)  # all of it was cached already
    assert written(keeps.ask("unwritten", write=False)) == (0, 0)
    # Not cached, so asked again it is computed again.
    assert keeps.ask("unwritten").prompt_tokens_details.cached_tokens == 0


def test_keeps_within_the_quota_and_one_over_it(keeps: KeepStack) -> None:
    assert written(keeps.ask("pinned", keep="pin"))[0] == FULL_BLOCKS * BLOCK
    keeps.ask("second", keep="pin")
    with pytest.raises(openai.RateLimitError) as refused:
        keeps.ask("over", keep={"ttl_s": 600})  # 4 + 4 kept, 4 more would make 12 of 10
    error = refused.value
    assert error.code == "insufficient_quota"
    assert error.body["param"] == "cache_control.keep"  # type: ignore[index]
    assert f"quota of {QUOTA_BLOCKS} kept blocks" in error.message
    assert error.response.headers["x-should-retry"] == "false"


def test_a_drop_frees_the_quota_and_keeps_end_on_their_time(keeps: KeepStack) -> None:
    keeps.ask("second", keep={"ttl_s": 0})
    keeps.ask("over", keep={"ttl_s": 600})  # 4 + 4 of 10 now
    keeps.ask("over", keep={"ttl_s": 0})
    keeps.ttl_asked_at = time.monotonic()
    keeps.ask("timed", keep={"ttl_s": TTL_S})
    keeps.ask("control")
    # The keep's TTL must run out: time the scenario needs (nothing shows its end but the
    # eviction the next test looks for), not synchronisation.
    time.sleep(max(keeps.ttl_asked_at + TTL_S + 0.5 - time.monotonic(), 0))


def test_a_pinned_prompt_stays_in_dram_through_a_burst_and_the_others_do_not(
    keeps: KeepStack,
) -> None:
    for i in range(BURST):
        keeps.ask(f"burst-{i}")
    pinned = keeps.ask("pinned")
    details = pinned.prompt_tokens_details
    assert from_dram(pinned) == details.cached_tokens >= FULL_BLOCKS * BLOCK, details
    for name in ("control", "timed", "second", "over"):  # unkept, ended, dropped twice
        usage = keeps.ask(name)
        assert from_dram(usage) < FULL_BLOCKS * BLOCK, (name, usage.prompt_tokens_details)


def test_the_pinned_blocks_went_down_to_nvme_and_the_ledger_keeps_them(keeps: KeepStack) -> None:
    """What a node's death would leave: the kept blocks on the host's NVMe, spared by tierd,
    and the catalogue's ledger naming the same blocks."""
    prompt = tokens("pinned")
    chain = [tuple(prompt[i * BLOCK : (i + 1) * BLOCK]) for i in range(FULL_BLOCKS)]
    on_nvme = {h.token_ids: h.block_hash for h in TierProbe(keeps.data_dir).nvme_headers().values()}
    assert all(tokens_of in on_nvme for tokens_of in chain)
    with sqlite3.connect(keeps.data_dir / "cachemeta.db") as db:
        pinned = {bytes(h) for (h,) in db.execute("SELECT hash FROM keeps WHERE pinned")}
    assert pinned == {on_nvme[t] for t in chain}
