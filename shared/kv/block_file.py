"""The on-disk and in-object format of one KV block below DRAM (NVMe files, S3 objects).

A block is stored as ``prefix ‖ body ‖ payload area``. The prefix is fixed-size: magic
``CKVB``, format version, flags, the body's length and a tag (``shared.kv.seal``) over the
prefix and body, keyed by the cache secret and the tier. The body is struct-packed (no pickle):
hashes, payload checksum and size, block size, creation time, then the quota key, model id, KV
dtype and token ids. With the ``ENCRYPTED`` flag the token ids and the payload are AES-GCM
ciphertexts under the tenant's key; without it the token ids are plain and the payload is
followed by its own keyed tag. The payload checksum (``shared.kv.checksum``, keyed, of the
plain bytes) is kept: it is what transfers between processes verify.

Invariant: nothing is handed to a caller unless every check passed — magic, a version this
code knows, the header's keyed tag, the expected block hash and layout, the payload's keyed
tag (or AEAD tag), and before a copy is stored its checksum. Without the cache secret no one
can make a block that passes, and any byte flipped or cut off anywhere fails one of the checks.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from shared.errors import CrescentError
from shared.kv.hashing import HASH_BYTES
from shared.kv.seal import MAC_OVERHEAD, SEALED_OVERHEAD, TAG_BYTES, BlockSeal, SealError

FORMAT_VERSION = 3  # 3: the payload checksum is keyed (shared.kv.checksum)
MAGIC = b"CKVB"
ENCRYPTED = 1
# magic, version, flags, body length, then the keyed tag of everything else in the header.
_PREFIX = struct.Struct(f"<4sHHI{TAG_BYTES}s")
_TAGGED = _PREFIX.size - TAG_BYTES
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
# Domain labels: no tag or ciphertext made for one part of a copy passes for another part.
_HEADER = b"header\0"
_TOKENS = b"tokens\0"
_PAYLOAD = b"payload\0"


class BlockFormatError(CrescentError):
    """Stored block bytes are malformed, truncated, forged, of another format or not the block
    asked for; the copy is unusable and the caller treats the block as absent."""


class LayoutMismatch(BlockFormatError):
    """A well-formed block of another model, block size, dtype or size than the reader
    expects: refused, but not corrupt."""


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """What a stored block says about itself; ``checksum`` and ``num_bytes`` describe the
    plain payload. ``encrypted`` and ``tag`` describe a stored copy (set by decoding)."""

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
    # How one stored copy holds the block, not what the block is: equality ignores them.
    encrypted: bool = field(default=False, compare=False)
    tag: bytes = field(default=b"", compare=False, repr=False)


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


def encode_header(header: BlockHeader, seal: BlockSeal) -> bytes:
    """The prefix and body of ``header`` as ``seal`` stores it (encrypted or not, tagged);
    ValueError for a header no reader could accept."""
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
    if seal.encrypt:
        tokens = bytes(seal.encrypted(header.quota_key, header.block_hash, _TOKENS, tokens))
    body = b"".join((fixed, header.quota_key, model, dtype, tokens))
    if PREFIX_BYTES + len(body) > MAX_HEADER_BYTES:
        raise ValueError(f"the header exceeds {MAX_HEADER_BYTES} bytes")
    flags = ENCRYPTED if seal.encrypt else 0
    tagged = _PREFIX.pack(MAGIC, FORMAT_VERSION, flags, len(body), bytes(TAG_BYTES))[:_TAGGED]
    return tagged + seal.tag(_HEADER, tagged, body) + body


def header_size(prefix: bytes | bytearray | memoryview) -> int:
    """The length of the whole header (prefix and body) from its first ``PREFIX_BYTES``; lets a
    reader fetch exactly the header. BlockFormatError if the prefix is not a valid one."""
    return PREFIX_BYTES + _parse_prefix(prefix)[0]


def _parse_prefix(data: bytes | bytearray | memoryview) -> tuple[int, int, bytes]:
    if len(data) < PREFIX_BYTES:
        raise BlockFormatError(f"truncated: {len(data)} bytes, the prefix alone is {PREFIX_BYTES}")
    magic, version, flags, body_len, tag = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise BlockFormatError(f"not a block file: magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        newer = "a newer" if version > FORMAT_VERSION else "an older or unknown"
        raise BlockFormatError(
            f"{newer} format version {version} (this code reads {FORMAT_VERSION})"
        )
    if flags & ~ENCRYPTED:
        raise BlockFormatError(f"unknown flags {flags:#x}")
    if body_len < _FIXED.size or PREFIX_BYTES + body_len > MAX_HEADER_BYTES:
        raise BlockFormatError(f"implausible header length {body_len}")
    return body_len, flags, bytes(tag)


def decode_header(data: bytes | bytearray | memoryview, seal: BlockSeal) -> tuple[BlockHeader, int]:
    """The authenticated header at the start of ``data`` and the offset of the payload area."""
    body_len, flags, tag = _parse_prefix(data)
    end = PREFIX_BYTES + body_len
    if len(data) < end:
        raise BlockFormatError(f"truncated header: {len(data)} of {end} bytes")
    view = memoryview(data)
    body = view[PREFIX_BYTES:end]
    try:
        seal.check_tag(tag, _HEADER, view[:_TAGGED], body)
        return _decode_body(body, bool(flags & ENCRYPTED), tag, seal), end
    except SealError as exc:
        raise BlockFormatError(f"header: {exc}") from None


def _decode_body(body: memoryview, encrypted: bool, tag: bytes, seal: BlockSeal) -> BlockHeader:
    block, parent, checksum, num_bytes, block_size, created, n_quota, n_model, n_dtype, n_tok = (
        _FIXED.unpack_from(body)
    )
    if n_quota > MAX_QUOTA_KEY_BYTES:
        raise BlockFormatError(f"quota key of {n_quota} bytes")
    at = _FIXED.size
    n_tok_bytes = 4 * n_tok + (SEALED_OVERHEAD if encrypted else 0)
    if at + n_quota + n_model + n_dtype + n_tok_bytes != len(body):
        raise BlockFormatError("header field lengths do not add up to the header length")
    quota = bytes(body[at : at + n_quota])
    at += n_quota
    try:
        model = str(body[at : at + n_model], "utf-8")
        dtype = str(body[at + n_model : at + n_model + n_dtype], "utf-8")
    except UnicodeDecodeError as exc:
        raise BlockFormatError(f"header text is not UTF-8: {exc}") from exc
    packed = body[at + n_model + n_dtype :]
    if encrypted:
        packed = memoryview(seal.decrypt(quota, block, _TOKENS, packed))
    tokens = struct.unpack_from(f"<{n_tok}I", packed)
    return BlockHeader(
        block,
        parent,
        tokens,
        checksum,
        num_bytes,
        model,
        block_size,
        dtype,
        quota,
        created,
        encrypted,
        tag,
    )


def _check_size(header: BlockHeader, payload: bytes | memoryview) -> None:
    if len(payload) != header.num_bytes:
        raise BlockFormatError(f"payload is {len(payload)} bytes, header says {header.num_bytes}")


def verify_payload(header: BlockHeader, payload: bytes | memoryview, seal: BlockSeal) -> None:
    """BlockFormatError unless ``payload`` has the size and (keyed) checksum ``header``
    promises. Checked before a copy is stored; a read needs only the size, since the payload's
    own tag binds it to the header's tag, which covers the checksum."""
    _check_size(header, payload)
    if seal.checksum(payload) != header.checksum:
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


