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
    read_file,
    read_header,
    read_into,
    verify_payload,
)
from tests.tierd.blocks import layout_of, make_block


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
        encoded = encode_header(header)
        assert decode_header(encoded) == (header, len(encoded))
        assert block_file.header_size(encoded[:PREFIX_BYTES]) == len(encoded)
        # Trailing bytes (the payload) do not change what the header says.
        assert decode_header(encoded + b"payload") == (header, len(encoded))


def test_pack_is_header_then_payload() -> None:
    header, payload = make_block(1000)
    data = pack(header, payload)
    decoded, offset = decode_header(data)
    assert decoded == header
    assert data[offset:] == payload
    verify_payload(decoded, memoryview(data)[offset:])
    assert block_file.packed_size(header) == len(data)


def test_pack_refuses_a_payload_that_does_not_match() -> None:
    header, payload = make_block(100)
    with pytest.raises(BlockFormatError, match="checksum"):
        pack(header, payload[:-1] + bytes([payload[-1] ^ 1]))
    with pytest.raises(BlockFormatError, match="payload is 99 bytes"):
        pack(header, payload[:-1])


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
        encode_header(dataclasses.replace(header, **change))  # type: ignore[arg-type]


def test_every_truncation_is_refused(tmp_path: Path) -> None:
    header, payload = make_block(64)
    data = pack(header, payload)
    header_len = len(encode_header(header))
    path = tmp_path / "b.blk"
    dest = memoryview(bytearray(64))
    for cut in range(len(data)):
        if cut < header_len:
            with pytest.raises(BlockFormatError):
                decode_header(data[:cut])
        path.write_bytes(data[:cut])
        with pytest.raises(BlockFormatError):
            read_into(path, dest, header.block_hash, layout_of(header))
        with pytest.raises(BlockFormatError):
            read_file(path, header.block_hash)


def _check_whole(data: bytes, block_hash: bytes) -> None:
    header, offset = decode_header(data)
    block_file.verify_identity(header, block_hash)
    verify_payload(header, memoryview(data)[offset:])


@pytest.mark.parametrize("bit", [0x01, 0x80])
def test_a_flipped_bit_anywhere_is_refused(tmp_path: Path, bit: int) -> None:
    header, payload = make_block(48, quota_key=b"tenant")
    data = pack(header, payload)
    path = tmp_path / "b.blk"
    dest = memoryview(bytearray(48))
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= bit
        with pytest.raises(BlockFormatError):
            _check_whole(bytes(bad), header.block_hash)
        path.write_bytes(bad)
        with pytest.raises(BlockFormatError):
            read_into(path, dest, header.block_hash, layout_of(header))


def test_extra_bytes_after_the_payload_are_refused(tmp_path: Path) -> None:
    header, payload = make_block(32)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload) + b"\0")
    with pytest.raises(BlockFormatError, match="after the payload"):
        read_file(path, header.block_hash)


def _prefix(magic: bytes = b"CKVB", version: int = FORMAT_VERSION, body_len: int = 100) -> bytes:
    return struct.pack("<4sHHIQ", magic, version, 0, body_len, 0)


def test_foreign_and_newer_files_are_refused() -> None:
    header, payload = make_block(16)
    data = bytearray(pack(header, payload))
    with pytest.raises(BlockFormatError, match="magic"):
        decode_header(b"PK\x03\x04" + bytes(data[4:]))
    data[4:6] = struct.pack("<H", FORMAT_VERSION + 1)
    with pytest.raises(BlockFormatError, match="newer format version 2"):
        decode_header(bytes(data))
    with pytest.raises(BlockFormatError, match="implausible"):
        decode_header(_prefix(body_len=MAX_HEADER_BYTES))
    with pytest.raises(BlockFormatError, match="implausible"):
        block_file.header_size(_prefix(body_len=3))


def test_read_into_fills_dest_and_checks_hash_and_layout(tmp_path: Path) -> None:
    header, payload = make_block(300)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload))
    dest = bytearray(b"\xff" * 400)
    got = read_into(path, memoryview(dest), header.block_hash, layout_of(header))
    assert got == header
    assert dest[:300] == payload and dest[300:] == b"\xff" * 100
    assert read_file(path, header.block_hash) == (header, bytearray(payload))
    assert read_header(path, header.block_hash) == (header, len(pack(header, payload)))

    other, _ = make_block(300, first_token=99)
    with pytest.raises(BlockFormatError, match="holds block"):
        read_into(path, memoryview(dest), other.block_hash, layout_of(header))
    expected = layout_of(header)
    for layout in (
        dataclasses.replace(expected, model_id="x"),
        dataclasses.replace(expected, block_size=8),
        dataclasses.replace(expected, kv_dtype="float16"),
    ):
        with pytest.raises(LayoutMismatch):
            read_into(path, memoryview(dest), header.block_hash, layout)
    bigger = dataclasses.replace(layout_of(header), num_bytes=301)
    with pytest.raises(LayoutMismatch):
        read_into(path, memoryview(dest), header.block_hash, bigger)


def test_read_into_refuses_a_short_dest(tmp_path: Path) -> None:
    header, payload = make_block(300)
    path = tmp_path / "b.blk"
    path.write_bytes(pack(header, payload))
    with pytest.raises(ValueError, match="dest holds"):
        read_into(path, memoryview(bytearray(299)), header.block_hash, layout_of(header))


def test_names_and_keys() -> None:
    block_hash = bytes(range(16))
    hex_hash = block_hash.hex()
    assert block_file.file_name(block_hash) == f"00/{hex_hash}.blk"
    assert block_file.file_name(b"\xab" + bytes(15)).startswith("ab/ab00")
    assert block_file.object_key("", block_hash) == hex_hash
    assert block_file.object_key("tier/host-1", block_hash) == f"tier/host-1/{hex_hash}"
    assert block_file.object_key("tier/", block_hash) == f"tier/{hex_hash}"
