"""The gateway's settings against slow and heavy clients: connection deadlines and cap, the
bound on a grammar's cost, each tenant's share of sequences and KV tokens, and whether it may
serve without API keys. Part of ``GatewaySettings``; each field is ``CRESCENT_<NAME>``."""

from __future__ import annotations

from typing import Self

from pydantic import Field, PrivateAttr, model_validator

from services.gateway.http_server import ConnectionLimits
from services.gateway.tenant_limits import TenantCaps
from shared.service_settings import ServiceSettings
from shared.tenants import parse_tenant_amounts


class GuardSettings(ServiceSettings):
    """What bounds one client's or one tenant's hold on the gateway. Invariant: after
    validation the per-tenant overrides are parsed (``tenant_caps``)."""

    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="A connection must send a request's whole header block within this "
        "(from its first byte, or from connecting), else it is closed",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request's whole body must arrive within this after its headers, else "
        "408 and the connection is closed",
    )
    keep_alive_timeout_s: float = Field(
        default=5.0, gt=0, description="An idle connection between requests is closed after this"
    )
    max_connections: int = Field(
        default=1000, ge=1, description="Open client connections at most; more get 503 and close"
    )
    grammar_check_timeout_s: float = Field(
        default=0.25,
        gt=0,
        description="A structured output whose grammar takes longer than this to compile and "
        "compute its first token mask is refused with 400",
    )
    max_sequences_per_tenant: int = Field(
        default=512,
        ge=1,
        description="Sequences (n counts n times) one tenant may have in flight; more get 429",
    )
    max_kv_tokens_per_tenant: int = Field(
        default=0,
        ge=0,
        description="KV tokens (prompt plus max_tokens of each sequence) one tenant may hold "
        "reserved in flight; more get 429; 0: no cap",
    )
    tenant_max_sequences: str = Field(
        default="", description="per-tenant sequence caps over the default: name=N,name=N"
    )
    tenant_max_kv_tokens: str = Field(
        default="", description="per-tenant KV token caps over the default: name=N,name=N"
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve without API keys (every request is tenant 'default'); without "
        "keys the gateway refuses to start unless this or CRESCENT_DEV_MODE is true",
    )
    dev_mode: bool = Field(
        default=False, description="development: serve without API keys when none are set"
    )

    _tenant_caps: TenantCaps = PrivateAttr(default_factory=TenantCaps)

    @model_validator(mode="after")
    def _parse_tenant_caps(self) -> Self:
        sequences = parse_tenant_amounts(
            self.tenant_max_sequences, "CRESCENT_TENANT_MAX_SEQUENCES", "sequences"
        )
        tokens = parse_tenant_amounts(
            self.tenant_max_kv_tokens, "CRESCENT_TENANT_MAX_KV_TOKENS", "tokens"
        )
        self._tenant_caps = TenantCaps(
            self.max_sequences_per_tenant, self.max_kv_tokens_per_tenant, sequences, tokens
        )
        return self

    @property
    def tenant_caps(self) -> TenantCaps:
        return self._tenant_caps

    @property
    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            self.header_timeout_s,
            self.body_timeout_s,
            self.keep_alive_timeout_s,
            self.max_connections,
        )
