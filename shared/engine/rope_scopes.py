"""Cache scopes of models whose rotary embedding depends on a sequence's length."""

from __future__ import annotations

from collections.abc import Callable

from shared.engine.sequence import Sequence
from shared.kv.hashing import BlockHash
from shared.model.config import ModelConfig


class RopeScopes:
    """Gives each sequence the root of its cache scope, narrowed by how its tokens are rotated
    where the model's rope depends on the length (``ModelConfig.rope_scope``): the same tokens
    rotated for another length are other KV. Such blocks are found only by this engine's own
    hashes; peers and the catalogue hash without the narrowing and simply miss them.

    Owns nothing but the model's config and the engine's root function (which caches roots).
    """

    def __init__(self, config: ModelConfig, root: Callable[[bytes], BlockHash]) -> None:
        self.config = config
        self._root = root
        self.restarts = config.rope_restart_length is not None

    def assign(self, seq: Sequence, cache_salt: bytes, output_offset: int) -> None:
        """Scopes a new sequence. A model that restarts past its rope window scopes by every
        token it is given; otherwise by the prompt the request came with (a resumed one ends
        with its output)."""
        length = seq.num_prompt_tokens if self.restarts else seq.num_prompt_tokens - output_offset
        seq.cache_salt = cache_salt
        seq.rope_scope = self.config.rope_scope(length)
        seq.root_hash = self._scoped_root(seq)

    def rescope(self, seq: Sequence) -> None:
        """A sequence grown past its model's rope window: rotated anew for its length from
        now on, so it leaves the scope (and the hashes) of what it computed before."""
        seq.rope_scope = self.config.rope_scope(seq.num_tokens)
        seq.root_hash = self._scoped_root(seq)
        seq.block_hashes = []

    def _scoped_root(self, seq: Sequence) -> BlockHash:
        salt = seq.cache_salt
        return self._root(salt + b"\0rope=" + seq.rope_scope.encode() if seq.rope_scope else salt)
