"""The tiered KV cache end to end: `crescent up --with-s3` with pools small enough to overflow
(96 MB of DRAM per node, 200 MB of NVMe), a real S3 server, and the openai client.

The tests run in order on one stack: a dozen long prompts push the first one's blocks down to
NVMe and S3; asking it again finds them there; damaged copies, a stopped S3 server and
restarted services cost recomputes at worst, never a wrong token or a failed request.
"""

from __future__ import annotations

import os
import random
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from bench.tier_probe import TierProbe, chain_of, tiers_of
from shared.model.tokenizer import Tokenizer
from tests.e2e.conftest import ALICE_KEY, BOB_KEY
from tests.e2e.stack import Stack, collect_logs

pytestmark = pytest.mark.slow

NUM_PROMPTS = 12
PROMPT_WORDS = 900  # about 1,000 tokens: 31 blocks of 32, 46 MB of fp32 KV
BOB_QUOTA_MB = 60
S3_DOWN = "S3 is unavailable"  # tierd's log line when a move to S3 fails
_WORD_TEXT = """
river stone garden window market silver letter engine forest winter copper lantern
harbor meadow thunder pencil marble violin orchard canyon blanket saddle compass feather
glacier hammer island jacket kettle ladder mirror needle oyster pillow quarry ribbon
shadow tunnel valley wagon yarrow zephyr anchor bridge candle desert falcon granite
hollow ivory jungle kingdom lemon mountain nectar ocean prairie quiet rocket summer
timber umbrella velvet walnut canvas butter dragon emerald fountain
"""
WORDS = _WORD_TEXT.split()


def prompt(i: int, tenant: str = "alice", words: int = PROMPT_WORDS) -> str:
    rng = random.Random(f"{tenant}-{i}")
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"{marker(i, tenant)} {body}. Summary:"


def marker(i: int, tenant: str = "alice") -> str:
    return f"Record {tenant} {i:02d} begins."


@dataclass
class Answer:
    text: str
    ttft_s: float
    usage: Any


@dataclass
class TierStack:
    stack: Stack
    probe: TierProbe
    model: str
    cold: dict[int, Answer] = field(default_factory=dict)

    def client(self, key: str = ALICE_KEY) -> OpenAI:
        return OpenAI(base_url=self.stack.base_url, api_key=key, max_retries=0, timeout=300)

    def ask(self, text: str, key: str = ALICE_KEY) -> Answer:
        started = time.perf_counter()
        ttft, parts, usage = 0.0, [], None
        stream = self.client(key).completions.create(
            model=self.model,
            prompt=text,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text and not ttft:
                ttft = time.perf_counter() - started
            parts += [c.text for c in chunk.choices]
            usage = chunk.usage or usage
        return Answer("".join(parts), ttft, usage)


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[TierStack]:
    data_dir = tmp_path_factory.mktemp("tiers")
    env = {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_KV_CACHE_MB": "96",
        "CRESCENT_NVME_CAPACITY_MB": "200",
        "CRESCENT_TENANT_QUOTAS_MB": f"bob={BOB_QUOTA_MB}",
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        # Two busy cores: a lookup that misses its usual 100 ms budget would place the
        # request as if nothing were cached, which is not what these tests are about.
        "CRESCENT_MATCH_TIMEOUT_MS": "2000",
        "CRESCENT_API_KEYS": f"{ALICE_KEY}:alice,{BOB_KEY}:bob",
        # tierd stages a third of a prompt's blocks at a time (31 blocks of 1.4 MB): a prefix
        # coming back from S3 is pinned and pulled in pieces, as a large model's always is.
        "CRESCENT_STAGING_MB": "16",
        # Placements (which holders, which pulls) are logged at debug: a failure shows them.
        "CRESCENT_LOG_LEVEL": "DEBUG",
        # The tiers are read by the prefill node these tests watch, never by a decode node.
        "CRESCENT_LOCAL_PREFILL": "false",
        "UCX_NET_DEVICES": "lo",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }
    stack = Stack.start(data_dir, env, ["--with-s3"])
    try:
        client = OpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0)
        tiers = TierStack(stack, TierProbe(data_dir), client.models.list().data[0].id)
        # Prompts of a few lengths first: fitted to prompts of one length alone (the tests'
        # dozen), the scheduler's step-time model cannot tell a step's fixed cost from its
        # per-token cost, and may price a prompt's last few tokens as dear as all of them,
        # so that pulling its prefix from the tiers looks like no saving.
        for i, words in enumerate((10, 60, 200)):
            tiers.ask(prompt(90 + i, words=words))
        yield tiers
    finally:
        status = stack.stop()
    assert status == 0, collect_logs(data_dir)


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)  # poll interval until the deadline
    raise AssertionError(f"timed out waiting for {what}\n{collect_logs(logs)}")


