"""Chained content hashes of KV blocks (the checksum of their bytes is ``shared.kv.checksum``).

A block's hash commits to every token before it (through its parent) and to the cache scope
(through the root), so equal hashes mean interchangeable KV contents. Everything here is a pure
function of its arguments: the same inputs give the same hash in every process and on every host.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import sys
from array import array
from collections.abc import Sequence

BlockHash = bytes
HASH_BYTES = 16

# Bumped whenever the encoding below changes, so old and new hashes can never collide.
_ROOT_TAG = b"crescent-kv-root-v1"
_U32_MAX = 2**32 - 1
# array('I') is the fast path; struct is only needed where a C unsigned int is not 4 bytes.
_ARRAY_IS_U32 = array("I").itemsize == 4
_BIG_ENDIAN = sys.byteorder == "big"


def _blake(data: bytes | memoryview, *more: bytes | memoryview) -> BlockHash:
    h = hashlib.blake2b(data, digest_size=HASH_BYTES)
    for chunk in more:
        h.update(chunk)
    return h.digest()


def _field(data: bytes) -> bytes:
    # A length prefix makes the concatenation of fields unambiguous.
    return struct.pack("<Q", len(data)) + data


def root_hash(model_id: str, block_size: int, kv_dtype: str, salt: bytes | str = b"") -> BlockHash:
    """The parent hash of the first block of every sequence in one cache scope.

    ``salt`` is the tenant / cache scope: sequences with different salts never share blocks.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    salt_bytes = salt.encode("utf-8") if isinstance(salt, str) else bytes(salt)
    payload = b"".join(
        (
            _field(_ROOT_TAG),
            _field(model_id.encode("utf-8")),
            _field(struct.pack("<Q", block_size)),
            _field(kv_dtype.encode("utf-8")),
            _field(salt_bytes),
        )
    )
    return _blake(payload)


def _encode_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as packed little-endian uint32."""
    try:
        if not _ARRAY_IS_U32:
            return struct.pack(f"<{len(token_ids)}I", *token_ids)
        packed = array("I", token_ids)
    except (OverflowError, struct.error) as exc:
        bad = next((t for t in token_ids if not 0 <= t <= _U32_MAX), None)
        raise ValueError(f"token id {bad!r} is outside the uint32 range") from exc
    if _BIG_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def _check_parent(parent: BlockHash) -> None:
    if len(parent) != HASH_BYTES:
        raise ValueError(f"a block hash is {HASH_BYTES} bytes, got {len(parent)}")


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The hash of a block holding ``token_ids`` whose predecessor hashes to ``parent``."""
    _check_parent(parent)
    return _blake(parent, _encode_tokens(token_ids))


def _chain(parent: BlockHash, packed: bytes, block_size: int, count: int) -> list[BlockHash]:
    """Hashes ``count`` consecutive blocks of packed tokens, the first one chained to ``parent``."""
    stride = block_size * 4
    view = memoryview(packed)
    out: list[BlockHash] = []
    for i in range(count):
        parent = _blake(parent, view[i * stride : (i + 1) * stride])
        out.append(parent)
    return out


def _check_block_size(block_size: int) -> None:
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")


def hash_full_blocks(token_ids: Sequence[int], block_size: int, root: BlockHash) -> list[BlockHash]:
    """One hash per full block of ``token_ids``; a trailing partial block gets none."""
    _check_block_size(block_size)
    _check_parent(root)
    count = len(token_ids) // block_size
    # Encoding once and slicing avoids a per-block array round trip.
    packed = _encode_tokens(token_ids[: count * block_size])
    return _chain(root, packed, block_size, count)


def hash_reusable_blocks(
    token_ids: Sequence[int], block_size: int, root: BlockHash
) -> list[BlockHash]:
    """Hashes of the blocks of a prompt that a prefix-cache hit may cover: its full blocks
    before the last token, whose logits are always computed to sample the next token. The
    scheduler and the nodes both name a prompt's cacheable blocks with this."""
    num_blocks = max(len(token_ids) - 1, 0) // block_size
    return hash_full_blocks(token_ids[: num_blocks * block_size], block_size, root)


def extend_block_hashes(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, root: BlockHash
) -> list[BlockHash]:
    """Appends to ``hashes`` the hashes of blocks that became full since it was last extended.

    ``hashes`` must hold the hashes of the first ``len(hashes)`` blocks of ``token_ids``;
    the same list is returned, now equal to ``hash_full_blocks(token_ids, block_size, root)``.
    """
    _check_block_size(block_size)
    _check_parent(root)
    done = len(hashes)
    count = len(token_ids) // block_size
    if done > count:
        raise ValueError(
            f"{done} hashes given but {len(token_ids)} tokens hold only {count} full blocks"
        )
    if done == count:
        return hashes
    parent = hashes[-1] if hashes else root
    packed = _encode_tokens(token_ids[done * block_size : count * block_size])
    hashes.extend(_chain(parent, packed, block_size, count - done))
    return hashes


def scope_salt(secret: bytes, tenant: str, cache_salt: str = "") -> bytes:
    """The salt of a request's cache scope, derived on the server.

    A keyed hash of the authenticated tenant, so tenants never share blocks and no client can
    name another tenant's scope; a client's own ``cache_salt`` is appended, so it can only split
    its tenant's scope further, never join another.
    """
    scope = hmac.new(secret, tenant.encode(), hashlib.sha256).digest()[:HASH_BYTES]
    return scope + b"/" + cache_salt.encode() if cache_salt else scope


def quota_key(salt: bytes) -> bytes:
    """The tenant scope a block counts against in the lower tiers' quotas: the keyed tenant
    hash that leads every ``scope_salt`` (a client's own ``cache_salt`` splits the cache, not
    the quota). Names no tenant, and no client can forge another's."""
    return bytes(salt[:HASH_BYTES])
