"""The on-disk and in-object format of one KV block below DRAM (NVMe files, S3 objects).

A block is stored as ``prefix ‖ body ‖ payload``. The prefix is fixed-size: magic ``CKVB``,
format version, a reserved zero, the body's length and the body's xxh3 checksum. The body is
struct-packed (no pickle): hashes, payload checksum and size, block size, creation time, then the
quota key, model id, KV dtype and token ids. The payload is the block's bytes as the pool holds
them.

Invariant: nothing is handed to a caller unless every check passed — magic, a version this
code knows, the body's checksum and length, the expected block hash, the expected layout, the
payload's size and its checksum. Any byte flipped or cut off anywhere fails one of them.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import xxhash

from shared.errors import CrescentError
from shared.kv.hashing import HASH_BYTES, block_checksum

FORMAT_VERSION = 1
MAGIC = b"CKVB"
# magic, version, reserved (zero), body length, xxh3 of the body.
_PREFIX = struct.Struct("<4sHHIQ")
PREFIX_BYTES = _PREFIX.size
# block hash, parent hash, payload checksum, payload bytes, block size, created at,
# then the lengths of: quota key, model id, KV dtype, token ids (in tokens).
_FIXED = struct.Struct(f"<{HASH_BYTES}s{HASH_BYTES}sQQIdBHHI")
MAX_QUOTA_KEY_BYTES = 16
# Far above any real block (a few hundred bytes for 32 tokens); bounds what a corrupt length
# field can make a reader allocate.
MAX_HEADER_BYTES = 1 << 20
_U32 = 2**32 - 1
_U64 = 2**64 - 1


class BlockFormatError(CrescentError):
    """Stored block bytes are malformed, truncated, of another format or not the block asked
    for; the copy is unusable and the caller treats the block as absent."""


class LayoutMismatch(BlockFormatError):
    """A well-formed block of another model, block size, dtype or size than the reader
    expects: refused, but not corrupt."""


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """What a stored block says about itself; ``checksum`` and ``num_bytes`` describe the
    payload that follows it."""

    block_hash: bytes
    parent_hash: bytes
    token_ids: tuple[int, ...]
    checksum: int
    num_bytes: int
    model_id: str
    block_size: int
    kv_dtype: str
    quota_key: bytes = b""
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Layout:
    """The geometry a reader expects: a block of another model, size or dtype is refused."""

    model_id: str
    block_size: int
    kv_dtype: str
    num_bytes: int


def _check_encodable(h: BlockHeader) -> None:
    if len(h.block_hash) != HASH_BYTES or len(h.parent_hash) != HASH_BYTES:
        raise ValueError(f"block and parent hashes must be {HASH_BYTES} bytes")
    if len(h.quota_key) > MAX_QUOTA_KEY_BYTES:
        raise ValueError(f"a quota key is at most {MAX_QUOTA_KEY_BYTES} bytes")
    if not 0 <= h.checksum <= _U64 or not 0 <= h.num_bytes <= _U64:
        raise ValueError("checksum and num_bytes must fit an unsigned 64-bit integer")
    if not 0 < h.block_size <= _U32:
        raise ValueError(f"block_size must be a positive uint32, got {h.block_size}")
    if any(not 0 <= t <= _U32 for t in h.token_ids):
        raise ValueError("token ids must fit an unsigned 32-bit integer")


def encode_header(header: BlockHeader) -> bytes:
    """The prefix and body of ``header``; ValueError for a header no reader could accept."""
    _check_encodable(header)
    model = header.model_id.encode()
    dtype = header.kv_dtype.encode()
    if max(len(model), len(dtype)) > 0xFFFF:
        raise ValueError("model_id and kv_dtype are at most 65535 bytes each")
    fixed = _FIXED.pack(
        header.block_hash,
        header.parent_hash,
        header.checksum,
        header.num_bytes,
        header.block_size,
        header.created_at,
        len(header.quota_key),
        len(model),
        len(dtype),
        len(header.token_ids),
    )
    tokens = struct.pack(f"<{len(header.token_ids)}I", *header.token_ids)
    body = b"".join((fixed, header.quota_key, model, dtype, tokens))
    if PREFIX_BYTES + len(body) > MAX_HEADER_BYTES:
        raise ValueError(f"the header exceeds {MAX_HEADER_BYTES} bytes")
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(body), xxhash.xxh3_64_intdigest(body))
    return prefix + body


def header_size(prefix: bytes | memoryview) -> int:
    """The length of the whole header (prefix and body) from its first ``PREFIX_BYTES``; lets a
    reader fetch exactly the header. BlockFormatError if the prefix is not a valid one."""
    return PREFIX_BYTES + _parse_prefix(prefix)[0]


def _parse_prefix(data: bytes | memoryview) -> tuple[int, int]:
    if len(data) < PREFIX_BYTES:
        raise BlockFormatError(f"truncated: {len(data)} bytes, the prefix alone is {PREFIX_BYTES}")
    magic, version, reserved, body_len, body_sum = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BlockFormatError(f"not a block file: magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        newer = "a newer" if version > FORMAT_VERSION else "an unknown"
        raise BlockFormatError(
            f"{newer} format version {version} (this code reads {FORMAT_VERSION})"
        )
    if reserved != 0:
        raise BlockFormatError("reserved prefix field is not zero")
    if body_len < _FIXED.size or PREFIX_BYTES + body_len > MAX_HEADER_BYTES:
        raise BlockFormatError(f"implausible header length {body_len}")
    return body_len, body_sum


def decode_header(data: bytes | memoryview) -> tuple[BlockHeader, int]:
    """The header at the start of ``data`` and the offset of the payload after it."""
    body_len, body_sum = _parse_prefix(data)
    end = PREFIX_BYTES + body_len
    if len(data) < end:
        raise BlockFormatError(f"truncated header: {len(data)} of {end} bytes")
    body = memoryview(data)[PREFIX_BYTES:end]
    if xxhash.xxh3_64_intdigest(body) != body_sum:
        raise BlockFormatError("header checksum mismatch")
    return _decode_body(body), end


def _decode_body(body: memoryview) -> BlockHeader:
    block, parent, checksum, num_bytes, block_size, created, n_quota, n_model, n_dtype, n_tok = (
        _FIXED.unpack_from(body)
    )
    if n_quota > MAX_QUOTA_KEY_BYTES:
        raise BlockFormatError(f"quota key of {n_quota} bytes")
    at = _FIXED.size
    if at + n_quota + n_model + n_dtype + 4 * n_tok != len(body):
        raise BlockFormatError("header field lengths do not add up to the header length")
    quota = bytes(body[at : at + n_quota])
    at += n_quota
    try:
        model = str(body[at : at + n_model], "utf-8")
        dtype = str(body[at + n_model : at + n_model + n_dtype], "utf-8")
    except UnicodeDecodeError as exc:
        raise BlockFormatError(f"header text is not UTF-8: {exc}") from exc
    tokens = struct.unpack_from(f"<{n_tok}I", body, at + n_model + n_dtype)
    return BlockHeader(
        block, parent, tokens, checksum, num_bytes, model, block_size, dtype, quota, created
    )


def verify_payload(header: BlockHeader, payload: bytes | memoryview) -> None:
    """BlockFormatError unless ``payload`` has the size and checksum ``header`` promises."""
    if len(payload) != header.num_bytes:
        raise BlockFormatError(f"payload is {len(payload)} bytes, header says {header.num_bytes}")
    if block_checksum(payload) != header.checksum:
        raise BlockFormatError("payload checksum mismatch")


def verify_identity(header: BlockHeader, block_hash: bytes, layout: Layout | None = None) -> None:
    """BlockFormatError unless ``header`` is the block asked for, in the layout expected."""
    if header.block_hash != block_hash:
        raise BlockFormatError(f"holds block {header.block_hash.hex()}, not {block_hash.hex()}")
    if layout is None:
        return
    got = Layout(header.model_id, header.block_size, header.kv_dtype, header.num_bytes)
    if got != layout:
        raise LayoutMismatch(f"layout {got} is not the expected {layout}")


def pack(header: BlockHeader, payload: bytes | memoryview) -> bytes:
    """A file's or object's whole content: the header, then the payload (verified first)."""
    verify_payload(header, payload)
    return encode_header(header) + payload


def packed_size(header: BlockHeader) -> int:
    """Bytes ``pack`` gives for ``header``: what the block occupies in a store."""
    return len(encode_header(header)) + header.num_bytes


def file_name(block_hash: bytes) -> str:
    """A block's file, relative to the store's root, fanned out by its hash's first byte."""
    hex_hash = block_hash.hex()
    return f"{hex_hash[:2]}/{hex_hash}.blk"


