"""cachemeta settings, read once at start from ``CRESCENT_*`` variables."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from shared.catalogue_token import require_token
from shared.model.files import default_cache_dir
from shared.secrets import CacheMetaTokenSettings, check_db_url
from shared.service_settings import ServiceSettings


def default_db_url() -> str:
    """SQLite in the cache folder: the embedded default of a single-machine stack."""
    return f"sqlite+aiosqlite:///{default_cache_dir() / 'cachemeta.db'}"


class CacheMetaSettings(CacheMetaTokenSettings):
    """Every option of cachemeta. Invariant: outside development mode a token is configured,
    so no call is served to a client that does not present it."""

    dev_mode: bool = Field(
        default=False, description="development: serve without a token when none is set"
    )

    db_url: str = Field(
        default_factory=default_db_url,
        description="SQLAlchemy async URL: postgresql+asyncpg://… or sqlite+aiosqlite:///…",
    )
    cachemeta_host: str = Field(default="127.0.0.1", description="gRPC listen address")
    cachemeta_port: int = Field(default=50051, ge=0, le=65535, description="gRPC port; 0: any")
    replica_grace_s: float = Field(
        default=10.0, gt=0, description="heartbeat silence after which a node's replicas go"
    )
    node_forget_s: float = Field(
        default=3600.0, gt=0, description="heartbeat silence after which a node is forgotten"
    )
    sweep_interval_s: float | None = Field(
        default=None, gt=0, description="how often silent nodes are swept; default grace/4, ≤1 s"
    )
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")

    @model_validator(mode="after")
    def _require_token(self) -> Self:
        require_token(self, self.dev_mode, "cachemeta", "serve anyone")
        check_db_url(self.db_url, dev=self.dev_mode)
        return self

    @property
    def sweep_every_s(self) -> float:
        if self.sweep_interval_s is not None:
            return self.sweep_interval_s
        return min(self.replica_grace_s / 4, 1.0)


class MigrationSettings(ServiceSettings):
    """What the alembic command reads: ``CRESCENT_DB_URL`` alone, without the service's checks
    (migrating needs no token). Invariant: ``db_url`` is empty when the variable is unset."""

    db_url: str = Field(default="", description="the catalogue to migrate; empty: alembic.ini's")
