"""Each tenant's share of the gateway: sequences in flight (a request with n choices holds n)
and KV tokens reserved (each sequence's prompt plus its max_tokens). Pure: the core that
starts runs asks before submitting and gives back when the run ends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.gateway import errors

#: What a 429 suggests waiting: in-flight requests end on their own, typically within seconds.
RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class TenantCaps:
    """The caps: defaults for every tenant, and overrides by tenant name (0 tokens: no cap)."""

    sequences: int = 512
    kv_tokens: int = 0
    sequences_of: Mapping[str, int] = field(default_factory=dict)
    kv_tokens_of: Mapping[str, int] = field(default_factory=dict)

    def of(self, tenant: str) -> tuple[int, int]:
        """(sequences, KV tokens) ``tenant`` may hold at once."""
        return (
            self.sequences_of.get(tenant, self.sequences),
            self.kv_tokens_of.get(tenant, self.kv_tokens),
        )


@dataclass(slots=True)
class _Held:
    sequences: int = 0
    kv_tokens: int = 0


class TenantLimits:
    """What each tenant holds now, against its caps.

    Invariant: a tenant's held amounts are the sums over its admitted, not yet released
    requests, and never exceed its caps; a tenant holding nothing has no entry.
    """

    def __init__(self, caps: TenantCaps) -> None:
        self.caps = caps
        self._held: dict[str, _Held] = {}
        self._requests: dict[str, tuple[str, int, int]] = {}

    def held(self, tenant: str) -> tuple[int, int]:
        now = self._held.get(tenant, _Held())
        return now.sequences, now.kv_tokens

    def admit(self, request_id: str, tenant: str, sequences: int, kv_tokens: int) -> None:
        """Reserves the request's share, or raises: 400 when it alone exceeds what the tenant
        may ever hold, 429 with Retry-After when the tenant's in-flight requests leave too
        little room now."""
        max_sequences, max_tokens = self.caps.of(tenant)
        if sequences > max_sequences:
            raise errors.invalid(
                f"This request asks for {sequences} sequences; your limit is {max_sequences} "
                "in flight. Ask for fewer choices (n) or prompts.",
                "n",
            )
        if max_tokens and kv_tokens > max_tokens:
            raise errors.invalid(
                f"This request would reserve {kv_tokens} KV tokens (prompt plus max_tokens, "
                f"for each sequence); your limit is {max_tokens}. Lower max_tokens or n.",
                "max_tokens",
            )
        held = self._held.setdefault(tenant, _Held())
        if held.sequences + sequences > max_sequences:
            self._forget_if_empty(tenant)
            raise errors.rate_limited(
                f"Rate limit reached: your requests hold {held.sequences} of {max_sequences} "
                "sequences in flight. Retry when some have finished.",
                RETRY_AFTER_S,
            )
        if max_tokens and held.kv_tokens + kv_tokens > max_tokens:
            self._forget_if_empty(tenant)
            raise errors.rate_limited(
                f"Rate limit reached: your requests in flight reserve {held.kv_tokens} of "
                f"{max_tokens} KV tokens. Retry when some have finished.",
                RETRY_AFTER_S,
            )
        held.sequences += sequences
        held.kv_tokens += kv_tokens
        self._requests[request_id] = (tenant, sequences, kv_tokens)

    def release(self, request_id: str) -> None:
        """Gives the request's share back; a request not admitted (or released) is ignored."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        tenant, sequences, kv_tokens = entry
        held = self._held[tenant]
        held.sequences -= sequences
        held.kv_tokens -= kv_tokens
        self._forget_if_empty(tenant)

    def _forget_if_empty(self, tenant: str) -> None:
        held = self._held.get(tenant)
        if held is not None and held.sequences == 0 and held.kv_tokens == 0:
            del self._held[tenant]
