"""The block file format: round trips, and every kind of damage refused."""

from __future__ import annotations

import dataclasses
import random
import struct
from pathlib import Path

import pytest

from shared.kv import block_file
from shared.kv.block_file import (
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    PREFIX_BYTES,
    BlockFormatError,
    BlockHeader,
    LayoutMismatch,
    decode_header,
    encode_header,
    pack,
)
from shared.kv.block_io import read_file, read_header, read_into
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME, S3
from shared.secrets import DEV_CACHE_SECRET
from tests.tierd.blocks import layout_of, make_block

SEAL = BlockSeal(DEV_CACHE_SECRET, NVME)
PLAIN = BlockSeal(DEV_CACHE_SECRET, NVME, encrypt=False)


def _random_header(rng: random.Random) -> BlockHeader:
    n_tokens = rng.choice([0, 1, 4, 32, 257])
    return BlockHeader(
        block_hash=rng.randbytes(16),
        parent_hash=rng.randbytes(16),
        token_ids=tuple(rng.randrange(2**32) for _ in range(n_tokens)),
        checksum=rng.randrange(2**64),
        num_bytes=rng.randrange(2**40),
        model_id=rng.choice(["", "m", "SmolLM2-135M", "模型-ü"]),
        block_size=rng.randrange(1, 2**32),
        kv_dtype=rng.choice(["float32", "bfloat16", ""]),
        quota_key=rng.randbytes(rng.randrange(17)),
        created_at=rng.uniform(0, 2e9),
    )


def test_headers_round_trip() -> None:
    rng = random.Random(7)
    for _ in range(300):
        header = _random_header(rng)
        encoded = encode_header(header, SEAL)
        assert decode_header(encoded, SEAL) == (header, len(encoded))
        assert block_file.header_size(encoded[:PREFIX_BYTES]) == len(encoded)
        # Trailing bytes (the payload) do not change what the header says.
        assert decode_header(encoded + b"payload", SEAL) == (header, len(encoded))


@pytest.mark.parametrize("seal", [SEAL, PLAIN], ids=["encrypted", "tagged"])
def test_pack_is_header_then_sealed_payload(seal: BlockSeal) -> None:
    header, payload = make_block(1000, quota_key=b"tenant")
    data = pack(header, payload, seal)
    decoded, _ = decode_header(data, seal)
    assert decoded == header and decoded.encrypted == seal.encrypt
    assert (payload in data) != seal.encrypt
    assert block_file.unpack(data, header.block_hash, seal) == (header, bytearray(payload))
    assert block_file.packed_size(header, seal.encrypt) == len(data)
    assert block_file.packed_size(decoded) == len(data)


def test_pack_refuses_a_payload_that_does_not_match() -> None:
    header, payload = make_block(100)
    with pytest.raises(BlockFormatError, match="checksum"):
        pack(header, payload[:-1] + bytes([payload[-1] ^ 1]), SEAL)
    with pytest.raises(BlockFormatError, match="payload is 99 bytes"):
        pack(header, payload[:-1], SEAL)


@pytest.mark.parametrize(
    "change",
    [
        {"block_hash": b"short"},
        {"parent_hash": bytes(17)},
        {"quota_key": bytes(17)},
        {"token_ids": (2**32,)},
        {"token_ids": (-1,)},
        {"checksum": 2**64},
        {"block_size": 0},
    ],
)
def test_encode_refuses_what_no_reader_could_accept(change: dict[str, object]) -> None:
    header, _ = make_block(10)
    with pytest.raises(ValueError):
        encode_header(dataclasses.replace(header, **change), SEAL)  # type: ignore[arg-type]


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    header, payload = make_block(64)
    data = pack(header, payload, SEAL)
    header_len = len(encode_header(header, SEAL))
    path = tmp_path / "b.blk"
    dest = memoryview(bytearray(64))
    for cut in range(len(data)):
        if cut < header_len:
            with pytest.raises(BlockFormatError):
                decode_header(data[:cut], SEAL)
        path.write_bytes(data[:cut])
        with pytest.raises(BlockFormatError):
            read_into(path, dest, header.block_hash, layout_of(header), SEAL)
        with pytest.raises(BlockFormatError):
            read_file(path, header.block_hash, SEAL)


@pytest.mark.parametrize("seal", [SEAL, PLAIN], ids=["encrypted", "tagged"])
@pytest.mark.parametrize("bit", [0x01, 0x80])
def test_a_flipped_bit_anywhere_is_refused(tmp_path: Path, bit: int, seal: BlockSeal) -> None:
    header, payload = make_block(48, quota_key=b"tenant")
    data = pack(header, payload, seal)
    path = tmp_path / "b.blk"
    dest = memoryview(bytearray(48))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= bit
        with pytest.raises(BlockFormatError):
            block_file.unpack(bytes(bad), header.block_hash, seal)
        path.write_bytes(bad)
        with pytest.raises(BlockFormatError):
            read_into(path, dest, header.block_hash, layout_of(header), seal)


