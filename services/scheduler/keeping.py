"""Recording a request's keep (``cache_control.keep``) in the catalogue's keep ledger before
the request is placed, so a keep over its tenant's quota is refused before anything is
computed, and undoing what a request that could not be placed began to keep.

No framework here: the ledger is reached through the scheduler's ``PrefixIndex`` (the client's
``keep_blocks``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.scheduler.lookup import PrefixIndex
from shared.errors import CrescentError
from shared.kv.hashing import quota_key, scope_salt
from shared.messages import QUOTA, GenerateRequest, SubmitReply

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeepQuotas:
    """How many blocks each tenant may keep at once: ``per_tenant`` overrides ``default``."""

    default: int
    per_tenant: dict[str, int] = field(default_factory=dict)

    def blocks_for(self, tenant: str) -> int:
        return self.per_tenant.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class KeepRefusal:
    """Why a keep was not recorded: the HTTP status, the message, and ``kind`` (``QUOTA``
    for a keep over the tenant's quota)."""

    status: int
    message: str
    kind: str = ""


@dataclass(frozen=True, slots=True)
class KeepRecord:
    """A keep recorded for a request: its tenant's quota key and the blocks it began to keep
    (what undoing it drops)."""

    quota_key: bytes = b""
    new: list[bytes] = field(default_factory=list)


class Keeper:
    """Owns nothing but its settings: every keep lives in the catalogue's ledger, so each
    scheduler replica sees the others' keeps and a restart forgets none.

    Invariant: a request that asks to keep blocks is placed only after the ledger recorded the
    keep (or the drop); a refusal changes nothing in the ledger.
    """

    def __init__(self, index: PrefixIndex | None, quotas: KeepQuotas, secret: str) -> None:
        self.index = index
        self.quotas = quotas
        self.secret = secret

    async def record(
        self, request: GenerateRequest, hashes: list[bytes]
    ) -> KeepRecord | KeepRefusal:
        """Records the request's keep of ``hashes`` (its prompt's full blocks)."""
        spec = request.sampling
        if not spec.keep or not hashes:
            return KeepRecord()
        if self.index is None:
            return KeepRefusal(400, "this deployment keeps no prefixes: it has no catalogue")
        key = quota_key(scope_salt(self.secret.encode(), request.tenant))
        quota = self.quotas.blocks_for(request.tenant)
        try:
            grant = await self.index.keep_blocks(
                key,
                hashes,
                ttl_s=spec.keep_ttl_s if spec.keep == "ttl" else 0.0,
                pin=spec.keep == "pin",
                max_blocks=quota,
            )
        except CrescentError as exc:  # CacheMetaUnavailable, CacheMetaError
            log.warning("could not record the keep of %s: %s", request.request_id, exc)
            return KeepRefusal(503, "the cache catalogue cannot record the keep now; try again")
        if not grant.granted:
            return KeepRefusal(
                429,
                f"keeping this prompt's {len(hashes)} blocks would exceed the tenant's quota "
                f"of {quota} kept blocks ({grant.num_kept} kept now): let keeps end, drop "
                'some (cache_control.keep {"ttl_s": 0}), or keep a shorter prompt',
                QUOTA,
            )
        return KeepRecord(key, grant.new_block_hashes)

    async def undo(self, record: KeepRecord) -> None:
        """Drops the keeps a request began and could not use (it was not placed)."""
        if self.index is None or not record.new:
            return
        try:
            await self.index.keep_blocks(record.quota_key, record.new)
        except CrescentError as exc:
            log.warning("could not undo a keep of %d blocks: %s", len(record.new), exc)


async def keep_and_place(
    keeper: Keeper | None,
    request: GenerateRequest,
    full_block_hashes: Callable[[], list[bytes]],
    place: Callable[[], Awaitable[SubmitReply]],
) -> SubmitReply:
    """Records the request's keep first (a keep over quota is refused before any work), then
    ``place``s the request, and undoes the keep if it was not placed. A resumed request keeps
    nothing new: its first attempt recorded the keep, and its prompt now ends with generated
    tokens."""
    if request.resume:
        request.sampling.keep = ""
    if not request.sampling.keep or keeper is None:
        return await place()
    kept = await keeper.record(request, full_block_hashes())
    if isinstance(kept, KeepRefusal):
        log.info("refused %s: %s", request.request_id, kept.message)
        return SubmitReply(
            accepted=False, error=kept.message, error_code=kept.status, error_kind=kept.kind
        )
    reply = await place()
    if not reply.accepted:
        await keeper.undo(kept)
    return reply