def tierd_counter(t: TierStack, name: str, **labels: str) -> float:
    """The sum of tierd's samples called ``name`` that carry ``labels``."""
    with urllib.request.urlopen(t.probe.where["tierd_metrics"], timeout=5) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def placements(t: TierStack) -> str:
    """Why a prompt was or was not fetched from the tiers: the scheduler's last placements
    (holders, pulls, predicted TTFT, bandwidths) and the prefill nodes' pull warnings."""
    logs = t.probe.data_dir / "logs"
    lines = []
    for log in sorted(logs.glob("scheduler*.log")):
        lines += [ln for ln in log.read_text(errors="replace").splitlines() if " placing " in ln][
            -3:
        ]
    for log in sorted(logs.glob("prefill*.log")):
        text = log.read_text(errors="replace").splitlines()
        lines += [ln for ln in text if "pin" in ln or "pull" in ln or "direct" in ln][-10:]
    return "\n".join(lines)


def below_dram(t: TierStack, i: int, tokenizer: Tokenizer) -> tuple[list[bytes], dict[str, int]]:
    nvme, s3 = t.probe.nvme_headers(), t.probe.s3_headers()
    chain = chain_of(marker(i), nvme | s3, tokenizer)
    return chain, tiers_of(chain, set(nvme), set(s3))


def test_a_dozen_long_prompts_send_the_first_down_to_nvme_and_s3(
    tiers: TierStack, tokenizer: Tokenizer
) -> None:
    for i in range(NUM_PROMPTS):
        tiers.cold[i] = tiers.ask(prompt(i))
    full_blocks = tiers.cold[0].usage.prompt_tokens // 32

    def first_prompt_below() -> bool:
        chain, where = below_dram(tiers, 0, tokenizer)
        return len(chain) >= full_blocks and where["s3"] > 0

    wait_for("the first prompt in S3", first_prompt_below, 120, tiers.probe.data_dir)
    chain, where = below_dram(tiers, 0, tokenizer)
    assert where["nvme"] + where["s3"] >= full_blocks, where
    # The catalogue lists each copy where it is, under the host's tierd.
    rows = tiers.probe.rows()
    tierd = tiers.probe.where["tierd_id"]
    nvme, s3 = set(tiers.probe.nvme_headers()), set(tiers.probe.s3_headers())
    for block_hash in chain[:full_blocks]:
        for tier, held in (("nvme", nvme), ("s3", s3)):
            assert ((block_hash, tierd, tier) in rows) == (block_hash in held), (tier, where)
    assert len(nvme) > 0  # the newer prompts fill NVMe


def test_the_first_prompt_again_is_served_from_below_dram(tiers: TierStack) -> None:
    cold = tiers.cold[0]
    warm = tiers.ask(prompt(0))
    assert warm.text == cold.text
    details = warm.usage.prompt_tokens_details
    cached = details.cached_tokens
    by_tier = details.model_extra["cached_tokens_by_tier"]
    assert set(by_tier) == {"dram", "nvme", "s3"}
    assert sum(by_tier.values()) == cached
    # Messages as one string: pytest would shorten a tuple's repr, and with it the log lines.
    assert cached >= 0.8 * warm.usage.prompt_tokens, f"{details}\n{placements(tiers)}"
    assert by_tier["nvme"] + by_tier["s3"] >= 0.8 * cached, f"{by_tier}\n{placements(tiers)}"
    assert warm.ttft_s < cold.ttft_s, (warm.ttft_s, cold.ttft_s)


