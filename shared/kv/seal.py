"""Keys that protect KV blocks at rest (NVMe files, S3 objects), derived from the cache secret.

Two kinds of key come from ``CRESCENT_CACHE_SECRET``, each with its own HKDF label so neither
can stand in for the other: one HMAC-SHA256 key that authenticates every stored header and
every unencrypted payload, and one AES-256-GCM key per tenant scope (the block's quota key,
itself a keyed hash of the tenant) that encrypts token ids and payloads. HMAC-SHA256 and
AES-GCM were chosen by measurement (`bench/at_rest_cost.py`): with SHA and AES instructions
both run about twice as fast as keyed BLAKE2b on a 1.5 MB block.

Every tag and every associated data names the tier, so a copy moved from one tier to another
by anyone but tierd (which re-seals on every move) is refused, and the block hash, so one
block's bytes cannot be passed off as another's.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from shared.errors import CrescentError
from shared.kv.checksum import BlockChecksum

TAG_BYTES = 16
NONCE_BYTES = 12
#: What sealing adds to a payload: a nonce and GCM tag when encrypted, an HMAC tag otherwise.
SEALED_OVERHEAD = NONCE_BYTES + TAG_BYTES
MAC_OVERHEAD = TAG_BYTES
_MAC_LABEL = b"crescent/kv-at-rest/mac/v1"
_AEAD_LABEL = b"crescent/kv-at-rest/aead/v1/"
# Tenant scopes seen by one process are few; the bound only stops a flood of made-up ones.
_MAX_CACHED_KEYS = 4096


class SealError(CrescentError):
    """A tag did not verify: the bytes were altered, belong elsewhere or were sealed with
    another secret."""


def _derive(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


class BlockSeal:
    """Owns the at-rest keys of one tier (``tier``) and whether new writes there are encrypted.

    Invariant: the keys are a pure function of the secret (and the tenant scope), so every
    process holding the same cache secret reads what any other wrote; a reader accepts both
    encrypted and MAC-only blocks, whatever ``encrypt`` says, since either is keyed.
    """

    def __init__(self, secret: str | bytes, tier: str, *, encrypt: bool = True) -> None:
        raw = secret.encode() if isinstance(secret, str) else bytes(secret)
        self.tier = tier
        self.encrypt = encrypt
        self._tier_bytes = tier.encode() + b"\0"
        self._secret = raw
        self._mac_key = _derive(raw, _MAC_LABEL)
        self.checksum = BlockChecksum(raw)
        self._aeads: dict[bytes, AESGCM] = {}

    def tag(self, *parts: bytes | memoryview) -> bytes:
        """The truncated HMAC-SHA256 of this tier's name and ``parts``."""
        mac = hmac.new(self._mac_key, self._tier_bytes, hashlib.sha256)
        for part in parts:
            mac.update(part)
        return mac.digest()[:TAG_BYTES]

    def check_tag(self, tag: bytes | memoryview, *parts: bytes | memoryview) -> None:
        if not hmac.compare_digest(bytes(tag), self.tag(*parts)):
            raise SealError(f"{self.tier} tag mismatch")

    def _aead(self, quota_key: bytes) -> AESGCM:
        aead = self._aeads.get(quota_key)
        if aead is None:
            if len(self._aeads) >= _MAX_CACHED_KEYS:
                self._aeads.clear()
            aead = AESGCM(_derive(self._secret, _AEAD_LABEL + quota_key))
            self._aeads[quota_key] = aead
        return aead

    def _ad(self, block_hash: bytes, context: bytes) -> bytes:
        return self._tier_bytes + block_hash + context

    def encrypt_into(
        self,
        quota_key: bytes,
        block_hash: bytes,
        context: bytes,
        data: bytes | bytearray | memoryview,
        out: memoryview,
    ) -> None:
        """Writes ``nonce ‖ ciphertext ‖ tag`` of ``data`` under the tenant's key into ``out``
        (``SEALED_OVERHEAD`` bytes longer than ``data``): one buffer, no copies of a block. A
        fresh random 96-bit nonce each call (a key seals far fewer than the 2**32 messages
        that bounds)."""
        nonce = os.urandom(NONCE_BYTES)
        out[:NONCE_BYTES] = nonce
        self._aead(quota_key).encrypt_into(
            nonce, data, self._ad(block_hash, context), out[NONCE_BYTES:]
        )

    def encrypted(
        self, quota_key: bytes, block_hash: bytes, context: bytes, data: bytes | memoryview
    ) -> bytearray:
        out = bytearray(len(data) + SEALED_OVERHEAD)
        self.encrypt_into(quota_key, block_hash, context, data, memoryview(out))
        return out

    def decrypt_into(
        self,
        quota_key: bytes,
        block_hash: bytes,
        context: bytes,
        sealed: bytes | memoryview,
        dest: memoryview,
    ) -> None:
        """Decrypts ``nonce ‖ ciphertext ‖ tag`` into ``dest`` (exactly the plaintext's size);
        SealError if the tag fails, and then ``dest`` holds nothing usable."""
        view = memoryview(sealed)
        try:
            self._aead(quota_key).decrypt_into(
                view[:NONCE_BYTES], view[NONCE_BYTES:], self._ad(block_hash, context), dest
            )
        except InvalidTag:
            raise SealError(f"{self.tier} block fails authentication") from None

    def decrypt(
        self, quota_key: bytes, block_hash: bytes, context: bytes, sealed: bytes | memoryview
    ) -> bytes:
        out = bytearray(len(sealed) - SEALED_OVERHEAD)
        self.decrypt_into(quota_key, block_hash, context, sealed, memoryview(out))
        return bytes(out)
