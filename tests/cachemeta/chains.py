"""Block chains for the cachemeta tests, hashed the way nodes hash them."""

from __future__ import annotations

from shared.kv.hashing import hash_full_blocks, root_hash
from shared.rpc.types import BlockRecord

BLOCK_SIZE = 4
ROOT = root_hash("test-model", BLOCK_SIZE, "float32", b"tenant")


def chain(token_ids: list[int], root: bytes = ROOT, num_bytes: int = 4096) -> list[BlockRecord]:
    """The full blocks of a token sequence, first block first."""
    hashes = hash_full_blocks(token_ids, BLOCK_SIZE, root)
    parents = [root, *hashes[:-1]]
    return [
        BlockRecord(
            block_hash=h,
            parent_hash=p,
            token_ids=token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE],
            num_bytes=num_bytes,
            checksum=(2**64 - 1 - i) if i % 2 else i,  # both halves of the uint64 range
        )
        for i, (h, p) in enumerate(zip(hashes, parents, strict=True))
    ]


def hashes(blocks: list[BlockRecord]) -> list[bytes]:
    return [b.block_hash for b in blocks]
