"""Settings of a model-running node (prefill or decode), read once by its ``main``."""

from __future__ import annotations

import uuid

from pydantic import Field

from shared import subjects
from shared.config import EngineSettings
from shared.nats_auth import NatsAuthSettings, own_id
from shared.secrets import CacheMetaTokenSettings, CacheSecret, cache_secret_field


class NodeSettings(EngineSettings, NatsAuthSettings, CacheMetaTokenSettings):
    """A model-running node: the engine's settings plus its place in the cluster."""

    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    node_id: str = Field(default="", description="unique name; default: role + random suffix")
    host_id: str = Field(
        default="", description="the machine's name, shared with its tierd; default: hostname"
    )
    nvme_dir: str = Field(
        default="", description="the host tierd's NVMe directory, read directly when faster"
    )
    tierd_id: str = Field(default="", description="the host's tierd; default: tierd-<host id>")
    engine_thread_load: bool = Field(
        default=True,
        description="load the model on the thread that steps it (one OpenMP team per "
        "process; false: a second team, and libgomp sleeps between parallel regions)",
    )
    transfer: str = Field(default="ucx", description="KV transfer: ucx or tcp")
    transfer_host: str = Field(default="127.0.0.1", description="interface the TCP server binds")
    heartbeat_interval_s: float = Field(
        default=1.0, gt=0, description="heartbeat period (load, free blocks, KV bytes moved)"
    )
    lease_ttl_s: float = Field(default=30.0, gt=0, description="held KV waits this long for a pull")
    cache_secret: CacheSecret = cache_secret_field(
        "key of the per-tenant cache salts; the same on every node of a deployment"
    )
    cachemeta_url: str = Field(
        default="", description="host:port of cachemeta; empty: blocks are not catalogued"
    )
    catalogue_sync_s: float = Field(
        default=0.2, gt=0, description="how often new and evicted blocks are sent to cachemeta"
    )
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")
    startup_probe_tokens: int | None = Field(
        default=None,
        ge=0,
        description="a prompt this long timed at start, so placement knows the node's speed; "
        "unset: 64 for a model of 0.4 B or more weights per token, 0 (none) below",
    )
    step_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="a step running longer (and over 3x a full step's measured time) is stuck",
    )
    handoff_timeout_s: float = Field(
        default=3.0, gt=0, description="wait this long for a node to acknowledge a hand-off"
    )
    max_waiting: int = Field(
        default=256, ge=1, description="requests a node queues at most; more are refused"
    )
    pull_timeout_s: float = Field(default=10.0, gt=0, description="bound on one KV pull")
    gateway_check_s: float = Field(
        default=2.0, gt=0, description="how often a node asks gateways if requests are wanted"
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM, time to finish or hand over held requests"
    )

    def resolved_node_id(self, role: str) -> str:
        given = own_id(self.node_id, self.nats_user)
        return subjects.check_token(given or f"{role}-{uuid.uuid4().hex[:8]}", "node id")
