"""Blocks read up from NVMe or S3 and held in memory until the node that asked pulls them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shared.kv.block_file import BlockHeader


@dataclass(slots=True)
class Staged:
    """One pin's blocks, pullable as ids ``0 .. n-1`` under ``token`` until ``expires_at``."""

    token: str
    headers: list[BlockHeader]
    buffers: list[np.ndarray]
    expires_at: float

    @property
    def num_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


class Staging:
    """Owns the read-up blocks waiting for their pulls, within ``capacity_bytes``.

    Invariants: ``used_bytes`` is the sum over the staged pins and never exceeds
    ``capacity_bytes``; a pin is served only with its token and only until it is released or
    expires (``clock`` past ``expires_at``).
    """

    def __init__(
        self, capacity_bytes: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.clock = clock
        self._staged: dict[str, Staged] = {}
        self.used_bytes = 0

    def room(self) -> int:
        return max(self.capacity_bytes - self.used_bytes, 0)

    def stage(self, blocks: Sequence[tuple[BlockHeader, bytearray]]) -> Staged:
        """Holds the leading blocks that fit in ``room()`` (a chain's prefix is usable on its
        own) under a new token; what does not fit is left out, so callers name the blocks by
        the returned ``headers``. A pin of no blocks is not kept."""
        room = self.room()
        headers: list[BlockHeader] = []
        buffers: list[np.ndarray] = []
        for header, payload in blocks:
            buffer = np.frombuffer(payload, dtype=np.uint8)
            room -= buffer.nbytes
            if room < 0:
                break
            headers.append(header)
            buffers.append(buffer)
        staged = Staged(secrets.token_urlsafe(24), headers, buffers, self.clock() + self.ttl_s)
        if staged.headers:
            self._staged[staged.token] = staged
            self.used_bytes += staged.num_bytes
        return staged

    def provide(self, token: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        """Transfer-server callback: the staged buffers a pull names, or None."""
        staged = self._staged.get(token)
        if staged is None or staged.expires_at < self.clock():
            return None
        if any(not 0 <= i < len(staged.buffers) for i in block_ids):
            return None
        return [staged.buffers[i] for i in block_ids]

    def release(self, token: str) -> bool:
        staged = self._staged.pop(token, None)
        if staged is None:
            return False
        self.used_bytes -= staged.num_bytes
        return True

    def expire(self) -> int:
        now = self.clock()
        gone = [t for t, s in self._staged.items() if s.expires_at < now]
        for token in gone:
            self.release(token)
        return len(gone)

    def __len__(self) -> int:
        return len(self._staged)