def object_key(prefix: str, block_hash: bytes) -> str:
    """A block's object key under ``prefix``."""
    prefix = prefix.rstrip("/")
    return f"{prefix}/{block_hash.hex()}" if prefix else block_hash.hex()


def _read_exact(f: io.FileIO, n: int) -> bytes:
    data = bytearray(n)
    view = memoryview(data)
    done = 0
    while done < n:
        got = f.readinto(view[done:])
        if not got:
            raise BlockFormatError(f"truncated: {done} of {n} header bytes")
        done += got
    return bytes(data)


def _read_header(f: io.FileIO, block_hash: bytes, layout: Layout | None) -> BlockHeader:
    prefix = _read_exact(f, PREFIX_BYTES)
    rest = _read_exact(f, header_size(prefix) - PREFIX_BYTES)
    header, _ = decode_header(prefix + rest)
    verify_identity(header, block_hash, layout)
    return header


def _read_payload(f: io.FileIO, dest: memoryview, header: BlockHeader) -> None:
    view = dest[: header.num_bytes]
    done = 0
    while done < header.num_bytes:
        got = f.readinto(view[done:])
        if not got:
            raise BlockFormatError(f"truncated payload: {done} of {header.num_bytes} bytes")
        done += got
    if f.read(1):
        raise BlockFormatError("bytes after the payload")
    verify_payload(header, view)


def read_header(path: Path, block_hash: bytes) -> tuple[BlockHeader, int]:
    """The verified header of the block at ``path`` (not its payload) and the file's size;
    a size other than the header's plus ``num_bytes`` means a truncated or padded file."""
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, None)
        return header, os.fstat(f.fileno()).st_size


def read_into(path: Path, dest: memoryview, block_hash: bytes, layout: Layout) -> BlockHeader:
    """Reads the block at ``path`` straight into ``dest`` (at least ``layout.num_bytes`` long)
    and verifies it. On BlockFormatError ``dest`` may hold part of a bad payload."""
    if len(dest) < layout.num_bytes:
        raise ValueError(f"dest holds {len(dest)} bytes, the block needs {layout.num_bytes}")
    # Unbuffered, so readinto fills dest from the kernel with no intermediate copy.
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, layout)
        _read_payload(f, dest.cast("B"), header)
    return header


def read_file(path: Path, block_hash: bytes) -> tuple[BlockHeader, bytearray]:
    """The verified header and payload of the block at ``path``, whatever its layout."""
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, None)
        payload = bytearray(header.num_bytes)
        _read_payload(f, memoryview(payload), header)
    return header, payload
