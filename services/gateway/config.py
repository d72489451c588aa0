"""Gateway settings, read once from ``CRESCENT_*`` environment variables by ``main``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.model.files import default_cache_dir


def parse_api_keys(raw: str) -> dict[str, str]:
    """``"key1:tenantA,key2:tenantB"`` -> ``{"key1": "tenantA", ...}``; empty means no keys."""
    keys: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, tenant = item.rpartition(":")
        key, tenant = key.strip(), tenant.strip()
        if not sep or not key or not tenant:
            raise ValueError(f"each API key must be written key:tenant, got {item!r}")
        if key in keys:
            raise ValueError("an API key is listed twice")
        keys[key] = tenant
    return keys


class GatewaySettings(BaseSettings):
    """Every option of the gateway process; each field is the variable ``CRESCENT_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="CRESCENT_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port")
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    nats_connect_timeout_s: float = Field(
        default=30.0, gt=0, description="Give up starting when NATS is unreachable this long"
    )
    api_keys: str = Field(
        default="", description="key:tenant pairs, comma separated; empty: open, tenant 'default'"
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
        default=60.0, gt=0, description="503 when no backend answers a request within this"
    )
    request_timeout_s: float = Field(
        default=600.0, gt=0, description="A request still running after this is aborted"
    )
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="Largest request body accepted (else 413)"
    )
    max_n: int = Field(default=16, ge=1, description="Most choices (n) one request may ask for")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish"
    )

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: str) -> str:
        parse_api_keys(value)
        return value

    @property
    def tenants_by_key(self) -> dict[str, str]:
        return parse_api_keys(self.api_keys)
