"""Chained block hashes and keyed block checksums."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.kv.checksum import BlockChecksum
from shared.kv.hashing import (
    HASH_BYTES,
    extend_block_hashes,
    hash_block_tokens,
    hash_full_blocks,
    root_hash,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK = 4
TOKENS = [17, 4, 99, 1000, 5, 6, 7, 8, 49151, 0, 2**32 - 1, 3, 42]  # 3 full blocks + 1 token


def _root(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "model_id": "SmolLM2-135M",
        "block_size": BLOCK,
        "kv_dtype": "float32",
        "salt": b"tenant-a",
    }
    args.update(overrides)
    return root_hash(**args)  # type: ignore[arg-type]


def test_same_inputs_same_hashes() -> None:
    assert _root() == _root()
    assert len(_root()) == HASH_BYTES
    assert hash_full_blocks(TOKENS, BLOCK, _root()) == hash_full_blocks(
        list(TOKENS), BLOCK, _root()
    )
    assert hash_block_tokens(_root(), TOKENS[:4]) == hash_block_tokens(_root(), tuple(TOKENS[:4]))


@pytest.mark.parametrize(
    "override",
    [
        {"salt": b"tenant-b"},
        {"salt": b""},
        {"model_id": "SmolLM2-360M"},
        {"block_size": 8},
        {"kv_dtype": "float16"},
        {"kv_dtype": "fp8_e4m3"},
    ],
)
def test_any_root_field_changes_root_and_chain(override: dict[str, object]) -> None:
    base, other = _root(), _root(**override)
    assert base != other
    base_chain = hash_full_blocks(TOKENS[:12], BLOCK, base)
    other_chain = hash_full_blocks(TOKENS[:12], BLOCK, other)
    assert all(a != b for a, b in zip(base_chain, other_chain, strict=True))


def test_root_fields_are_length_prefixed() -> None:
    assert root_hash("ab", 16, "c") != root_hash("a", 16, "bc")
    assert root_hash("m", 16, "float32", salt="x") != root_hash("m", 16, "float3", salt="2x")


def test_str_and_bytes_salt_agree() -> None:
    assert root_hash("m", 16, "float32", salt="tenant") == root_hash("m", 16, "float32", b"tenant")


def test_chain_property() -> None:
    root = _root()
    chain = hash_full_blocks(TOKENS, BLOCK, root)
    assert chain[0] == hash_block_tokens(root, TOKENS[0:4])
    assert chain[1] == hash_block_tokens(chain[0], TOKENS[4:8])
    assert chain[2] == hash_block_tokens(chain[1], TOKENS[8:12])

    changed = list(TOKENS)
    changed[2] += 1
    changed_chain = hash_full_blocks(changed, BLOCK, root)
    assert all(a != b for a, b in zip(chain, changed_chain, strict=True))

    # A change in block 1 leaves block 0 alone and changes everything after.
    later = list(TOKENS)
    later[5] += 1
    later_chain = hash_full_blocks(later, BLOCK, root)
    assert later_chain[0] == chain[0]
    assert later_chain[1] != chain[1] and later_chain[2] != chain[2]


def test_partial_block_gets_no_hash() -> None:
    root = _root()
    assert hash_full_blocks([], BLOCK, root) == []
    assert hash_full_blocks(TOKENS[:3], BLOCK, root) == []
    assert len(hash_full_blocks(TOKENS[:4], BLOCK, root)) == 1
    assert len(hash_full_blocks(TOKENS[:7], BLOCK, root)) == 1
    assert len(hash_full_blocks(TOKENS, BLOCK, root)) == 3
    assert hash_full_blocks(TOKENS, BLOCK, root) == hash_full_blocks(TOKENS[:12], BLOCK, root)


def test_extend_matches_full_hashing_step_by_step() -> None:
    root = _root()
    hashes: list[bytes] = []
    seq: list[int] = []
    for tok in TOKENS * 3:
        seq.append(tok)
        out = extend_block_hashes(hashes, seq, BLOCK, root)
        assert out is hashes
        assert hashes == hash_full_blocks(seq, BLOCK, root)
    assert len(hashes) == len(TOKENS) * 3 // BLOCK


def test_extend_in_jumps_and_from_empty() -> None:
    root = _root()
    seq = TOKENS * 2
    hashes = extend_block_hashes([], seq[:5], BLOCK, root)
    extend_block_hashes(hashes, seq[:21], BLOCK, root)
    assert hashes == hash_full_blocks(seq[:21], BLOCK, root)
    with pytest.raises(ValueError):
        extend_block_hashes(hashes, seq[:8], BLOCK, root)


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_out_of_range_token_ids_are_rejected(bad: int) -> None:
    with pytest.raises(ValueError, match="uint32"):
        hash_block_tokens(_root(), [1, bad, 2, 3])
    with pytest.raises(ValueError, match="uint32"):
        hash_full_blocks([1, 2, 3, bad], BLOCK, _root())


def test_token_ids_are_little_endian_uint32() -> None:
    import hashlib

    root = _root()
    expected = hashlib.blake2b(
        root + bytes([1, 0, 0, 0, 0, 1, 0, 0, 255, 255, 255, 255]), digest_size=16
    ).digest()
    assert hash_block_tokens(root, [1, 256, 2**32 - 1]) == expected


_CHILD = (
    "from shared.kv.hashing import hash_full_blocks, root_hash\n"
    "root = root_hash('SmolLM2-135M', 4, 'float32', salt='tenant-a')\n"
    "print(','.join(h.hex() for h in hash_full_blocks({tokens!r}, 4, root)))\n"
)


def _hashes_in_child(seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD.format(tokens=TOKENS)],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_hashes_are_identical_across_processes() -> None:
    here = ",".join(h.hex() for h in hash_full_blocks(TOKENS, BLOCK, _root(salt="tenant-a")))
    assert _hashes_in_child("1") == here
    assert _hashes_in_child("12345") == here


def test_checksum_detects_one_flipped_byte() -> None:
    checksum = BlockChecksum("a cache secret")
    data = bytearray(bytes(range(256)) * 64)
    original = checksum(data)
    assert original == checksum(bytes(data)) == checksum(memoryview(data))
    assert isinstance(original, int) and 0 <= original < 2**64
    data[1000] ^= 0x01
    assert checksum(data) != original


def test_checksum_is_keyed_by_the_cache_secret() -> None:
    """Whoever lacks the secret cannot give altered bytes a checksum the nodes accept: the
    same bytes checksum differently under another secret, and the same under the same one
    in another object (every process derives the key alike)."""
    data = os.urandom(1 << 16)
    ours = BlockChecksum("the cluster's secret")
    assert ours(data) == BlockChecksum(b"the cluster's secret")(data)
    assert ours(data) != BlockChecksum("another secret")(data)
    assert ours(data) != BlockChecksum(b"")(data)


def test_scope_salts_separate_tenants_and_cache_salts_only_narrow() -> None:
    from shared.kv.hashing import scope_salt

    secret = b"server secret"
    alice, bob = scope_salt(secret, "alice"), scope_salt(secret, "bob")
    assert alice == scope_salt(secret, "alice") and alice != bob
    assert scope_salt(b"another secret", "alice") != alice
    narrowed = scope_salt(secret, "alice", "project-x")
    assert narrowed.startswith(alice) and narrowed != alice
    # The same client salt under another tenant stays in that tenant's scope.
    assert scope_salt(secret, "bob", "project-x").startswith(bob)
    assert scope_salt(secret, "bob", "project-x") != narrowed
