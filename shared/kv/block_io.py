"""Reading stored blocks (``shared.kv.block_file`` format) from files: tierd's NVMe tier, and
nodes reading that tier's files directly.

Invariant: as for every stored copy, nothing reaches the caller unverified; the plain payload
of an unencrypted file is read straight into the caller's buffer, with no copy.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

from shared.kv.block_file import (
    PREFIX_BYTES,
    BlockFormatError,
    BlockHeader,
    Layout,
    check_plain,
    decode_header,
    header_size,
    unseal_into,
    verify_identity,
)
from shared.kv.seal import MAC_OVERHEAD, SEALED_OVERHEAD, BlockSeal


def _read_exact(f: io.FileIO, view: memoryview, what: str) -> None:
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise BlockFormatError(f"truncated: {done} of {len(view)} {what} bytes")
        done += got


def _read_header(
    f: io.FileIO, block_hash: bytes, layout: Layout | None, seal: BlockSeal
) -> BlockHeader:
    prefix = bytearray(PREFIX_BYTES)
    _read_exact(f, memoryview(prefix), "header")
    rest = bytearray(header_size(prefix) - PREFIX_BYTES)
    _read_exact(f, memoryview(rest), "header")
    header, _ = decode_header(prefix + rest, seal)
    verify_identity(header, block_hash, layout)
    return header


def _read_payload(f: io.FileIO, dest: memoryview, header: BlockHeader, seal: BlockSeal) -> None:
    view = dest[: header.num_bytes]
    area = memoryview(bytearray(SEALED_OVERHEAD + header.num_bytes if header.encrypted else 0))
    tag = memoryview(bytearray(0 if header.encrypted else MAC_OVERHEAD))
    if header.encrypted:
        _read_exact(f, area, "payload")
    else:
        # The plain payload goes straight into dest; only its tag is read apart.
        _read_exact(f, view, "payload")
        _read_exact(f, tag, "payload")
    if f.read(1):
        raise BlockFormatError("bytes after the payload")
    if header.encrypted:
        unseal_into(header, area, view, seal)
    else:
        check_plain(header, view, tag, seal)


def read_header(path: Path, block_hash: bytes, seal: BlockSeal) -> tuple[BlockHeader, int]:
    """The verified header of the block at ``path`` (not its payload) and the file's size;
    a size other than ``packed_size(header)`` means a truncated or padded file."""
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, None, seal)
        return header, os.fstat(f.fileno()).st_size


def read_into(
    path: Path, dest: memoryview, block_hash: bytes, layout: Layout, seal: BlockSeal
) -> BlockHeader:
    """Reads the block at ``path`` into ``dest`` (at least ``layout.num_bytes`` long) and
    verifies it. On BlockFormatError ``dest`` may hold part of a bad payload."""
    if len(dest) < layout.num_bytes:
        raise ValueError(f"dest holds {len(dest)} bytes, the block needs {layout.num_bytes}")
    # Unbuffered, so readinto fills dest from the kernel with no intermediate copy.
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, layout, seal)
        _read_payload(f, dest.cast("B"), header, seal)
    return header


def read_file(path: Path, block_hash: bytes, seal: BlockSeal) -> tuple[BlockHeader, bytearray]:
    """The verified header and payload of the block at ``path``, whatever its layout."""
    with open(path, "rb", buffering=0) as f:
        header = _read_header(f, block_hash, None, seal)
        payload = bytearray(header.num_bytes)
        _read_payload(f, memoryview(payload), header, seal)
    return header, payload
