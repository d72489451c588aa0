"""kvindex settings, read once at start from ``CRESCENT_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from shared import subjects
from shared.catalogue_token import require_token
from shared.nats_auth import NatsAuthSettings
from shared.secrets import CacheMetaTokenSettings, CacheSecret, cache_secret_field


class KvIndexSettings(NatsAuthSettings, CacheMetaTokenSettings):
    """Every option of kvindex. Invariant: outside development mode the catalogue's token is
    configured, so no query is answered to a caller that does not present it."""

    dev_mode: bool = Field(
        default=False, description="development: answer queries without a token when none is set"
    )
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    node_id: str = Field(default="kvindex", description="this index's id on the bus")
    kvindex_host: str = Field(default="127.0.0.1", description="interface of the prefix queries")
    kvindex_port: int = Field(
        default=8091, ge=0, le=65535, description="HTTP port of the prefix queries; 0: any"
    )
    kvindex_port_fallback: bool = Field(
        default=False,
        description="when the query port is taken, listen on any free one instead (crescent "
        "up's default); the port used is logged and written to kvindex_port_file",
    )
    kvindex_port_file: Path | None = Field(
        default=None, description="once listening, write the query port to this file"
    )
    kvindex_max_blocks_per_view: int = Field(
        default=1 << 20,
        ge=1,
        description="most blocks kept of one publisher's tier; past it the oldest are dropped "
        "and that publisher's answers say complete: false",
    )
    kvindex_max_publishers: int = Field(
        default=1024,
        ge=1,
        description="most publishers indexed at once; others' events are refused",
    )
    kvindex_resync_s: float = Field(
        default=5.0,
        gt=0,
        description="how long a publisher whose KV events were lost may stay out of step "
        "before it is asked again to resend them all",
    )
    cache_secret: CacheSecret = cache_secret_field(
        "key of the per-tenant cache salts, for queries by token ids; the same as the nodes'"
    )
    heartbeat_interval_s: float = Field(
        default=1.0, gt=0, description="kvindex's beat, by which status pages list it"
    )
    metrics_port: int | None = Field(default=None, description="serve /healthz and /metrics here")
    metrics_host: str = Field(default="127.0.0.1", description="interface of the metrics port")

    @model_validator(mode="after")
    def _require_token(self) -> Self:
        require_token(self, self.dev_mode, "kvindex", "answer anyone")
        subjects.check_token(self.node_id, "kvindex's node id")  # its heartbeat's subject
        return self


class RelaySettings(NatsAuthSettings):
    """What a relay of another engine's KV events reads: where that engine publishes them
    (vLLM's ZMQ PUB socket and topic), the publisher id its frames carry here, and NATS."""

    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server(s)")
    relay_zmq_endpoint: str = Field(
        default="tcp://127.0.0.1:5557", description="the engine's KV events (ZMQ PUB) to relay"
    )
    relay_zmq_topic: str = Field(default="", description="the ZMQ topic to relay; empty: all")
    relay_publisher: str = Field(
        default="", description="the publisher id the relayed frames carry (one per engine)"
    )

    @model_validator(mode="after")
    def _named(self) -> Self:
        if not self.relay_publisher:
            raise ValueError("name the relayed engine: set relay_publisher")
        return self
