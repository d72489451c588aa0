"""Scheduler settings, read once at start from ``CRESCENT_*`` variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CRESCENT_", extra="ignore")

    nats_url: str = "nats://127.0.0.1:4222"
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = "127.0.0.1"
    heartbeat_timeout_s: float = Field(
        default=3.0, gt=0, description="silence before a node is dead"
    )
