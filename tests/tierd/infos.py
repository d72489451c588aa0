"""Hand-built block metadata for the policy tests: names for hashes, and a small forest."""

from __future__ import annotations

from services.tierd.policy import BlockInfo

ROOT = b"root" + bytes(12)


def h(name: str) -> bytes:
    return name.encode().ljust(16, b".")


def block(
    name: str,
    parent: str | None = None,
    *,
    depth: int = 0,
    last: float = 0.0,
    count: int = 0,
    size: int = 10,
    quota: bytes = b"",
) -> BlockInfo:
    return BlockInfo(
        block_hash=h(name),
        parent_hash=h(parent) if parent else ROOT,
        num_bytes=size,
        depth=depth,
        created_at=0.0,
        last_access=last,
        access_count=count,
        quota_key=quota,
    )


def blocks(*infos: BlockInfo) -> dict[bytes, BlockInfo]:
    return {i.block_hash: i for i in infos}


def names(victims: list[bytes]) -> list[str]:
    return [v.rstrip(b".").decode() for v in victims]


# Two chains: a0 <- a1 <- a2 and a1 <- c2 (a fork), and b0 <- b1.
FOREST = blocks(
    block("a0", depth=0, last=1, count=9),
    block("a1", "a0", depth=1, last=2, count=5),
    block("a2", "a1", depth=2, last=9, count=1),
    block("c2", "a1", depth=2, last=7, count=3),
    block("b0", depth=0, last=3, count=2),
    block("b1", "b0", depth=1, last=4, count=2),
)
