"""Gateway settings, read once from ``CRESCENT_*`` environment variables by ``main``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import NoDecode

from services.gateway.auth import parse_api_keys, parse_key_file
from services.gateway.guard_settings import GuardSettings
from services.gateway.sampling import TenantTerms
from services.gateway.tool_syntax import ParserSetting
from shared.model.files import default_cache_dir
from shared.model.generation_config import usable
from shared.nats_auth import NatsAuthSettings
from shared.sampling_params import MAX_TENANT_WEIGHT
from shared.secrets import refused
from shared.tenants import parse_tenant_amounts


class GatewaySettings(GuardSettings, NatsAuthSettings):
    """Every option of the gateway process; each field is the variable ``CRESCENT_<NAME>``.
    Invariant: API keys are configured, or serving without them was asked for explicitly."""

    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port")
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    nats_connect_timeout_s: float = Field(
        default=30.0, gt=0, description="Give up starting when NATS is unreachable this long"
    )
    # Read as "key:tenant,..." and held as hex digest -> tenant: the keys themselves are gone
    # once the settings are validated.
    api_keys: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="key:tenant pairs, comma separated; without keys the gateway starts only "
        "with CRESCENT_ALLOW_UNAUTHENTICATED or CRESCENT_DEV_MODE (every request: 'default')",
    )
    api_keys_file: Path | None = Field(
        default=None, description="lines 'sha256:<hex digest> <tenant>' (crescent hash-key)"
    )
    served_model_name: str | None = Field(
        default=None, description="Model name clients send; default: the model folder's id"
    )
    model: str | None = Field(
        default=None, description="A .gguf file or a Hugging Face folder; default: SmolLM2-135M"
    )
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Converted models")
    max_model_len: int | None = Field(
        default=None, ge=1, description="Context cap for prompt plus completion; default: model's"
    )
    first_token_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="504 when no first token came within this plus twice the predicted TTFT",
    )
    request_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A request running longer than this plus twice its predicted TTFT is aborted",
    )
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body accepted (else 413)"
    )
    max_n: int = Field(default=16, ge=1, description="Most choices (n) one request may ask for")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish"
    )
    gateway_id: str = Field(
        default="", description="Unique name of this gateway; default: gateway + random suffix"
    )
    max_in_flight: int = Field(
        default=1024, ge=1, description="Sequences in flight at most; more get 429 at once"
    )
    no_scheduler_s: float = Field(
        default=1.0, gt=0, description="With no scheduler running this long, a request gets 503"
    )
    submit_timeout_s: float = Field(
        default=3.0, gt=0, description="A scheduler silent this long is asked again"
    )
    heartbeat_timeout_s: float = Field(
        default=3.0, gt=0, description="A node silent this long is dead; its requests move"
    )
    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="This gateway's beat")
    stall_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="A request with no new token this long (after its first) fails",
    )
    max_resumes: int = Field(
        default=4, ge=0, description="How often one request may move to another node"
    )
    generation_config: Literal["auto", "none"] = Field(
        default="auto",
        description="Sampling defaults of requests: auto, the model's generation_config.json "
        "(temperature, top_p, top_k, repetition_penalty; max_new_tokens as max_tokens), as "
        "vLLM's --generation-config auto; none: Crescent's own. A request's values win",
    )
    override_generation_config: dict[str, float | int] = Field(
        default_factory=dict,
        description="JSON of generation_config.json keys over the model's, e.g. "
        '{"temperature": 0, "max_new_tokens": 256} (vLLM\'s --override-generation-config)',
    )
    tool_call_parser: ParserSetting = Field(
        default="auto",
        description="Tool call syntax in prompts and answers; auto: the chat template's own "
        "(crescent where it has none)",
    )

    tenant_ttft_slo_ms: str = Field(
        default="",
        description="per-tenant time to first token objectives, name=ms,name=ms: a tenant's "
        "requests without their own ttft_slo_ms take it (their prompts are ordered by it on "
        "the nodes, and the scheduler refuses with 429 what it predicts cannot meet it)",
    )

    tenant_tbt_slo_ms: str = Field(
        default="",
        description="per-tenant time between tokens objectives, name=ms,name=ms: a tenant's "
        "requests without their own tbt_slo_ms take it (the scheduler refuses with 429 what "
        "no decode node is predicted to hold)",
    )
    tenant_weights: str = Field(
        default="",
        description="per-tenant weights of the nodes' prompt computation, name=N,name=N "
        f"(1 to {MAX_TENANT_WEIGHT:g}; others 1): while several tenants' prompts wait, each "
        "is served tokens in proportion to its weight",
    )

    _tenants: dict[bytes, str] = PrivateAttr(default_factory=dict)

    @field_validator("api_keys", mode="before")
    @classmethod
    def _hash_api_keys(cls, value: Any) -> dict[str, str]:
        if value == {}:  # the default
            return {}
        if not isinstance(value, str):
            raise refused("CRESCENT_API_KEYS must be a string of key:tenant pairs")
        try:
            return {digest.hex(): tenant for digest, tenant in parse_api_keys(value).items()}
        except ValueError as exc:
            raise refused(str(exc)) from None

    @field_validator("override_generation_config")
    @classmethod
    def _check_override(cls, value: dict[str, float | int]) -> dict[str, float | int]:
        usable(value, "CRESCENT_OVERRIDE_GENERATION_CONFIG", strict=True)
        return value

    @model_validator(mode="after")
    def _load_key_file(self) -> Self:
        tenants = {bytes.fromhex(digest): tenant for digest, tenant in self.api_keys.items()}
        if self.api_keys_file is not None:
            source = "CRESCENT_API_KEYS_FILE"
            try:
                text = self.api_keys_file.expanduser().read_text(encoding="utf-8")
                listed = parse_key_file(text, source)
            except OSError as exc:
                raise refused(f"cannot read {source}: {exc.__class__.__name__}") from None
            except (ValueError, UnicodeDecodeError) as exc:
                raise refused(str(exc)) from None
            if listed.keys() & tenants.keys():
                raise refused("an API key is in both CRESCENT_API_KEYS and CRESCENT_API_KEYS_FILE")
            tenants |= listed
        self._tenants = tenants
        self.tenant_terms  # noqa: B018 - refused at start, not on a request
        if not tenants and not self.runs_open_on_purpose:
            raise refused(
                "no API keys: set CRESCENT_API_KEYS or CRESCENT_API_KEYS_FILE, or "
                "CRESCENT_ALLOW_UNAUTHENTICATED=true to serve anyone as tenant 'default' "
                "(CRESCENT_DEV_MODE=true does too, for development)"
            )
        return self

    @property
    def tenant_ttft_slos_ms(self) -> dict[str, int]:
        """``tenant_ttft_slo_ms`` parsed: tenant -> milliseconds."""
        return parse_tenant_amounts(self.tenant_ttft_slo_ms, "CRESCENT_TENANT_TTFT_SLO_MS", "ms")

    @property
    def tenant_terms(self) -> dict[str, TenantTerms]:
        """What each tenant named in the per-tenant settings gives its requests."""
        ttft = self.tenant_ttft_slos_ms
        tbt = parse_tenant_amounts(self.tenant_tbt_slo_ms, "CRESCENT_TENANT_TBT_SLO_MS", "ms")
        weights = parse_tenant_amounts(self.tenant_weights, "CRESCENT_TENANT_WEIGHTS", "N")
        for name, weight in weights.items():
            if not 1 <= weight <= MAX_TENANT_WEIGHT:
                raise refused(
                    f"CRESCENT_TENANT_WEIGHTS: tenant {name!r} has weight {weight}; "
                    f"weights are 1 to {MAX_TENANT_WEIGHT:g}"
                )
        for variable, objectives in (("TTFT", ttft), ("TBT", tbt)):
            for name, ms in objectives.items():
                if ms <= 0:
                    raise refused(
                        f"CRESCENT_TENANT_{variable}_SLO_MS: tenant {name!r} has {ms} ms; "
                        "an objective must be a positive number of ms"
                    )
        return {
            name: TenantTerms(ttft.get(name), tbt.get(name), float(weights.get(name, 1)))
            for name in ttft.keys() | tbt.keys() | weights.keys()
        }

    @property
    def runs_open_on_purpose(self) -> bool:
        """Serving without keys was asked for (it is refused otherwise)."""
        return self.allow_unauthenticated or self.dev_mode

    @property
    def tenants_by_digest(self) -> dict[bytes, str]:
        """Every configured key's SHA-256 digest -> its tenant (for ``ApiKeys``)."""
        return dict(self._tenants)

    @property
    def tenants_by_key(self) -> dict[bytes, str]:
        """The same as ``tenants_by_digest``: keys are only known by their digests."""
        return self.tenants_by_digest