@pytest.mark.parametrize("seal", [SEAL, PLAIN], ids=["encrypted", "tagged"])
def test_a_forged_block_with_a_matching_checksum_is_refused(seal: BlockSeal) -> None:
    """Whoever can write the store but lacks the cache secret: a block made with another
    secret (its checksum right under that secret's key), the same block claimed by another
    tier or another hash, or another block's payload behind this header, are all refused."""
    header, payload = make_block(64, quota_key=b"tenant")
    mallory = BlockSeal("not-the-cache-secret", NVME, encrypt=seal.encrypt)
    forged = dataclasses.replace(header, checksum=mallory.checksum(payload))
    with pytest.raises(BlockFormatError, match="tag"):
        block_file.unpack(pack(forged, payload, mallory), header.block_hash, seal)
    s3 = BlockSeal(DEV_CACHE_SECRET, S3, encrypt=seal.encrypt)
    with pytest.raises(BlockFormatError, match="tag"):
        block_file.unpack(pack(header, payload, s3), header.block_hash, seal)
    other, other_payload = make_block(64, first_token=9, quota_key=b"tenant")
    head = encode_header(header, seal)
    foreign = pack(other, other_payload, seal)[len(encode_header(other, seal)) :]
    with pytest.raises(BlockFormatError):
        block_file.unpack(head + foreign, header.block_hash, seal)


def test_tenants_have_their_own_keys_and_no_token_id_is_stored_in_clear() -> None:
    header, payload = make_block(64, quota_key=b"tenant-a", first_token=0x41424344)
    data = pack(header, payload, SEAL)
    assert b"DCBA" not in data  # the first token id, packed little-endian
    as_b = bytearray(data)
    # Relabelling the block as another tenant's (a quota key of the same length) makes the
    # header tag fail; a store writer cannot re-tag without the secret.
    at = as_b.index(b"tenant-a")
    as_b[at : at + 8] = b"tenant-b"
    with pytest.raises(BlockFormatError):
        block_file.unpack(bytes(as_b), header.block_hash, SEAL)
    assert b"DCBA" in pack(header, payload, PLAIN)


def test_extra_bytes_after_the_payload_are_refused(tmp_path: Path) -> None:
    header, payload = make_block(32)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload, SEAL) + b"\0")
    with pytest.raises(BlockFormatError, match="after the payload"):
        read_file(path, header.block_hash, SEAL)


def _prefix(magic: bytes = b"CKVB", version: int = FORMAT_VERSION, body_len: int = 100) -> bytes:
    return struct.pack("<4sHHI16s", magic, version, 0, body_len, bytes(16))


def test_foreign_and_newer_files_are_refused() -> None:
    header, payload = make_block(16)
    data = bytearray(pack(header, payload, SEAL))
    with pytest.raises(BlockFormatError, match="magic"):
        decode_header(b"PK\x03\x04" + bytes(data[4:]), SEAL)
    data[4:6] = struct.pack("<H", FORMAT_VERSION + 1)
    with pytest.raises(BlockFormatError, match=f"newer format version {FORMAT_VERSION + 1}"):
        decode_header(bytes(data), SEAL)
    data[4:6] = struct.pack("<H", 1)
    with pytest.raises(BlockFormatError, match="older or unknown format version 1"):
        decode_header(bytes(data), SEAL)
    with pytest.raises(BlockFormatError, match="implausible"):
        decode_header(_prefix(body_len=MAX_HEADER_BYTES), SEAL)
    with pytest.raises(BlockFormatError, match="implausible"):
        block_file.header_size(_prefix(body_len=3))


def test_read_into_fills_dest_and_checks_hash_and_layout(tmp_path: Path) -> None:
    header, payload = make_block(300)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload, SEAL))
    dest = bytearray(b"\xff" * 400)
    got = read_into(path, memoryview(dest), header.block_hash, layout_of(header), SEAL)
    assert got == header
    assert dest[:300] == payload and dest[300:] == b"\xff" * 100
    assert read_file(path, header.block_hash, SEAL) == (header, bytearray(payload))
    assert read_header(path, header.block_hash, SEAL) == (header, len(pack(header, payload, SEAL)))

    other, _ = make_block(300, first_token=99)
    with pytest.raises(BlockFormatError, match="holds block"):
        read_into(path, memoryview(dest), other.block_hash, layout_of(header), SEAL)
    expected = layout_of(header)
    for layout in (
        dataclasses.replace(expected, model_id="x"),
        dataclasses.replace(expected, block_size=8),
        dataclasses.replace(expected, kv_dtype="float16"),
    ):
        with pytest.raises(LayoutMismatch):
            read_into(path, memoryview(dest), header.block_hash, layout, SEAL)
    bigger = dataclasses.replace(layout_of(header), num_bytes=301)
    with pytest.raises(LayoutMismatch):
        read_into(path, memoryview(dest), header.block_hash, bigger, SEAL)


def test_read_into_refuses_a_short_dest(tmp_path: Path) -> None:
    header, payload = make_block(300)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload, SEAL))
    with pytest.raises(ValueError, match="dest holds"):
        read_into(path, memoryview(bytearray(299)), header.block_hash, layout_of(header), SEAL)


def test_names_and_keys() -> None:
    block_hash = bytes(range(16))
    hex_hash = block_hash.hex()
    assert block_file.file_name(block_hash) == f"00/{hex_hash}.blk"
    assert block_file.file_name(b"\xab" + bytes(15)).startswith("ab/ab00")
    assert block_file.object_key("", block_hash) == hex_hash
    assert block_file.object_key("tier/host-1", block_hash) == f"tier/host-1/{hex_hash}"
    assert block_file.object_key("tier/", block_hash) == f"tier/{hex_hash}"