def _prompt_held_in(tiers: TierStack, tier: str, tokenizer: Tokenizer) -> tuple[int, bytes]:
    """An alice prompt (not in DRAM) with a block held only in ``tier``; that block."""
    nvme, s3 = tiers.probe.nvme_headers(), tiers.probe.s3_headers()
    dram = {h for h, _, t in tiers.probe.rows() if t == "dram"}
    only = set(nvme) - set(s3) if tier == "nvme" else set(s3) - set(nvme)
    for i in range(1, NUM_PROMPTS):
        chain = chain_of(marker(i), nvme | s3, tokenizer)
        if len(chain) >= 4 and not dram & set(chain) and chain[2] in only:
            return i, chain[2]
    raise AssertionError(f"no prompt has a block only in {tier}")


def _prompt_below_dram(tiers: TierStack, tokenizer: Tokenizer) -> int:
    """An alice prompt none of whose blocks is in a pool and most of whose chain is in NVMe or
    S3 (the damaged-copy tests may have cut some chains short)."""
    nvme, s3 = tiers.probe.nvme_headers(), tiers.probe.s3_headers()
    dram = {h for h, _, t in tiers.probe.rows() if t == "dram"}
    full_blocks = tiers.cold[1].usage.prompt_tokens // 32
    for i in range(1, NUM_PROMPTS):
        chain = chain_of(marker(i), nvme | s3, tokenizer)
        if len(chain) >= 0.8 * full_blocks and not dram & set(chain):
            return i
    raise AssertionError("no prompt is wholly below DRAM")


@pytest.mark.parametrize("tier", ["nvme", "s3"])
def test_a_flipped_byte_costs_a_recompute_not_a_wrong_token(
    tiers: TierStack, tokenizer: Tokenizer, tier: str
) -> None:
    i, block_hash = _prompt_held_in(tiers, tier, tokenizer)
    before = tiers.probe.corrupt_blocks(tier)
    (tiers.probe.flip_nvme if tier == "nvme" else tiers.probe.flip_s3)(block_hash)
    again = tiers.ask(prompt(i))
    assert again.text == tiers.cold[i].text
    wait_for(
        f"the {tier} corruption counted",
        lambda: tiers.probe.corrupt_blocks(tier) > before,
        10,
        tiers.probe.data_dir,
    )
    # The damaged copy is gone; a listed one is a fresh, intact copy of the recomputed block.
    if (block_hash, tiers.probe.where["tierd_id"], tier) in tiers.probe.rows():
        assert tiers.probe.intact(block_hash, tier)


def test_a_stopped_s3_server_loses_nothing_and_moves_resume(tiers: TierStack) -> None:
    s3_pid = tiers.stack.children()["s3"]
    files_before = set(tiers.probe.nvme_headers())
    objects_before = len(tiers.probe.s3_keys())
    outages = tiers.stack.log("tierd").count(S3_DOWN)
    os.kill(s3_pid, signal.SIGSTOP)
    try:
        for i in range(3):
            answer = tiers.ask(prompt(100 + i))
            assert answer.text and answer.usage.completion_tokens > 0
        wait_for(
            "tierd to find S3 unavailable",
            lambda: tiers.stack.log("tierd").count(S3_DOWN) > outages,
            60,
            tiers.probe.data_dir,
        )
        # Nothing left NVMe while S3 could not take it.
        assert files_before <= set(tiers.probe.nvme_headers())
    finally:
        os.kill(s3_pid, signal.SIGCONT)
    wait_for(
        "tierd moving blocks to S3 again",
        lambda: len(tiers.probe.s3_keys()) > objects_before,
        60,
        tiers.probe.data_dir,
    )