def seal_parts(
    header: BlockHeader, payload: bytes | memoryview, seal: BlockSeal
) -> list[bytes | bytearray | memoryview]:
    """A stored copy's content in pieces, written one after another (a tagged payload is not
    copied), after verifying ``payload`` against ``header``."""
    verify_payload(header, payload, seal)
    head = encode_header(header, seal)
    tag = head[_TAGGED:PREFIX_BYTES]
    if not seal.encrypt:
        return [head, payload, seal.tag(_PAYLOAD, header.block_hash, tag, payload)]
    return [head, _encrypt(header, payload, seal, tag, b"")]


def pack(header: BlockHeader, payload: bytes | memoryview, seal: BlockSeal) -> bytes | bytearray:
    """A file's or object's whole content: the header, then the sealed payload (encrypted
    into one buffer holding both, since a 1.5 MB copy costs more than the cipher)."""
    if not seal.encrypt:
        return b"".join(seal_parts(header, payload, seal))
    verify_payload(header, payload, seal)
    head = encode_header(header, seal)
    return _encrypt(header, payload, seal, head[_TAGGED:PREFIX_BYTES], head)


def _encrypt(
    header: BlockHeader, payload: bytes | memoryview, seal: BlockSeal, tag: bytes, head: bytes
) -> bytearray:
    out = bytearray(len(head) + len(payload) + SEALED_OVERHEAD)
    out[: len(head)] = head
    view = memoryview(out)[len(head) :]
    seal.encrypt_into(header.quota_key, header.block_hash, _PAYLOAD + tag, payload, view)
    return out


