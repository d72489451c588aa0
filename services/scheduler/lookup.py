"""Which nodes hold a prompt's leading blocks: the prompt's block hashes, and a cachemeta lookup
that degrades to "nobody" instead of failing a request.

No framework here: cachemeta is reached through any object with the client's two methods.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from services.scheduler.cluster import NodeLoad
from services.scheduler.sources import PULLABLE_TIERS
from shared.errors import CrescentError
from shared.kv.hashing import (
    BlockHash,
    hash_full_blocks,
    hash_reusable_blocks,
    root_hash,
    scope_salt,
)
from shared.lifecycle import Tasks
from shared.rpc.types import KeepGrant, PrefixHolder

log = logging.getLogger(__name__)

#: Extra time the lookup waits beyond the budget it gives the client, so the client's own
#: timeout (a clean CacheMetaUnavailable) normally fires first.
_GRACE_S = 0.05


@dataclass(frozen=True, slots=True)
class HashScope:
    """What the prefill nodes fold into the root of every block hash besides the tenant."""

    model_id: str
    block_size: int
    kv_dtype: str


def hash_scope(prefill_nodes: Iterable[NodeLoad]) -> HashScope | None:
    """The scope of the live prefill nodes (all equal in a sane deployment; the first by id
    wins otherwise); None when none reports its model and KV dtype."""
    for node in sorted(prefill_nodes, key=lambda n: n.node_id):
        if node.model_id and node.kv_dtype:
            return HashScope(node.model_id, node.block_size, node.kv_dtype)
    return None


@functools.lru_cache(maxsize=1024)
def _root(scope: HashScope, secret: str, tenant: str, cache_salt: str) -> BlockHash:
    salt = scope_salt(secret.encode(), tenant, cache_salt)
    return root_hash(scope.model_id, scope.block_size, scope.kv_dtype, salt)


def prompt_block_hashes(
    prompt: Sequence[int], scope: HashScope, secret: str, tenant: str, cache_salt: str = ""
) -> list[BlockHash]:
    """The hashes a prefill node gives the prompt's cacheable blocks: the full blocks before
    the last token (which is always computed, to sample the first output token)."""
    return hash_reusable_blocks(prompt, scope.block_size, _root(scope, secret, tenant, cache_salt))


def prompt_full_block_hashes(
    prompt: Sequence[int], scope: HashScope, secret: str, tenant: str, cache_salt: str = ""
) -> list[BlockHash]:
    """The hashes of every full block of the prompt (what a keep applies to), the last token's
    block included: a next turn that extends the prompt reuses it."""
    return hash_full_blocks(prompt, scope.block_size, _root(scope, secret, tenant, cache_salt))


class PrefixIndex(Protocol):
    """The part of ``shared.rpc.client.CacheMetaClient`` the scheduler uses."""

    async def match_prefix(
        self,
        block_hashes: Sequence[bytes],
        *,
        tiers: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> list[PrefixHolder]: ...

    async def touch_blocks(self, block_hashes: Sequence[bytes]) -> int: ...

    async def keep_blocks(
        self,
        quota_key: bytes,
        block_hashes: Sequence[bytes],
        *,
        ttl_s: float = 0.0,
        pin: bool = False,
        max_blocks: int = 0,
    ) -> KeepGrant: ...

    async def close(self) -> None: ...


class PrefixLookup:
    """Asks cachemeta who holds a prompt's leading blocks; never fails a request over it.

    Owns the outage state: after a failed lookup no call is made for ``retry_s`` (lookups then
    answer ``[]``: cache-oblivious placement), after which one lookup probes again. Fallback
    reasons: ``unconfigured``, ``backoff``, ``timeout``, the name of the client's error class
    (``CacheMetaUnavailable``, ``CacheMetaError``) or ``unexpected``. Invariants:
    an outage is logged once when it starts and once when it ends; every lookup answered
    without cachemeta is reported to ``on_fallback`` with its reason; touches wait at most
    ``touch_interval_s`` in one pending batch of at most ``max_pending_touches`` hashes, and
    they never raise.
    """

    def __init__(
        self,
        index: PrefixIndex | None,
        *,
        timeout_s: float,
        retry_s: float,
        on_fallback: Callable[[str], None] = lambda reason: None,
        max_pending_touches: int = 1 << 16,
        touch_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.on_fallback = on_fallback
        self.max_pending_touches = max_pending_touches
        self.touch_interval_s = touch_interval_s
        self.clock = clock
        self.down = False
        self._retry_at = 0.0
        self._pending: list[BlockHash] = []  # touched since the last batch went out
        self._flush: asyncio.Task[None] | None = None
        # Lookups left behind by their budget still end; touch batches wait to go out.
        self._tasks = Tasks("prefix lookup")

    async def match(
        self, block_hashes: Sequence[BlockHash], budget_s: float | None = None
    ) -> list[PrefixHolder]:
        """The holders of the leading blocks in every tier placement can pull from
        (``PULLABLE_TIERS``: pools, NVMe, S3), longest first; ``[]`` when unknown. With
        ``budget_s``, an answer later than that is not waited for (``[]``, reason
        ``budget``), though a slow cachemeta is not taken for a failed one."""
        if budget_s is None or budget_s >= self.timeout_s:
            return await self._match(block_hashes)
        lookup = self._tasks.spawn(self._match(block_hashes), "prefix match")
        done, _ = await asyncio.wait({lookup}, timeout=budget_s)
        if done:
            return lookup.result()
        self.on_fallback("budget")
        return []

    async def _match(self, block_hashes: Sequence[BlockHash]) -> list[PrefixHolder]:
        if self.index is None:
            self.on_fallback("unconfigured")
            return []
        if not block_hashes:
            return []
        now = self.clock()
        if self.down and now < self._retry_at:
            self.on_fallback("backoff")
            return []
        self._retry_at = now + self.retry_s  # while this probe runs, others back off
        try:
            async with asyncio.timeout(self.timeout_s + _GRACE_S):
                holders = await self.index.match_prefix(
                    block_hashes, tiers=PULLABLE_TIERS, timeout_s=self.timeout_s
                )
        except TimeoutError:
            self._failed("timeout", f"no answer within {self.timeout_s * 1000:.0f} ms")
        except CrescentError as exc:  # CacheMetaUnavailable, CacheMetaError
            self._failed(type(exc).__name__, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self._failed("unexpected", repr(exc), exc)
        else:
            if self.down:
                self.down = False
                log.warning("cachemeta answers again; placement is cache-aware again")
            return list(holders)
        return []

    def touch(self, block_hashes: Sequence[BlockHash]) -> None:
        """Marks the blocks used once more, in the background: touches are gathered for
        ``touch_interval_s`` and sent as one call (a call per placement would double the
        traffic to cachemeta). Skipped while cachemeta is down or the batch is full."""
        if self.index is None or self.down or not block_hashes:
            return
        if len(self._pending) + len(block_hashes) > self.max_pending_touches:
            return
        self._pending.extend(block_hashes)
        if self._flush is None:
            self._flush = self._tasks.spawn(self._send_touches(self.index), "send touches")

    async def close(self) -> None:
        """Sends the touches gathered so far, then stops."""
        self._flush = None
        await self._tasks.close()  # the batch's wait, and lookups their budget left behind
        if self._pending and self.index is not None and not self.down:
            await self._send(self.index, self._take_pending())

    async def _send_touches(self, index: PrefixIndex) -> None:
        await asyncio.sleep(self.touch_interval_s)
        self._flush = None  # touches from now on start the next batch
        await self._send(index, self._take_pending())

    def _take_pending(self) -> list[BlockHash]:
        batch, self._pending = self._pending, []
        return batch

    async def _send(self, index: PrefixIndex, block_hashes: list[BlockHash]) -> None:
        try:
            async with asyncio.timeout(self.timeout_s * 10 + _GRACE_S):
                await index.touch_blocks(block_hashes)
        except Exception as exc:
            log.debug("touching %d blocks failed: %r", len(block_hashes), exc)

    def _failed(self, reason: str, detail: str, exc: Exception | None = None) -> None:
        self.on_fallback(reason)
        if not self.down:
            self.down = True
            log.warning(
                "cachemeta lookup failed (%s); placing without regard to caches until it "
                "answers again",
                detail,
                exc_info=exc,
            )
