"""The NVMe tier: one file per block under a root directory (``shared.kv.block_file``), with an
in-memory index of their headers filled by ``scan`` at start.

Invariants: a block's file appears under its final name only complete (written to a temporary
file in the same directory, then renamed over), so a crash leaves at most a temporary file that
the next scan removes; ``used_bytes`` (the sum of the files' sizes) never exceeds
``capacity_bytes`` through a put; nothing unverified is returned. All file I/O runs off the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from services.tierd.store_index import BlockIndex, KeyedLocks, Removed, ScanResult, StoreFull
from shared.kv import block_file, block_io
from shared.kv.block_file import BlockFormatError, BlockHeader, Layout, LayoutMismatch
from shared.kv.hashing import HASH_BYTES
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME
from shared.secrets import DEV_CACHE_SECRET

_TMP_SUFFIX = ".tmp"
_BLK_SUFFIX = ".blk"
# Block files hold tenants' data: only tierd's user may read them, whatever the umask.
FILE_MODE = 0o600
DIR_MODE = 0o700
T = TypeVar("T")


class NvmeStore:
    """Owns the block files under ``root`` and the index of what they hold (see the module
    invariants). One store per root; nothing else writes there."""

    def __init__(
        self,
        root: Path,
        capacity_bytes: int,
        *,
        fsync: bool = True,
        seal: BlockSeal | None = None,
    ) -> None:
        """``fsync=False`` skips flushing each file to the device before its rename: faster,
        and still safe to read (every read verifies), but a power cut may lose recent puts.
        ``seal`` holds the keys (tierd passes the cache secret's; the default, the public
        development secret's, is for tests and tools)."""
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.seal = seal or BlockSeal(DEV_CACHE_SECRET, NVME)
        self._index = BlockIndex()
        self._locks = KeyedLocks()
        self._reserved = 0
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        self.root.chmod(DIR_MODE)

    @property
    def used_bytes(self) -> int:
        return self._index.used_bytes

    @property
    def num_blocks(self) -> int:
        return len(self._index)

    @property
    def free_bytes(self) -> int:
        """What a put may still take, counting the puts in flight."""
        return self.capacity_bytes - self._index.used_bytes - self._reserved

    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self._index

    def path_of(self, block_hash: bytes) -> Path:
        return self.root / block_file.file_name(block_hash)

    def headers(self) -> dict[bytes, BlockHeader]:
        return self._index.headers()

    async def put(self, header: BlockHeader, payload: bytes | memoryview) -> None:
        """Stores (or replaces) a block; StoreFull past capacity, BlockFormatError if the
        payload does not match its header. ``payload`` must not change until this returns."""
        parts = await asyncio.to_thread(block_file.seal_parts, header, payload, self.seal)
        size = sum(len(p) for p in parts)
        header = dataclasses.replace(header, encrypted=self.seal.encrypt)
        async with self._locks.hold(header.block_hash):
            # A replaced file gives its bytes back when the rename lands.
            growth = size - self._index.size_of(header.block_hash)
            if growth > self.free_bytes:
                raise StoreFull(f"{size} bytes do not fit: {self.free_bytes} free")
            self._reserved += max(growth, 0)
            try:
                path = self.path_of(header.block_hash)
                await asyncio.to_thread(_write_atomic, path, parts, self.fsync)
                self._index.add(header, size)
            finally:
                self._reserved -= max(growth, 0)

    async def get(self, block_hash: bytes) -> tuple[BlockHeader, bytearray]:
        """The verified block; KeyError if absent. A corrupt file is deleted (and leaves the
        index) before BlockFormatError is raised."""
        path = self.path_of(block_hash)
        async with self._locks.hold(block_hash):
            header, payload = await self._guarded(
                block_hash, functools.partial(block_io.read_file, path, block_hash, self.seal)
            )
            self._note(header)
        return header, payload

    async def read_into(self, block_hash: bytes, dest: memoryview, layout: Layout) -> BlockHeader:
        """Reads the block straight into ``dest``, as ``get`` (``dest`` is undefined on error);
        a block of another layout is refused with LayoutMismatch but kept."""
        path = self.path_of(block_hash)
        read = functools.partial(block_io.read_into, path, dest, block_hash, layout, self.seal)
        async with self._locks.hold(block_hash):
            header = await self._guarded(block_hash, read)
            self._note(header)
        return header

    async def _guarded(self, block_hash: bytes, read: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(read)
        except FileNotFoundError:
            self._index.discard(block_hash)
            raise KeyError(block_hash) from None
        except LayoutMismatch:
            raise
        except BlockFormatError:
            await asyncio.to_thread(_unlink, self.path_of(block_hash))
            self._index.discard(block_hash)
            raise

    def _note(self, header: BlockHeader) -> None:
        # A file that was there before the index knew it (no scan yet) joins on first read.
        if header.block_hash not in self._index:
            self._index.add(header, block_file.packed_size(header))

    async def delete(self, block_hash: bytes) -> bool:
        """Removes the block's file; whether there was one."""
        async with self._locks.hold(block_hash):
            existed = await asyncio.to_thread(_unlink, self.path_of(block_hash))
            return self._index.discard(block_hash) or existed

    async def scan(self) -> ScanResult:
        """Rebuilds the index from the files under ``root`` (headers only), removing temporary
        leftovers and every block file that is unreadable, misnamed or of the wrong size."""
        found = await asyncio.to_thread(_scan_root, self.root, self.seal)
        self._index.clear()
        for header, size in found.blocks:
            self._index.add(header, size)
        return ScanResult(
            valid=tuple(h.block_hash for h, _ in found.blocks),
            valid_bytes=self._index.used_bytes,
            removed=tuple(found.removed),
            ignored=tuple(found.ignored),
        )


def _write_atomic(path: Path, parts: list[bytes | bytearray | memoryview], fsync: bool) -> None:
    path.parent.mkdir(mode=DIR_MODE, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(4)}{_TMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with open(fd, "wb") as f:
            for part in parts:
                f.write(part)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    if fsync:
        _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass(slots=True)
class _Found:
    blocks: list[tuple[BlockHeader, int]] = field(default_factory=list)
    removed: list[Removed] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(c in "0123456789abcdef" for c in text)


def _scan_root(root: Path, seal: BlockSeal) -> _Found:
    found = _Found()
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and _is_hex(entry.name, 2):
            # Folders and files left by older releases with looser modes are tightened.
            os.chmod(entry.path, DIR_MODE)
            for file in sorted(os.scandir(entry.path), key=lambda e: e.name):
                _scan_file(root, entry.name, file, found, seal)
        else:
            found.ignored.append(entry.name)
    return found


def _scan_file(
    root: Path, fan: str, entry: os.DirEntry[str], found: _Found, seal: BlockSeal
) -> None:
    rel = f"{fan}/{entry.name}"
    if not entry.is_file(follow_symlinks=False):
        found.ignored.append(rel)
    elif entry.name.startswith(".") and entry.name.endswith(_TMP_SUFFIX):
        _remove(root, rel, "temporary file of an unfinished put", found)
    elif not entry.name.endswith(_BLK_SUFFIX):
        found.ignored.append(rel)
    else:
        stem = entry.name.removesuffix(_BLK_SUFFIX)
        if not (_is_hex(stem, 2 * HASH_BYTES) and stem.startswith(fan)):
            _remove(root, rel, "not a block file name", found)
            return
        try:
            header, size = block_io.read_header(Path(entry.path), bytes.fromhex(stem), seal)
        except (BlockFormatError, OSError) as exc:
            _remove(root, rel, str(exc), found)
            return
        expected = block_file.packed_size(header)
        if size != expected:
            _remove(root, rel, f"file is {size} bytes, its header says {expected}", found)
        else:
            os.chmod(entry.path, FILE_MODE)
            found.blocks.append((header, size))


def _remove(root: Path, rel: str, reason: str, found: _Found) -> None:
    with contextlib.suppress(FileNotFoundError):
        (root / rel).unlink()
    found.removed.append(Removed(rel, reason))
