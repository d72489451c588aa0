"""What prefill and decode nodes share: settings, heartbeats, and the wire form of outputs."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import Field

from shared import subjects
from shared.bus import Bus
from shared.config import EngineSettings
from shared.engine.types import EngineLoad, RequestOutput
from shared.kv.hashing import scope_salt
from shared.messages import GenerateRequest, NodeStatus, TokenChunk, TokenLogprob
from shared.model.sampler import TokenLogprobs

log = logging.getLogger(__name__)


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


@dataclass(slots=True)
class FetchBandwidth:
    """Owns the measured bandwidth of this node's pulls, per source node: an exponentially
    weighted mean of bytes/s over pulls, so one slow pull moves it but does not define it."""

    weight: float = 0.3
    by_source: dict[str, float] = field(default_factory=dict)

    def record(self, source: str, num_bytes: int, seconds: float) -> None:
        if num_bytes <= 0 or seconds <= 0:
            return
        rate = num_bytes / seconds
        old = self.by_source.get(source)
        self.by_source[source] = rate if old is None else old + self.weight * (rate - old)


def to_wire_logprobs(entries: list[TokenLogprobs]) -> list[TokenLogprob] | None:
    if not entries:
        return None
    return [TokenLogprob(e.token_id, e.logprob, list(e.top)) for e in entries]


def output_chunk(out: RequestOutput, num_cached_tokens: int | None = None) -> TokenChunk:
    """The chunk a gateway receives for one step's output of one request."""
    return TokenChunk(
        request_id=out.request_id,
        index=len(out.output_token_ids) - len(out.new_token_ids),
        token_ids=list(out.new_token_ids),
        logprobs=to_wire_logprobs(out.new_logprobs),
        finish_reason=out.finish_reason.value if out.finish_reason is not None else None,
        num_prompt_tokens=out.num_prompt_tokens,
        num_cached_tokens=out.num_cached_tokens if num_cached_tokens is None else num_cached_tokens,
    )


def request_salt(secret: str, request: GenerateRequest) -> bytes:
    """The cache scope of a request: its tenant's, narrowed by its own ``cache_salt``."""
    return scope_salt(secret.encode(), request.tenant, request.cache_salt)


def error_chunk(request_id: str, message: str, code: int) -> TokenChunk:
    """Tells the gateway a request failed; ``code`` is the HTTP status its client should see."""
    return TokenChunk(request_id=request_id, index=0, token_ids=[], error=message, error_code=code)


async def heartbeat_loop(
    bus: Bus,
    interval_s: float,
    status: Callable[[], Awaitable[NodeStatus]],
) -> None:
    """Publishes the node's status every interval until cancelled; a failed beat is logged
    and the next one tried, so a bus hiccup never silences a node for good."""
    while True:
        try:
            beat = await status()
            beat.ts = time.time()
            await bus.publish(subjects.HEARTBEATS, beat)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("heartbeat failed")
        await asyncio.sleep(interval_s)


def node_status(node_id: str, role: str, load: EngineLoad, block_size: int) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        role=role,
        queued_tokens=load.queued_tokens,
        running_seqs=load.running_seqs + load.waiting_seqs,
        free_blocks=load.free_blocks,
        total_blocks=load.total_blocks,
        block_size=block_size,
    )
