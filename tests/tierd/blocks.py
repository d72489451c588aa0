"""Blocks for the tierd tests: real chained hashes, payloads and their headers."""

from __future__ import annotations

import functools
import os
import time

from shared.kv.block_file import BlockHeader, Layout
from shared.kv.checksum import BlockChecksum
from shared.kv.hashing import hash_block_tokens, root_hash
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME, S3
from shared.secrets import DEV_CACHE_SECRET

MODEL = "test-model"
BLOCK_SIZE = 4
DTYPE = "float32"
ROOT = root_hash(MODEL, BLOCK_SIZE, DTYPE, b"tierd-tests")


def make_block(
    num_bytes: int = 256,
    parent: bytes = ROOT,
    first_token: int = 0,
    quota_key: bytes = b"",
    payload: bytes | None = None,
    secret: str = DEV_CACHE_SECRET,
) -> tuple[BlockHeader, bytes]:
    """A header and a random payload of ``num_bytes``, chained to ``parent``, its checksum
    keyed by ``secret`` (the stores' own by default)."""
    tokens = tuple(range(first_token, first_token + BLOCK_SIZE))
    data = os.urandom(num_bytes) if payload is None else payload
    header = BlockHeader(
        block_hash=hash_block_tokens(parent, tokens),
        parent_hash=parent,
        token_ids=tokens,
        checksum=_checksum(secret)(data),
        num_bytes=len(data),
        model_id=MODEL,
        block_size=BLOCK_SIZE,
        kv_dtype=DTYPE,
        quota_key=quota_key,
        created_at=time.time(),
    )
    return header, data


@functools.cache
def _checksum(secret: str) -> BlockChecksum:
    return BlockChecksum(secret)


def make_chain(length: int, num_bytes: int = 256, seed: int = 0) -> list[tuple[BlockHeader, bytes]]:
    """``length`` blocks, each the parent of the next."""
    out: list[tuple[BlockHeader, bytes]] = []
    parent = ROOT
    for i in range(length):
        block = make_block(num_bytes, parent, first_token=seed * 100_000 + i * BLOCK_SIZE)
        out.append(block)
        parent = block[0].block_hash
    return out


def layout_of(header: BlockHeader) -> Layout:
    return Layout(header.model_id, header.block_size, header.kv_dtype, header.num_bytes)


#: The keys the stores use by default (the development cache secret's), per tier.
NVME_SEAL = BlockSeal(DEV_CACHE_SECRET, NVME)
S3_SEAL = BlockSeal(DEV_CACHE_SECRET, S3)
