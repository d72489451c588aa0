"""Staging: read-up blocks served by token until released or expired, within a byte budget."""

from __future__ import annotations

import random

from services.tierd.staging import Staging
from shared.kv.block_file import BlockHeader
from tests.tierd.blocks import make_block


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def blocks(*sizes: int) -> list[tuple[BlockHeader, bytearray]]:
    return [(h, bytearray(p)) for h, p in (make_block(size) for size in sizes)]


def test_a_pin_is_served_by_its_token_until_released() -> None:
    staging = Staging(capacity_bytes=1_000, ttl_s=30)
    read = blocks(100, 200)
    staged = staging.stage(read)
    assert staged.headers == [h for h, _ in read]
    assert staged.num_bytes == 300 == staging.used_bytes
    assert staging.room() == 700 and len(staging) == 1
    got = staging.provide(staged.token, [1, 0])
    assert got is not None
    assert [bytes(b) for b in got] == [bytes(read[1][1]), bytes(read[0][1])]
    assert staging.provide(staged.token, []) == []
    assert staging.release(staged.token) is True
    assert staging.provide(staged.token, [0]) is None
    assert staging.release(staged.token) is False
    assert staging.used_bytes == 0 and staging.room() == 1_000 and len(staging) == 0


def test_only_the_right_token_and_ids_are_served() -> None:
    staging = Staging(capacity_bytes=1_000, ttl_s=30)
    first, second = staging.stage(blocks(10, 10)), staging.stage(blocks(10))
    assert first.token != second.token and len(first.token) >= 32
    assert staging.provide("not-a-token", [0]) is None
    assert staging.provide(first.token, [2]) is None
    assert staging.provide(first.token, [-1]) is None
    assert staging.provide(second.token, [0, 1]) is None  # one bad id refuses the whole pull
    assert staging.provide(second.token, [0]) is not None
    staging.release(first.token)
    assert staging.provide(second.token, [0]) is not None  # other pins are untouched


def test_a_pin_expires_after_its_ttl() -> None:
    clock = Clock()
    staging = Staging(capacity_bytes=1_000, ttl_s=30, clock=clock)
    early = staging.stage(blocks(100))
    clock.now += 20
    late = staging.stage(blocks(50))
    assert early.expires_at == 1_030 and late.expires_at == 1_050
    clock.now = 1_030  # the last moment it is served
    assert staging.provide(early.token, [0]) is not None
    assert staging.expire() == 0
    clock.now = 1_030.5
    assert staging.provide(early.token, [0]) is None  # expired, even before expire() runs
    assert staging.provide(late.token, [0]) is not None
    assert staging.expire() == 1
    assert staging.used_bytes == 50 and len(staging) == 1
    assert staging.release(early.token) is False
    clock.now = 2_000
    assert staging.expire() == 1 and staging.used_bytes == 0 and len(staging) == 0


def test_a_pin_takes_only_the_leading_blocks_that_fit() -> None:
    staging = Staging(capacity_bytes=100, ttl_s=30)
    read = blocks(40, 40, 40)
    staged = staging.stage(read)
    assert staged.headers == [read[0][0], read[1][0]]
    assert staging.provide(staged.token, [2]) is None
    assert staging.used_bytes == 80 and staging.room() == 20
    # A chain is cut at the first block that does not fit, even if a later one would.
    cut = staging.stage(blocks(30, 10))
    assert cut.headers == [] and cut.num_bytes == 0
    assert staging.provide(cut.token, []) is None  # a pin of nothing is not kept
    assert len(staging) == 1 and staging.used_bytes == 80
    exact = staging.stage(blocks(20))
    assert len(exact.headers) == 1 and staging.room() == 0
    staging.release(staged.token)
    assert staging.room() == 80


def test_bytes_in_use_stay_exact_and_within_capacity() -> None:
    rng = random.Random(3)
    clock = Clock()
    staging = Staging(capacity_bytes=4_096, ttl_s=5, clock=clock)
    live: dict[str, int] = {}
    expiry: dict[str, float] = {}
    for _ in range(500):
        action = rng.random()
        if action < 0.5:
            staged = staging.stage(blocks(*(rng.choice([64, 512, 1_024]) for _ in range(3))))
            if staged.headers:
                live[staged.token] = staged.num_bytes
                expiry[staged.token] = staged.expires_at
        elif action < 0.8 and live:
            token = rng.choice(sorted(live))
            assert staging.release(token) is True
            del live[token]
        else:
            clock.now += rng.choice([0.5, 2, 6])
            gone = [t for t in live if expiry[t] < clock.now]
            assert staging.expire() == len(gone)
            for token in gone:
                del live[token]
        assert staging.used_bytes == sum(live.values()) <= staging.capacity_bytes
        assert len(staging) == len(live)