def payload_area(header: BlockHeader) -> int:
    """Bytes after the header of a stored copy described by ``header``."""
    return header.num_bytes + (SEALED_OVERHEAD if header.encrypted else MAC_OVERHEAD)


def packed_size(header: BlockHeader, encrypted: bool | None = None) -> int:
    """Bytes a copy of ``header`` occupies in a store, encrypted as ``encrypted`` says
    (default: as ``header`` was read)."""
    enc = header.encrypted if encrypted is None else encrypted
    text = len(header.model_id.encode()) + len(header.kv_dtype.encode())
    tokens = 4 * len(header.token_ids) + (SEALED_OVERHEAD if enc else 0)
    head = PREFIX_BYTES + _FIXED.size + len(header.quota_key) + text + tokens
    return head + header.num_bytes + (SEALED_OVERHEAD if enc else MAC_OVERHEAD)


def unseal_into(
    header: BlockHeader, area: bytes | bytearray | memoryview, dest: memoryview, seal: BlockSeal
) -> None:
    """Checks the payload area of a stored copy and puts the plain payload into ``dest``
    (``header.num_bytes`` long); BlockFormatError if anything fails."""
    if len(area) != payload_area(header):
        raise BlockFormatError(f"payload area is {len(area)} bytes, not {payload_area(header)}")
    view = memoryview(area)
    if header.encrypted:
        try:
            ad = _PAYLOAD + header.tag
            seal.decrypt_into(header.quota_key, header.block_hash, ad, view, dest)
        except SealError as exc:
            raise BlockFormatError(f"payload: {exc}") from None
        _check_size(header, dest)
    else:
        dest[:] = view[: header.num_bytes]
        check_plain(header, dest, view[header.num_bytes :], seal)


def check_plain(header: BlockHeader, plain: memoryview, tag: memoryview, seal: BlockSeal) -> None:
    """Checks an unencrypted payload against its keyed tag (which vouches for the checksum:
    ``verify_payload``)."""
    _check_size(header, plain)
    try:
        seal.check_tag(tag, _PAYLOAD, header.block_hash, header.tag, plain)
    except SealError as exc:
        raise BlockFormatError(f"payload: {exc}") from None


def unpack(
    data: bytes | bytearray | memoryview, block_hash: bytes, seal: BlockSeal
) -> tuple[BlockHeader, bytearray]:
    """The verified header and plain payload of a whole stored copy."""
    header, offset = decode_header(data, seal)
    verify_identity(header, block_hash)
    payload = bytearray(header.num_bytes)
    unseal_into(header, memoryview(data)[offset:], memoryview(payload), seal)
    return header, payload


def file_name(block_hash: bytes) -> str:
    """A block's file, relative to the store's root, fanned out by its hash's first byte."""
    hex_hash = block_hash.hex()
    return f"{hex_hash[:2]}/{hex_hash}.blk"


def object_key(prefix: str, block_hash: bytes) -> str:
    """A block's object key under ``prefix``."""
    prefix = prefix.rstrip("/")
    return f"{prefix}/{block_hash.hex()}" if prefix else block_hash.hex()
