"""Prefix queries in the shape of Mooncake's indexer RFC (kvcache-ai/Mooncake#1403) and
Dynamo's standalone indexer: a prompt as block hashes, or as token ids hashed as Crescent
hashes them, answered per publisher ("instance") and tier. Pure: no I/O.

An answer names each publisher holding the prompt's first block by its role and id
(``subjects.kv_publisher``: the same id under two roles is two publishers)::

    {"num_blocks": 4,
     "instances": {"prefill.prefill-0": {"longest_matched": 96, "matched_blocks": 3,
                                         "complete": true,
                                         "tiers": {"dram": {"blocks": 3, "tokens": 96}}}}}

``tiers`` gives, per tier, the leading blocks held there (what cachemeta's MatchPrefix says of
the same holder); ``longest_matched`` (tokens, Mooncake's name) and ``matched_blocks`` count
the leading blocks held in any of the publisher's tiers. ``complete`` is False while the
index may lack some of the publisher's blocks (it joined late, lost events and waits for the
resend, or dropped its oldest blocks to keep within ``CRESCENT_KVINDEX_MAX_BLOCKS_PER_VIEW``).
Publishers and tiers that hold no leading block are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from services.kvindex.index import Key, PublisherMatch, PublisherView
from shared.kv.hashing import hash_full_blocks, root_hash, scope_salt

#: Most blocks one query names (a 1M-token prompt in blocks of 16).
MAX_QUERY_BLOCKS = 65536
MAX_QUERY_TOKENS = 1 << 20
#: A hash given as hex is at most this many bytes (Crescent's are 16, vLLM's up to 32).
MAX_HASH_BYTES = 64
#: Integer hashes (vLLM's) are 64-bit, signed or not.
INT_HASH_RANGE = (-(1 << 63), (1 << 64) - 1)


def parse_key(value: str | int) -> Key:
    """A hash as the query gives it: hex text becomes bytes, an integer stays one;
    ``ValueError`` for anything else."""
    if isinstance(value, bool):
        raise ValueError("a block hash is hex text or an integer, not a boolean")
    if isinstance(value, int):
        low, high = INT_HASH_RANGE
        if not low <= value <= high:
            raise ValueError(f"integer block hash {value} is outside 64 bits")
        return value
    try:
        key = bytes.fromhex(value)
    except ValueError:
        raise ValueError(f"block hash {value[:80]!r} is not hex") from None
    if not 0 < len(key) <= MAX_HASH_BYTES:
        raise ValueError(f"a hex block hash holds 1 to {MAX_HASH_BYTES} bytes, not {len(key)}")
    return key


def scope_root(
    secret: str, model: str, block_size: int, kv_dtype: str, tenant: str, cache_salt: str = ""
) -> bytes:
    """The root of the tenant's hash chains, as a node derives it for its requests."""
    salt = scope_salt(secret.encode(), tenant, cache_salt)
    return root_hash(model, block_size, kv_dtype, salt)


def prompt_keys(token_ids: Sequence[int], block_size: int, root: bytes) -> list[Key]:
    """The hashes of the prompt's full blocks (a partial last block is never cached)."""
    return list(hash_full_blocks(token_ids, block_size, root))


def answer(matches: Sequence[PublisherMatch], num_blocks: int) -> dict[str, Any]:
    """The JSON document of a query's matches (the module docstring shows one)."""
    instances = {
        m.publisher: {
            "longest_matched": m.longest.tokens,
            "matched_blocks": m.longest.blocks,
            "complete": m.complete,
            "tiers": {t: {"blocks": tm.blocks, "tokens": tm.tokens} for t, tm in m.tiers.items()},
        }
        for m in matches
    }
    return {"num_blocks": num_blocks, "instances": instances}


def publishers(views: dict[str, PublisherView]) -> dict[str, Any]:
    """The JSON document of what the index holds of each publisher: its epoch, the last frame
    folded, whether it is complete or waiting for a resend, its blocks per tier and how many
    of its oldest blocks were dropped for the cap."""
    return {
        name: {
            "epoch": view.epoch,
            "last_seq": view.last_seq,
            "complete": view.whole,
            "awaiting_resend": view.resent is not None,
            "tiers": {t: len(v.blocks) for t, v in sorted(view.tiers.items())},
            "trimmed": {t: v.trimmed for t, v in sorted(view.tiers.items()) if v.trimmed},
        }
        for name, view in sorted(views.items())
    }
