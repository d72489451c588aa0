"""API keys -> tenants. Pure: the adapter hands in the ``Authorization`` header.

Keys are held only as SHA-256 digests: a key file lists ``sha256:<hex digest> <tenant>`` lines
(``crescent hash-key`` prints one), and keys given in plain text are hashed as they are read.
No error message here ever contains a key, or a line that might be one.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from services.gateway import errors

DEFAULT_TENANT = "default"
DIGEST_PREFIX = "sha256:"
_DIGEST_HEX = 64


def key_digest(key: str) -> bytes:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode()).digest()


def key_line(key: str, tenant: str) -> str:
    """The key file's line for ``key`` of ``tenant``."""
    return f"{DIGEST_PREFIX}{key_digest(key).hex()} {_tenant(tenant, 'the tenant')}"


def _tenant(value: str, where: str) -> str:
    tenant = value.strip()
    if not tenant or any(c.isspace() for c in tenant):
        raise ValueError(f"{where}: a tenant is one word, without spaces")
    return tenant


def _add(keys: dict[bytes, str], digest: bytes, tenant: str, where: str) -> None:
    if digest in keys:
        raise ValueError(f"{where}: this API key is listed twice")
    keys[digest] = tenant


def parse_key_file(text: str, source: str = "the API key file") -> dict[bytes, str]:
    """Digest -> tenant from ``sha256:<hex> <tenant>`` lines; blank lines and ``#`` comments
    are skipped. A bad line is named by its number, never shown."""
    keys: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"line {number} of {source}"
        digest, _, tenant = line.partition(" ")
        hex_digest = digest.removeprefix(DIGEST_PREFIX)
        if not digest.startswith(DIGEST_PREFIX) or len(hex_digest) != _DIGEST_HEX:
            raise ValueError(f"{where} is not 'sha256:<64 hex digits> <tenant>'")
        try:
            raw = bytes.fromhex(hex_digest)
        except ValueError:
            raise ValueError(f"{where}: the digest is not hexadecimal") from None
        _add(keys, raw, _tenant(tenant, where), where)
    return keys


def parse_api_keys(raw: str) -> dict[bytes, str]:
    """``"key1:tenantA,key2:tenantB"`` -> digest -> tenant; empty means no keys."""
    keys: dict[bytes, str] = {}
    for number, item in enumerate(raw.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        where = f"entry {number} of CRESCENT_API_KEYS"
        key, sep, tenant = item.rpartition(":")
        if not sep or not key.strip():
            raise ValueError(f"{where} is not written key:tenant")
        _add(keys, key_digest(key.strip()), _tenant(tenant, where), where)
    return keys


class ApiKeys:
    """The digests of the configured keys and the tenant each one belongs to.

    Invariant: with no keys every request is the tenant ``default`` (open development mode);
    with keys, only a ``Bearer`` key whose digest is listed gets through. Plain-text keys are
    never held.
    """

    def __init__(self, tenants_by_digest: Mapping[bytes, str]) -> None:
        self._keys = list(tenants_by_digest.items())

    @classmethod
    def from_keys(cls, tenants_by_key: Mapping[str, str]) -> ApiKeys:
        return cls({key_digest(key): tenant for key, tenant in tenants_by_key.items()})

    @property
    def open(self) -> bool:
        return not self._keys

    def tenant(self, authorization: str | None) -> str:
        """The tenant of the request, or a 401 ``ApiError``."""
        if self.open:
            return DEFAULT_TENANT
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.unauthorized(
                "You didn't provide an API key. Send it in the Authorization header as "
                "'Bearer YOUR_KEY'."
            )
        given = key_digest(token.strip())
        tenant = None
        # Compare against every digest, in constant time each, so timing reveals nothing.
        for digest, owner in self._keys:
            if hmac.compare_digest(given, digest):
                tenant = owner
        if tenant is None:
            raise errors.unauthorized("Incorrect API key provided.")
        return tenant
