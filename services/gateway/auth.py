"""API keys -> tenants. Pure: the adapter hands in the ``Authorization`` header."""

from __future__ import annotations

import hmac

from services.gateway import errors

DEFAULT_TENANT = "default"


class ApiKeys:
    """The configured keys and the tenant each one belongs to.

    Invariant: with no keys every request is the tenant ``default`` (open development mode);
    with keys, only a listed ``Bearer`` key gets through.
    """

    def __init__(self, tenants_by_key: dict[str, str]) -> None:
        self._keys = [(key.encode(), tenant) for key, tenant in tenants_by_key.items()]

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
        given = token.strip().encode()
        tenant = None
        # Compare against every key, in constant time each, so timing reveals nothing.
        for key, owner in self._keys:
            if hmac.compare_digest(given, key):
                tenant = owner
        if tenant is None:
            raise errors.unauthorized("Incorrect API key provided.")
        return tenant
