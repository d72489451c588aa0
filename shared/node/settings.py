"""Settings of a model-running node (prefill or decode), read once by its ``main``."""

from __future__ import annotations

import uuid

from pydantic import Field

from shared import subjects
from shared.config import EngineSettings


class NodeSettings(EngineSettings):
    """A model-running node: the engine's settings plus its place in the cluster."""

    nats_url: str = "nats://127.0.0.1:4222"
    node_id: str = Field(default="", description="unique name; default: role + random suffix")
    transfer: str = Field(default="ucx", description="KV transfer: ucx or tcp")
    transfer_host: str = Field(default="127.0.0.1", description="interface the TCP server binds")
    heartbeat_interval_s: float = Field(default=1.0, gt=0)
    lease_ttl_s: float = Field(default=30.0, gt=0, description="held KV waits this long for a pull")
    cache_secret: str = Field(
        default="crescent-dev-cache-secret",
        description="key of the per-tenant cache salts; the same on every node of a deployment",
    )
    cachemeta_url: str = Field(
        default="", description="host:port of cachemeta; empty: blocks are not catalogued"
    )
    catalogue_sync_s: float = Field(
        default=0.2, gt=0, description="how often new and evicted blocks are sent to cachemeta"
    )
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")

    def resolved_node_id(self, role: str) -> str:
        return subjects.check_token(self.node_id or f"{role}-{uuid.uuid4().hex[:8]}", "node id")
