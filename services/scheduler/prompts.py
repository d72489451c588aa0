"""A prompt's chain of block hashes, computed exactly as the live prefill nodes will compute
theirs (their model, block size and KV dtype, the cache secret, the tenant and its salt).
Pure: no I/O."""

from __future__ import annotations

from services.scheduler.cluster import ClusterView
from services.scheduler.lookup import (
    hash_scope,
    prompt_block_hashes,
    prompt_full_block_hashes,
)
from shared.kv.hashing import BlockHash
from shared.messages import GenerateRequest


class PromptHasher:
    """Owns the cache secret the scheduler hashes prompts under, and whether its placement
    rule looks prompts up at all (the round-robin baseline does not); reads the view for the
    scope. Invariant: a prompt is hashed only under the scope of the prefill nodes alive at
    ``now``, so its hashes are the ones those nodes list in the catalogue."""

    def __init__(self, view: ClusterView, secret: str, lookups: bool = True) -> None:
        self.view = view
        self.secret = secret
        self.lookups = lookups

    def blocks(self, request: GenerateRequest, now: float) -> list[BlockHash] | None:
        """The hashes of the prompt's cacheable blocks, looked up in the catalogue: none
        without ``lookups``, None when no prefill node is alive to give a scope."""
        if not self.lookups:
            return []
        scope = hash_scope(self.view.live("prefill", now))
        if scope is None:
            return None
        return prompt_block_hashes(
            request.prompt_token_ids, scope, self.secret, request.tenant, request.cache_salt
        )

    def full_blocks(self, request: GenerateRequest, now: float) -> list[BlockHash]:
        """The hashes of every full block of the prompt (what a keep keeps); none without a
        prefill node (the placement is refused anyway)."""
        scope = hash_scope(self.view.live("prefill", now))
        if scope is None:
            return []
        return prompt_full_block_hashes(
            request.prompt_token_ids, scope, self.secret, request.tenant, request.cache_salt
        )