def test_tierd_and_cachemeta_restarted_still_find_the_tiers(
    tiers: TierStack, tokenizer: Tokenizer
) -> None:
    i = _prompt_below_dram(tiers, tokenizer)
    tierd = tiers.probe.where["tierd_id"]
    before = tiers.probe.node_row(tierd)
    for name in ("tierd", "cachemeta"):
        old = tiers.stack.kill(name)
        tiers.stack.wait_replaced(name, old)

    def listed_again() -> bool:
        # The new tierd has joined (a new epoch, its tiers resynced) and lists the prompt.
        row = tiers.probe.node_row(tierd)
        if row is None or row == before or row[1]:
            return False
        chain, _ = below_dram(tiers, i, tokenizer)
        rows = tiers.probe.rows()
        listed = {h for h, holder, t in rows if holder == tierd and t in ("nvme", "s3")}
        return bool(chain) and set(chain) <= listed

    wait_for("the tiers listed again", listed_again, 60, tiers.probe.data_dir)
    again = tiers.ask(prompt(i))
    assert again.text == tiers.cold[i].text
    by_tier = again.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]
    below = by_tier["nvme"] + by_tier["s3"]
    assert below >= 0.5 * again.usage.prompt_tokens, f"{by_tier}\n{placements(tiers)}"


def test_a_restarted_node_gets_its_prefixes_back_from_the_tiers(
    tiers: TierStack, tokenizer: Tokenizer
) -> None:
    i = _prompt_below_dram(tiers, tokenizer)
    old = tiers.stack.kill("prefill-0")
    tiers.stack.wait_replaced("prefill-0", old)
    deadline = time.monotonic() + 180
    while True:  # until the node is back: till then the stack answers 503, as it should
        try:
            again = tiers.ask(prompt(i))
            break
        except openai.InternalServerError:
            assert time.monotonic() < deadline, collect_logs(tiers.probe.data_dir)
            time.sleep(1)  # poll interval until the deadline
    assert again.text == tiers.cold[i].text
    by_tier = again.usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]
    below = by_tier["nvme"] + by_tier["s3"]
    assert below >= 0.5 * again.usage.prompt_tokens, f"{by_tier}\n{placements(tiers)}"


def test_a_tenant_over_its_quota_evicts_its_own_blocks_only(
    tiers: TierStack, tokenizer: Tokenizer
) -> None:
    def stored() -> dict[bytes, set[bytes]]:
        """Block hashes below DRAM by quota key."""
        out: dict[bytes, set[bytes]] = {}
        for h in (tiers.probe.nvme_headers() | tiers.probe.s3_headers()).values():
            out.setdefault(h.quota_key, set()).add(h.block_hash)
        return out

    def turned_away() -> float:
        """Blocks tierd evicted or refused to keep a tenant within its quota."""
        evicted = tierd_counter(tiers, "crescent_tierd_deleted_blocks_total", reason="quota")
        return evicted + tierd_counter(tiers, "crescent_tierd_refused_blocks_total")

    before = stored()
    away = turned_away()
    block_bytes = next(iter(tiers.probe.nvme_headers().values())).num_bytes
    # Bob sends far more than his quota of blocks.
    computed = 0
    for i in range(4):
        computed += tiers.ask(prompt(i, "bob", words=600), BOB_KEY).usage.prompt_tokens // 32
    wait_for(
        "tierd to keep some of bob's blocks and turn others away",
        lambda: len(stored()) > len(before) and turned_away() > away,
        120,
        tiers.probe.data_dir,
    )
    after = stored()
    bob = [k for k in after if k not in before]
    assert len(bob) == 1, list(after)
    kept = len(after[bob[0]])
    assert 0 < kept * block_bytes <= BOB_QUOTA_MB * 2**20 < computed * block_bytes
    # Bob's older blocks made room for his newer ones; alice kept every block she had.
    for key, blocks in before.items():
        assert blocks <= after[key], "another tenant's blocks were evicted"
