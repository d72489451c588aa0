"""What the NVMe and S3 stores share: the in-memory index of the blocks a store holds, the
result of scanning a store at start, per-block locks, and the errors of a full store.

Invariant of ``BlockIndex``: ``used_bytes`` is the sum of the stored sizes of the blocks in it,
and it holds a block exactly when the store last wrote, listed or read it successfully.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from shared.errors import CrescentError
from shared.kv.block_file import BlockHeader


class StoreFull(CrescentError):
    """A put would take a store past its capacity; the caller evicts first or goes elsewhere."""


@dataclass(frozen=True, slots=True)
class Removed:
    """One file or object a scan deleted: its path (relative to the root) or key, and why."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a store found at start: the blocks it now holds, and what it deleted as unusable.
    ``ignored`` names what it left alone because it is not a block of this store's making."""

    valid: tuple[bytes, ...] = ()
    valid_bytes: int = 0
    removed: tuple[Removed, ...] = ()
    ignored: tuple[str, ...] = ()


@dataclass(slots=True)
class BlockIndex:
    """The headers and stored sizes of the blocks one store holds (see the module invariant)."""

    _headers: dict[bytes, BlockHeader] = field(default_factory=dict)
    _sizes: dict[bytes, int] = field(default_factory=dict)
    used_bytes: int = 0

    def __len__(self) -> int:
        return len(self._headers)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._headers

    def headers(self) -> dict[bytes, BlockHeader]:
        """A copy, so the caller may iterate while the store changes."""
        return dict(self._headers)

    def size_of(self, block_hash: bytes) -> int:
        return self._sizes.get(block_hash, 0)

    def add(self, header: BlockHeader, stored_bytes: int) -> None:
        self.discard(header.block_hash)
        self._headers[header.block_hash] = header
        self._sizes[header.block_hash] = stored_bytes
        self.used_bytes += stored_bytes

    def discard(self, block_hash: bytes) -> bool:
        if self._headers.pop(block_hash, None) is None:
            return False
        self.used_bytes -= self._sizes.pop(block_hash)
        return True

    def clear(self) -> None:
        self._headers.clear()
        self._sizes.clear()
        self.used_bytes = 0


class KeyedLocks:
    """One asyncio lock per block hash, alive only while someone holds or awaits it; keeps a
    put, a get and a delete of the same block from interleaving their I/O."""

    def __init__(self) -> None:
        self._locks: dict[bytes, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: bytes) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
